"""What a thread shows of a tool: its title instead of its registered name, its result
and its arguments as text people read instead of JSON.

A result is a JSON value: an MCP call's ``{"text", "structured", "attachments"}``, a
function tool's object, a string. People see the content, not the envelope: MCP's
wrapping is dropped (its structured content, else its text, with JSON text parsed), a
small object is ``key: value`` lines, a list shows its first few items and how many more.
The exact value stays in the log (``opsloop trace``).

Everything here returns plain text, not escaped: the renderers escape it.

Pure: no I/O here.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bot.mrkdwn import ELLIPSIS, compact_json, one_line

MAX_LINES = 8  # of a result; the rest is "…"
MAX_ITEMS = 5  # of a list; the rest is counted
VALUE_WIDTH = 120  # one value on a line
KEY_WIDTH = 60
MAX_DEPTH = 3  # nesting shown as text; deeper values as (cut) compact JSON

_MCP_KEYS = frozenset({"text", "structured", "attachments"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[\s_-]+")


# --- a tool's title ---------------------------------------------------------------------


def tool_title(name: str, title: str | None = None) -> str:
    """What people call the tool: its ``title`` (an MCP tool's, say) when it has one,
    else its registered name as words: ``mcp__catalog__scale_service`` → "Scale service",
    ``check_health`` → "Check health"."""
    given = one_line(title or "")
    if given:
        return given
    bare = name
    if name.startswith("mcp__") and name.count("__") >= 2:
        bare = name.split("__", 2)[2]  # mcp__<server>__<tool>
    words = _SEPARATORS.sub(" ", _CAMEL.sub(" ", bare)).strip().split(" ")
    # camelCase words lose their capital ("listServices" → "List services"); an
    # acronym keeps its capitals ("get_API_key" → "Get API key").
    words = [w.lower() if w[1:].islower() else w for w in words if w]
    if not words:
        return one_line(name) or "tool"
    return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])


def same_words(name: str, title: str) -> bool:
    """Whether ``title`` only spells ``name`` as words (then naming both is noise)."""

    def squashed(text: str) -> str:
        return _SEPARATORS.sub("", _CAMEL.sub(" ", text)).lower()

    return squashed(name) == squashed(title)


# --- a result ---------------------------------------------------------------------------


def content(value: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``value`` without MCP's envelope, and the attachments it summarised.

    An MCP result shows its structured content when it has some (the same data as its
    text, already parsed), else its text; text that holds JSON is parsed."""
    attachments: list[dict[str, Any]] = []
    if isinstance(value, dict) and value and set(value) <= _MCP_KEYS:
        found = value.get("attachments")
        attachments = [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []
        value = value["structured"] if "structured" in value else value.get("text")
    if isinstance(value, str):
        value = _parsed(value)
    return value, attachments


def _parsed(text: str) -> Any:
    """The JSON object or array ``text`` holds, else ``text`` itself."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return text
    try:
        return json.loads(stripped)
    except ValueError:
        return text


def result_lines(value: Any, max_lines: int = MAX_LINES) -> list[str]:
    """A tool's result as at most ``max_lines`` lines of plain text (none for nothing)."""
    inner, attachments = content(value)
    lines = _lines(inner)
    if attachments:
        lines.append(_attachments(attachments))
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], ELLIPSIS]
    return lines


def result_text(value: Any, max_lines: int = MAX_LINES) -> str:
    """:func:`result_lines` joined: ``"service: api\\nreplicas: 6"``."""
    return "\n".join(result_lines(value, max_lines))


def arguments_text(arguments: dict[str, Any]) -> str:
    """A call's arguments on one line: ``service: api, replicas: 6`` ("" for none)."""
    return ", ".join(f"{_key(k)}: {inline(v, 1)}" for k, v in arguments.items())


def _lines(value: Any) -> list[str]:
    if value is None or value == {} or value == "":
        return []
    if isinstance(value, str):
        text = "\n".join(line.rstrip() for line in value.strip("\n").splitlines())
        return re.sub(r"\n{3,}", "\n\n", text).split("\n")
    if isinstance(value, dict):
        lines: list[str] = []
        for key, item in value.items():
            if _rows(item):
                lines.append(f"{_key(key)}:")
                lines.extend(_bullets(item))
            else:
                lines.append(f"{_key(key)}: {inline(item, 1)}")
        return lines
    if isinstance(value, list) and _rows(value):
        return _bullets(value)
    return [inline(value)]


def _rows(value: Any) -> bool:
    """A non-empty list holding an object or a list: shown one item a line."""
    return isinstance(value, list) and any(isinstance(v, dict | list) for v in value)


def _bullets(items: list[Any]) -> list[str]:
    shown = [f"• {inline(item)}" for item in items[:MAX_ITEMS]]
    if len(items) > MAX_ITEMS:
        shown.append(f"and {len(items) - MAX_ITEMS} more")
    return shown


def inline(value: Any, depth: int = 0) -> str:
    """One value on one line: ``yes``, ``a, b and 3 more``, ``owner: data, replicas: 1``.

    ``depth``: how deep ``value`` sits in what the line shows; an object below the top
    is in parentheses, anything deeper than ``MAX_DEPTH`` cut compact JSON."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return _cut(one_line(value), VALUE_WIDTH)
    if depth > MAX_DEPTH:
        return _cut(compact_json(value), VALUE_WIDTH)
    if isinstance(value, dict):
        if not value:
            return "none"
        text = ", ".join(f"{_key(k)}: {inline(v, depth + 1)}" for k, v in value.items())
        return f"({text})" if depth else text  # a value of a key, or an item: bracketed
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        items = [inline(v, depth + 1) for v in value[:MAX_ITEMS]]
        more = f" and {len(value) - MAX_ITEMS} more" if len(value) > MAX_ITEMS else ""
        joiner = "; " if any(isinstance(v, dict) for v in value) else ", "
        return joiner.join(items) + more
    return _cut(one_line(str(value)), VALUE_WIDTH)


def _key(key: object) -> str:
    return _cut(one_line(key), KEY_WIDTH) or '""'


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + ELLIPSIS


def _attachments(found: list[dict[str, Any]]) -> str:
    """ "2 attachments: image (image/png, 12 kB), resource_link (https://…)"."""
    shown = []
    for a in found[:MAX_ITEMS]:
        kind = str(a.get("type") or "attachment")
        details = [str(a[k]) for k in ("mime_type", "uri", "name") if a.get(k)]
        if isinstance(a.get("bytes"), int):
            details.append(_size(a["bytes"]))
        shown.append(f"{kind} ({', '.join(details)})" if details else kind)
    more = f" and {len(found) - MAX_ITEMS} more" if len(found) > MAX_ITEMS else ""
    label = "attachment" if len(found) == 1 else "attachments"
    return _cut(f"{len(found)} {label}: {', '.join(shown)}{more}", VALUE_WIDTH * 2)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n // 1024} kB"
    return f"{n // (1024 * 1024)} MB"
