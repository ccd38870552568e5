"""The console's HTTP side: security headers on every answer, bounded forms, the session and CSRF checks,
and the templates (Jinja2, autoescaped: every value from the bus is text, never markup)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.meshctl.console.auth import COOKIE, Session, Sessions, csrf_ok

HERE = Path(__file__).parent
MAX_FORM_BYTES = 64 * 1024  # the largest form the console takes (a memory entry is 12,000 bytes at most)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]

templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.ChainableUndefined,  # a field a hostile answer left out renders as nothing
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=lambda value: "" if value is None else value,  # a field with no value shows nothing, not "None"
)


def ago(at: float) -> str:
    """A wall-clock time (seconds since the epoch) as how long ago it was; "" for none."""
    if not isinstance(at, (int, float)) or at <= 0:
        return ""
    return f"{max(0.0, time.time() - at):.0f} s ago"


templates.globals["ago"] = ago


class Guard:
    """Every answer gets the security headers; a request naming a host this console is not is refused
    (a page of another site rebinding its name to 127.0.0.1 reads nothing)."""

    def __init__(self, app: ASGIApp, hosts: set[str]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
        if host not in self.hosts:
            response = Response(
                f"this console answers for {', '.join(sorted(self.hosts))}, not for the host {host[:100]!r}\n",
                status_code=421,
                media_type="text/plain",
            )
            await response(scope, receive, self._headers(send))
            return
        await self.app(scope, receive, self._headers(send))

    @staticmethod
    def _headers(send: Send) -> Send:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        return with_headers


class FormTooLarge(Exception):
    pass


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form, at most MAX_FORM_BYTES (FormTooLarge past it); one value a field."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormTooLarge
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=32)
    return {k: v[0] for k, v in fields.items()}


def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    t0 = time.perf_counter()
    html = templates.get_template(name).render(**context)
    response = HTMLResponse(html, status_code=status)
    response.headers["server-timing"] = f"render;dur={(time.perf_counter() - t0) * 1000:.2f}"
    return response


Page = Callable[[Request, Session], Awaitable[Response]]


class Pages:
    """Wraps each page: no session -> the login; a POST without this session's CSRF token -> 403."""

    def __init__(self, sessions: Sessions, secure_cookie: bool) -> None:
        self.sessions, self.secure_cookie = sessions, secure_cookie

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def page(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = self.session_of(request)
            if session is None:
                return self.to_login(request)
            return await handler(request, session)

        return endpoint

    def action(
        self, handler: Callable[[Request, Session, dict[str, str]], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = self.session_of(request)
            if session is None:
                return render(
                    "refused.html",
                    401,
                    title="Session ended",
                    why="Your session has ended (or the console restarted): nothing was done. Log in again and send it again.",
                    person=None,
                )
            try:
                form = await read_form(request)
            except FormTooLarge:
                return render(
                    "refused.html",
                    413,
                    title="Too large",
                    why=f"A form is at most {MAX_FORM_BYTES} bytes.",
                    person=session.person,
                )
            if not csrf_ok(session, form.get("csrf")):
                return render(
                    "refused.html",
                    403,
                    title="Refused",
                    why="This form's CSRF token is not your session's: nothing was done. Reload the page and send it again.",
                    person=session.person,
                )
            return await handler(request, session, form)

        return endpoint

    def to_login(self, request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.url.path.startswith("/fragment/"):
            return Response("the session has ended; log in again\n", status_code=401, media_type="text/plain")
        return RedirectResponse(f"/login?{urlencode({'next': target})}", status_code=303)

    def set_cookie(self, response: Response, sid: str, max_age: float) -> None:
        response.set_cookie(
            COOKIE, sid, max_age=int(max_age), httponly=True, samesite="lax", secure=self.secure_cookie, path="/"
        )
