"""The team's policy: the default write scope, the project scopes that exist at start, who
may create or archive project scopes.

Read from `memory.toml` in the data folder, then from the module's environment (the manifest's
`env`), which wins field by field. A policy that cannot be right (private as the default, a
project slug that is not a slug) is a `ConfigError`: the module still starts and answers every
call with that error, so nothing is written under a policy nobody meant.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model import GLOBAL, PRIVATE, Refused, Writer, check_description, check_name, check_slug

CONFIG_FILE = "memory.toml"
# Who may manage scopes when nothing is configured: the mesh's own operators (calls from the
# mesh account itself arrive with via = "local").
DEFAULT_ADMINS = ("@local",)


class ConfigError(Exception):
    """The configuration names something impossible; the text says where and what would be right."""


@dataclass(frozen=True)
class Project:
    slug: str
    name: str
    description: str = ""


@dataclass(frozen=True)
class Config:
    default_scope: str = GLOBAL
    projects: tuple[Project, ...] = ()
    # "*" anyone; "@local" calls from the mesh account; "ACCOUNT" any user of it; "ACCOUNT/user".
    scope_admins: tuple[str, ...] = DEFAULT_ADMINS
    source: str = "defaults"  # where it came from, for the log line

    def may_manage_scopes(self, who: Writer) -> bool:
        for entry in self.scope_admins:
            if entry == "*" or (entry == "@local" and who.via == "local") or entry in (who.id, who.account):
                return True
        return False


def _project(raw: Any, where: str) -> Project:
    if isinstance(raw, str):  # "slug" or "slug=Display name" (the environment's form)
        slug, _, name = raw.partition("=")
        raw = {"slug": slug.strip(), "name": name.strip() or slug.strip()}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: a project is a table {{slug, name, description}} or 'slug=Name', not {raw!r}")
    try:
        slug = check_slug(raw.get("slug"), "project slug")
        if slug in (GLOBAL, PRIVATE):
            raise Refused(f"{slug!r} is not a project's slug: global and private scopes always exist")
        name = check_name(raw.get("name", slug))
        description = check_description(raw.get("description"))
    except Refused as e:
        raise ConfigError(f"{where}: {e}") from None
    return Project(slug, name, description)


def _words(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def load_config(data_dir: Path, env: Mapping[str, str]) -> Config:
    """The policy for this data folder: `memory.toml` there, then MEMORY_* from `env`."""
    path = data_dir / CONFIG_FILE
    raw: dict[str, Any] = {}
    sources = []
    if path.is_file():
        try:
            raw = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not TOML: {e}") from None
        sources.append(str(path))
        unknown = set(raw) - {"default_scope", "project", "scope_admins"}
        if unknown:
            raise ConfigError(f"{path}: unknown keys {sorted(unknown)}; the keys are default_scope, scope_admins, [[project]]")
    default_scope = raw.get("default_scope", GLOBAL)
    projects_raw: list[Any] = list(raw.get("project", []))
    admins_raw: Any = raw.get("scope_admins", list(DEFAULT_ADMINS))
    where = {"default_scope": str(path), "project": str(path), "scope_admins": str(path)}
    if env.get("MEMORY_DEFAULT_SCOPE"):
        default_scope, where["default_scope"] = env["MEMORY_DEFAULT_SCOPE"], "MEMORY_DEFAULT_SCOPE"
    if env.get("MEMORY_PROJECTS"):
        projects_raw, where["project"] = _words(env["MEMORY_PROJECTS"]), "MEMORY_PROJECTS"
    if env.get("MEMORY_SCOPE_ADMINS"):
        admins_raw, where["scope_admins"] = _words(env["MEMORY_SCOPE_ADMINS"]), "MEMORY_SCOPE_ADMINS"
    if any(k.startswith("MEMORY_") for k in env):
        sources.append("MEMORY_* environment")

    projects = tuple(_project(p, where["project"]) for p in projects_raw)
    if len({p.slug for p in projects}) != len(projects):
        raise ConfigError(f"{where['project']}: a project slug is listed twice")
    if default_scope == PRIVATE:
        raise ConfigError(
            f"{where['default_scope']}: the default write scope cannot be 'private' (a member's own scope is "
            "never the team's default); use 'global' or a project's slug"
        )
    if default_scope != GLOBAL and default_scope not in {p.slug for p in projects}:
        raise ConfigError(
            f"{where['default_scope']}: the default write scope {default_scope!r} is neither 'global' nor a "
            f"configured project ({', '.join(p.slug for p in projects) or 'none configured'}); add it to the projects"
        )
    if not isinstance(admins_raw, list) or not all(isinstance(a, str) and a for a in admins_raw):
        raise ConfigError(f"{where['scope_admins']}: a list of '*', '@local', 'ACCOUNT' or 'ACCOUNT/user'")
    return Config(default_scope, projects, tuple(admins_raw), " + ".join(sources) or "defaults")
