"""The console's pages at fixed paths: `/` (the mesh), `/memory`, `/handoff`, `/attention`, and the login.

Each page asks the bus as the logged-in person (runtime/meshctl/console/reads.py) and renders on
the server; the mesh page's live part is a short poll of `/fragment/mesh` by console.js (no build
step, served from the package), and every page reads without JavaScript. Every action is a form
with the session's CSRF token, answered by a redirect (the page shows what the bus said).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from runtime.meshctl.console.auth import COOKIE, LocalLogin, OidcError, OidcLogin, Session, Sessions, safe_next
from runtime.meshctl.console.reads import Answer, MeshReads, clip
from runtime.meshctl.console.web import HERE, Guard, Pages, render

log = logging.getLogger("mesh.console")

MEMORY_TYPES = ("decision", "convention", "constraint", "open_question", "glossary", "status")
HANDOFF_STATES = ("open", "claimed", "escalated", "resolved", "blocked")
PAGE_SIZE = 50


@dataclass
class ConsoleSettings:
    hosts: set[str]  # the Host headers this console answers for
    secure_cookie: bool
    session_ttl_s: float


class Console:
    def __init__(
        self, reads: MeshReads, settings: ConsoleSettings, local: LocalLogin | None, oidc: OidcLogin | None
    ) -> None:
        self.reads, self.settings, self.local, self.oidc = reads, settings, local, oidc
        self.sessions = Sessions(settings.session_ttl_s)
        self.pages = Pages(self.sessions, settings.secure_cookie)

    def app(self) -> Guard:
        p = self.pages
        routes = [
            Route("/", p.page(self.mesh_page)),
            Route("/fragment/mesh", p.page(self.mesh_fragment)),
            Route("/restart", p.action(self.restart), methods=["POST"]),
            Route("/memory", p.page(self.memory_page)),
            Route("/memory", p.action(self.remember), methods=["POST"]),
            Route("/memory/entry", p.page(self.memory_entry)),
            Route("/handoff", p.page(self.handoff_page)),
            Route("/handoff/entry", p.page(self.handoff_entry)),
            Route("/attention", p.page(self.attention_page)),
            Route("/attention", p.action(self.decide), methods=["POST"]),
            Route("/login", self.login),
            Route("/auth/callback", self.callback),
            Route("/logout", p.action(self.logout), methods=["POST"]),
            Route("/favicon.ico", lambda _: Response(status_code=204)),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        return Guard(Starlette(routes=routes), self.settings.hosts)

    # --- login -----------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        next_path = safe_next(request.query_params.get("next"))
        if self.oidc is not None:
            return RedirectResponse(self.oidc.begin(next_path), status_code=303)
        assert self.local is not None
        person = self.local.check(request.query_params.get("token"))
        if person is None:
            return render("login.html", 401 if "token" in request.query_params else 200, person=None, local=True)
        return self._logged_in(person, next_path)

    async def callback(self, request: Request) -> Response:
        if self.oidc is None:
            return render("refused.html", 404, title="Not here", why="This console logs in locally.", person=None)
        try:
            person, next_path = await self.oidc.finish(dict(request.query_params))
        except OidcError as e:
            log.warning("console: a login failed: %s", e)
            return render("refused.html", 401, title="Login failed", why=str(e), person=None)
        return self._logged_in(person, next_path)

    def _logged_in(self, person: Any, next_path: str) -> Response:
        sid, _ = self.sessions.open(person)
        log.info("console: %s logged in (%s)", person.name, person.id)
        response = RedirectResponse(next_path, status_code=303)
        self.pages.set_cookie(response, sid, self.settings.session_ttl_s)
        return response

    async def logout(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        self.sessions.close(request.cookies.get(COOKIE))
        response = render("refused.html", 200, title="Logged out", why="You are logged out.", person=None)
        response.delete_cookie(COOKIE, path="/")
        return response

    # --- the mesh --------------------------------------------------------------------------
    async def mesh_page(self, request: Request, session: Session) -> Response:
        return render("mesh.html", **self._common(session, "mesh"), mesh=await self.reads.mesh())

    async def mesh_fragment(self, request: Request, session: Session) -> Response:
        return render("_mesh.html", **self._common(session, "mesh"), mesh=await self.reads.mesh())

    async def restart(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        node, bundle = form.get("node", ""), form.get("bundle", "")
        reply = await self.reads.restart(node, bundle, session.person)
        if reply.ok:
            session.flash = (
                f"{clip(reply.bundle, 200)} on {clip(node, 200)} is restarting (it was {clip(reply.was, 50)})"
            )
        else:
            session.flash = f"not restarted: {clip(reply.error, 1000)}"
        return RedirectResponse("/", status_code=303)

    # --- the memory ------------------------------------------------------------------------
    async def _shared_scopes(self, session: Session) -> tuple[list[dict[str, Any]], str]:
        """The global and project scopes (never a private one: asked without, and filtered again)."""
        answer = await self.reads.seat("memory.scopes", {"include_private": False, "limit": 200}, session.person)
        scopes = [s for s in answer.data.get("scopes") or [] if isinstance(s, dict) and s.get("kind") != "private"]
        return [s for s in scopes if isinstance(s.get("slug"), str) and s.get("slug") != "private"], answer.error

    async def memory_page(self, request: Request, session: Session) -> Response:
        scopes, problem = await self._shared_scopes(session)
        slugs = [s["slug"] for s in scopes]
        scope = request.query_params.get("scope") or "global"
        query = request.query_params.get("q", "").strip()
        cursor = request.query_params.get("cursor") or None
        entries: list[dict[str, Any]] = []
        next_cursor = None
        if scope not in slugs:
            problem = (
                problem or f"there is no shared scope {clip(scope, 100)!r} here; the scopes are {', '.join(slugs)}"
            )
        else:
            args: dict[str, Any] = {"scope": scope, "limit": PAGE_SIZE}
            if query:
                args["query"] = query[:500]
            if cursor:
                args["cursor"] = cursor[:128]
            answer = await self.reads.seat("memory.recall", args, session.person)
            problem = problem or answer.error
            entries = [e for e in answer.data.get("entries") or [] if isinstance(e, dict) and e.get("scope") == scope]
            next_cursor = answer.data.get("next_cursor")
        return render(
            "memory.html",
            **self._common(session, "memory"),
            scopes=scopes,
            scope=scope,
            query=query,
            entries=entries,
            next_cursor=next_cursor if isinstance(next_cursor, str) else None,
            problem=problem,
            types=MEMORY_TYPES,
        )

    async def memory_entry(self, request: Request, session: Session) -> Response:
        entry_id = request.query_params.get("id", "")
        answer = Answer({}, "give an entry's id: /memory/entry?id=N")
        if entry_id.isdigit():
            answer = await self.reads.seat("memory.history", {"id": int(entry_id), "limit": 200}, session.person)
        if answer.ok and await self._private(answer.data.get("scope"), session):
            answer = Answer({}, f"no entry {entry_id} in a shared scope")  # as if it did not exist
        return render("memory_entry.html", **self._common(session, "memory"), entry_id=entry_id, answer=answer)

    async def _private(self, scope: object, session: Session) -> bool:
        scopes, _ = await self._shared_scopes(session)
        return scope not in {s["slug"] for s in scopes}

    async def remember(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        scopes, _ = await self._shared_scopes(session)
        scope = form.get("scope", "global")
        if scope not in {s["slug"] for s in scopes}:
            session.flash = f"not remembered: {clip(scope, 100)!r} is not a shared scope; the console writes global and project scopes only"
        else:
            args = {"content": form.get("content", ""), "type": form.get("type", ""), "scope": scope}
            if form.get("key", "").strip():
                args["key"] = form["key"].strip()
            answer = await self.reads.seat("memory.remember", args, session.person)
            session.flash = (
                f"remembered as entry {clip(answer.data.get('id'))} by {clip(answer.data.get('author'), 300)}"
                if answer.ok
                else f"not remembered: {answer.error}"
            )
        return RedirectResponse(
            f"/memory?scope={scope if scope.isascii() and scope.replace('-', '').isalnum() else 'global'}",
            status_code=303,
        )

    # --- the handoff desk ------------------------------------------------------------------
    async def handoff_page(self, request: Request, session: Session) -> Response:
        """Every state's oldest entries and who holds what; `?state=S&cursor=C` pages through one state."""
        only = request.query_params.get("state")
        states = (only,) if only in HANDOFF_STATES else HANDOFF_STATES
        cursor = (request.query_params.get("cursor") or "")[:128] if only in HANDOFF_STATES else ""
        lists: dict[str, Answer] = {}
        holders = Answer({})

        async def one(state: str) -> None:
            args: dict[str, Any] = {"state": state, "limit": PAGE_SIZE}
            if cursor:
                args["cursor"] = cursor
            lists[state] = await self.reads.seat("handoff.list", args, session.person)

        async def who_holds() -> None:
            nonlocal holders
            holders = await self.reads.seat("handoff.holders", {"limit": 100}, session.person)

        async with anyio.create_task_group() as tg:
            for state in states:
                tg.start_soon(one, state)
            tg.start_soon(who_holds)
        return render(
            "handoff.html",
            **self._common(session, "handoff"),
            states=states,
            lists=lists,
            holders=holders,
            paged=only in HANDOFF_STATES,
        )

    async def handoff_entry(self, request: Request, session: Session) -> Response:
        entry_id = request.query_params.get("id", "")[:40]
        answer = await self.reads.seat("handoff.get", {"id": entry_id}, session.person)
        return render("handoff_entry.html", **self._common(session, "handoff"), entry_id=entry_id, answer=answer)

    async def attention_page(self, request: Request, session: Session) -> Response:
        args: dict[str, Any] = {"limit": PAGE_SIZE}
        if cursor := (request.query_params.get("cursor") or "")[:128]:
            args["cursor"] = cursor
        answer = await self.reads.seat("handoff.attention", args, session.person)
        # Escalated entries only, whatever the seat sent: a blocked one never reaches the human here.
        entries = [e for e in answer.data.get("entries") or [] if isinstance(e, dict) and e.get("state") == "escalated"]
        return render("attention.html", **self._common(session, "attention"), answer=answer, entries=entries)

    async def decide(self, request: Request, session: Session, form: dict[str, str]) -> Response:
        entry_id = form.get("id", "")[:40]
        answer = await self.reads.seat(
            "handoff.decide", {"id": entry_id, "antwort": form.get("antwort", "")}, session.person
        )
        session.flash = (
            f"{clip(entry_id, 40)} decided by {clip(answer.data.get('decided_by'), 300)}"
            if answer.ok
            else f"not decided: {answer.error}"
        )
        return RedirectResponse("/attention", status_code=303)

    # --- what every page has ---------------------------------------------------------------
    def _common(self, session: Session, page: str) -> dict[str, Any]:
        flash, session.flash = session.flash, ""
        return {"person": session.person, "csrf": session.csrf, "page": page, "flash": flash, "clip": clip}
