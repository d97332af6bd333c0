"""What a tool's answer may be once stored: text without lone surrogates, at most 1 MiB.

Every tool source (a ``@tool`` function, an MCP server, an HTTP action, a job's poll or
webhook) hands the engine a value; the runner makes it JSON (:func:`jsonable`) and
passes it through :func:`storable` (error texts through :func:`storable_text`) before it
becomes an event, so no source can forget either rule:

- Lone surrogates (``"\\ud800"`` is valid JSON, and Python's ``json`` decodes it) can
  be encoded neither as UTF-8 nor by PostgreSQL's ``jsonb``: they become U+FFFD, as
  Slack text does (``bot/payloads.py``).
- A result whose JSON passes :data:`MAX_RESULT_BYTES` is stored cut: the first bytes
  of its JSON (``head``), its full size (``bytes``) and the sha256 of that JSON, with a
  ``cut`` note before the head (in the prompt's sorted JSON too), so the model reads
  that it was cut.

"Its JSON" is the compact serialisation (``separators=(",", ":")``, keys in the order
the tool gave them, UTF-8, surrogates already replaced): the digest identifies what the
tool answered, the size is what it would have cost to store. Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from pydantic_core import to_jsonable_python

MAX_RESULT_BYTES = 1 << 20
# Images a result may hand the model (as image blocks of its tool_result): the media
# types the Anthropic API takes, and a bound on their decoded bytes, all of one result
# together, that leaves room under MAX_RESULT_BYTES for the rest of it once base64 (4/3).
IMAGE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
MAX_IMAGE_BYTES = 512 * 1024
# Room the cut form keeps for its other fields, so the whole stays under the bound.
_CUT_OVERHEAD = 1024
HEAD_BYTES = MAX_RESULT_BYTES - _CUT_OVERHEAD
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (``\\ud800`` in JSON) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def clean(value: Any) -> Any:
    """A JSON-able value with every string in it (keys too) passed through clean_text."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def jsonable(value: Any) -> Any:
    """What a tool returned as plain JSON types (pydantic's rules; ``str()`` for the rest).

    pydantic encodes dict keys as UTF-8, so a key holding a lone surrogate raises there:
    such a value is cleaned first, and one that still raises (a key deep in an object
    ``clean`` does not open) is kept as its text.
    """
    try:
        return to_jsonable_python(value, fallback=str)
    except UnicodeEncodeError:
        pass
    try:
        return to_jsonable_python(clean(value), fallback=str)
    except UnicodeEncodeError:
        return clean_text(str(value))


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def storable(value: Any) -> Any:
    """``value`` (JSON-able) as it may be stored: cleaned, and cut past the bound."""
    text = _dumps(value)
    if _SURROGATE.search(text):
        value = clean(value)
        text = _dumps(value)
    data = text.encode()
    if len(data) <= MAX_RESULT_BYTES:
        return value
    digest = hashlib.sha256(data).hexdigest()
    head = fit_text(data[:HEAD_BYTES].decode(errors="ignore"), HEAD_BYTES)
    return {
        "cut": cut_note(len(head.encode()), len(data), digest),
        "bytes": len(data),
        "sha256": digest,
        "head": head,
    }


def storable_text(text: str) -> str:
    """An error text as it may be stored: cleaned; past the bound, the note then its head."""
    text = clean_text(text)
    data = text.encode()
    if len(data) <= MAX_RESULT_BYTES:
        return text
    head = fit_text(data[:HEAD_BYTES].decode(errors="ignore"), HEAD_BYTES)
    note = cut_note(len(head.encode()), len(data), hashlib.sha256(data).hexdigest())
    return f"{note} {head}"


def fit_text(text: str, max_bytes: int) -> str:
    """A long prefix of ``text`` whose JSON string takes at most ``max_bytes``.

    Escapes (quotes, backslashes, control characters) and non-ASCII characters cost
    more than a byte each: each pass keeps the share of characters that would fit at
    the average cost, which one or two passes settle unless costly ones bunch up.
    """
    while text and (size := len(json.dumps(text, ensure_ascii=False).encode())) > max_bytes:
        text = text[: min(len(text) - 1, len(text) * max_bytes // size)]
    return text


def cut_note(shown: int, size: int, digest: str = "", *, whole: bool = True) -> str:
    """``[cut: 52,428,800 bytes, sha256 …; showing the first 1,047,552 bytes]``.

    ``whole=False`` when the whole was never read (an HTTP answer past the read limit):
    the note then says "more than ``size``", and there is no digest.
    """
    total = f"{size:,} bytes" if whole else f"more than {size:,} bytes"
    sha = f", sha256 {digest}" if digest else ""
    return f"[cut: {total}{sha}; showing the first {shown:,} bytes]"
