"""sandbox-probe: tries each way out of a sandbox and reports what the kernel answered.

Arguments (the tool's, or PROBE_ARGS as JSON for `once` and `serve`): read (paths), write
(paths), connect (ports on 127.0.0.1), unix (socket paths), ptrace (a pid), signal (a pid, sent
signal 0), memory_mb (a block to allocate). Each outcome is "ok" or the errno's name (EACCES,
EPERM, ...); beside them the limits, TMPDIR and capabilities the child found itself with.
"""

import ctypes
import errno
import json
import os
import resource
import socket
import sys
import time

PTRACE_ATTACH, PTRACE_DETACH = 16, 17


def _err(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e))


def try_read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.read(1)
        return "ok"
    except OSError as e:
        return _err(e)


def try_write(path: str) -> str:
    try:
        with open(path, "wb") as f:
            f.write(b"was here\n")
        return "ok"
    except OSError as e:
        return _err(e)


def try_connect(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return "ok"
    except OSError as e:
        return _err(e) if e.errno else type(e).__name__


def try_unix(path: str) -> str:
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
        return "ok"
    except OSError as e:
        return _err(e)


def try_ptrace(pid: int) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
        os.waitpid(pid, 0x40000000)  # __WALL: the tracee stops first, then it can be let go
        libc.ptrace(PTRACE_DETACH, pid, None, None)
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), "?")


def try_signal(pid: int) -> str:
    try:
        os.kill(pid, 0)
        return "ok"
    except OSError as e:
        return _err(e)


def try_memory(mb: int) -> str:
    try:
        block = bytearray(mb * 1024 * 1024)
        del block
        return "ok"
    except MemoryError:
        return "MemoryError"


def _status(field: str) -> str:
    for line in _read_text("/proc/self/status").splitlines():
        if line.startswith(field + ":"):
            return line.split()[1]
    return ""


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return _err(e)


def _pid(value: object) -> int:
    """A pid argument: a number, or "parent" (the node that started this child)."""
    return os.getppid() if value == "parent" else int(value)  # type: ignore[call-overload]


def report(text: str) -> None:
    """`once` and `serve` under a node: the outcomes also into $MESH_DATA_DIR/report-$MESH_BUNDLE.json,
    where the test reads a step's or a service's (writing there is one of the outcomes)."""
    if "MESH_DATA_DIR" in os.environ and "MESH_BUNDLE" in os.environ:
        try:
            with open(os.path.join(os.environ["MESH_DATA_DIR"], f"report-{os.environ['MESH_BUNDLE']}.json"), "w") as f:
                f.write(text + "\n")
        except OSError as e:
            print(f"sandbox-probe: cannot write the report: {e}", file=sys.stderr)


def probe(args: dict) -> dict:
    out: dict = {
        "read": {p: try_read(p) for p in args.get("read", [])},
        "write": {p: try_write(p) for p in args.get("write", [])},
        "connect": {str(p): try_connect(p) for p in args.get("connect", [])},
        "unix": {p: try_unix(p) for p in args.get("unix", [])},
        "limits": {
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "data": resource.getrlimit(resource.RLIMIT_DATA)[0],
            "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
            "core": resource.getrlimit(resource.RLIMIT_CORE)[0],
        },
        "tmpdir": os.environ.get("TMPDIR", ""),
        "capabilities": _status("CapEff"),
        "uid_map": _read_text("/proc/self/uid_map"),
    }
    if "read_own" in args:  # a file of its own bundle, wherever the node runs it from
        out["read_own"] = try_read(os.path.join(os.environ.get("MESH_BUNDLE_DIR", "."), args["read_own"]))
    if "ptrace" in args:
        out["ptrace"] = try_ptrace(_pid(args["ptrace"]))
    if "signal" in args:
        out["signal"] = try_signal(_pid(args["signal"]))
    if "memory_mb" in args:
        out["memory"] = try_memory(int(args["memory_mb"]))
    return out


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode in ("once", "serve"):
        text = json.dumps(probe(json.loads(os.environ.get("PROBE_ARGS", "{}"))))
        print(text, flush=True)
        report(text)
        while mode == "serve":
            time.sleep(3600)
        return
    from mesh_sdk import Server

    server = Server("sandbox-probe", version="0.1.0")

    @server.tool()
    def attempt(arguments: str) -> str:
        """Try what the JSON object `arguments` names; the outcomes as JSON."""
        return json.dumps(probe(json.loads(arguments)))

    server.run()


if __name__ == "__main__":
    main()
