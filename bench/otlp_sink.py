"""An OTLP/HTTP trace sink for the benchmark: accepts every export (200, an empty response) and
counts the bytes, so a traced node's exporter does real work and nothing is kept.

Usage: python bench/otlp_sink.py PORT
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sink(BaseHTTPRequestHandler):
    received = 0

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        length = int(self.headers.get("Content-Length", "0"))
        Sink.received += len(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
