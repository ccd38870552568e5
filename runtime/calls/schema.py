"""A cheap first check of a call's arguments against the tool's `inputSchema`.

The node checks what it can see without decoding the values: required properties, the JSON
type of each top-level property (from the first byte of its raw JSON), and unknown properties
when the schema forbids them. That catches most bad calls with a 400 naming the field, before
the child is bothered; everything deeper is the child's (its SDK validates the rest).
"""

from __future__ import annotations

from typing import Any

import msgspec

_FIRST_BYTE_TYPES: dict[int, str] = {
    ord('"'): "string",
    ord("{"): "object",
    ord("["): "array",
    ord("t"): "boolean",
    ord("f"): "boolean",
    ord("n"): "null",
}


def _json_type(raw: msgspec.Raw) -> str:
    data = bytes(raw)
    kind = _FIRST_BYTE_TYPES.get(data[0]) if data else None
    if kind is not None:
        return kind
    if any(c in data for c in b".eE"):
        try:
            # JSON Schema's integer is any number with no fractional part: 2.0 and 1e2 are integers.
            return "integer" if float(data).is_integer() else "number"
        except ValueError:
            return "number"
    return "integer"


def _matches(actual: str, wanted: str) -> bool:
    return actual == wanted or (wanted == "number" and actual == "integer")


class ArgumentsChecker:
    __slots__ = ("required", "types", "closed", "known")

    def __init__(self, required: list[str], types: dict[str, tuple[str, ...]], closed: bool, known: set[str]) -> None:
        self.required, self.types, self.closed, self.known = required, types, closed, known

    def problem(self, args: dict[str, msgspec.Raw]) -> tuple[str, str] | None:
        """(field, what is wrong and what would be right), or None when the check passes."""
        for name in self.required:
            if name not in args:
                wanted = "/".join(self.types.get(name, ())) or "a value"
                return name, f"the required argument {name!r} is missing; give it as {wanted}"
        for name, raw in args.items():
            types = self.types.get(name)
            if types is None:
                if self.closed and name not in self.known:
                    return name, f"unknown argument {name!r}; this tool takes {', '.join(sorted(self.known)) or 'none'}"
                continue
            actual = _json_type(raw)
            if not any(_matches(actual, w) for w in types):
                return (
                    name,
                    f"argument {name!r} is {'an' if actual[0] in 'aeiou' else 'a'} {actual}; it must be {' or '.join(types)}",
                )
        return None


def compile_schema(schema: dict[str, Any] | None) -> ArgumentsChecker | None:
    """A checker for the parts of the schema it understands, or None when there is nothing to check."""
    if not isinstance(schema, dict):
        return None
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = (
        [r for r in schema.get("required", []) if isinstance(r, str)]
        if isinstance(schema.get("required"), list)
        else []
    )
    types: dict[str, tuple[str, ...]] = {}
    for name, prop in props.items():
        if not isinstance(prop, dict):
            continue
        t = prop.get("type")
        if isinstance(t, str):
            types[name] = (t,)
        elif isinstance(t, list) and all(isinstance(x, str) for x in t):
            types[name] = tuple(t)
    closed = schema.get("additionalProperties") is False
    if not required and not types and not closed:
        return None
    return ArgumentsChecker(required, types, closed, set(props))
