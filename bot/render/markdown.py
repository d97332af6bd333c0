"""Model text as Slack's standard markdown (a stream's ``markdown_text``, the ``markdown``
block), which can neither ping nor hide a link, cut within Slack's 12,000 characters.

Outside code, text is escaped as :mod:`bot.mrkdwn` escapes it (``&lt;`` renders as
``<`` in markdown too, and a ``<!channel>`` or an ``<https://x|label>`` can form no
token), a ``[label](url)`` can form no link (a zero-width space after ``]``) and
``@here`` no broadcast; a line-leading ``>`` stays a quote. Inside code (spans and
fences) the text is shown as written, since markdown shows code literally and people
copy it (``a && b``, ``2>&1``), but for the openings of Slack's own tokens (``<@``,
``<!``, ``<#``), which a zero-width space breaks. A cut never leaves a fence open or an
entity halved.

Pure: no I/O here.
"""

from __future__ import annotations

import re
from typing import Literal

from bot import mrkdwn as md
from bot.render.tasks import neutral, visible

MAX_MARKDOWN = 12_000  # per markdown_text call, and across a message's markdown blocks

Kind = Literal["text", "code", "fence"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_TOKEN_OPENING = re.compile(r"<(?=[@!#])")
_QUOTE = re.compile(r"^( {0,3})((?:&gt; ?)+)", re.MULTILINE)
_SYSTEM_MARKER = re.compile(r"\[system\] ?")
_HALF_ENTITY = re.compile(r"&[#A-Za-z0-9]{0,8}$")


def segments(text: str) -> list[tuple[Kind, str]]:
    """``text`` as runs of prose, inline code spans and fenced code blocks (each fence
    closed: one the text leaves open runs to its end, as markdown reads it)."""
    out: list[tuple[Kind, str]] = []
    prose: list[str] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            prose.append(lines[i])
            i += 1
            continue
        out.extend(_spans("".join(prose)))
        prose = []
        fence = opening.group(1)
        block = [lines[i]]
        i += 1
        while i < len(lines):
            block.append(lines[i])
            i += 1
            if _closes(block[-1], fence):
                break
        else:  # never closed: markdown reads code to the end; we close it there
            block.append(("" if block[-1].endswith("\n") else "\n") + fence[0] * len(fence))
        out.append(("fence", "".join(block)))
    out.extend(_spans("".join(prose)))
    return [(k, s) for k, s in out if s]


def _closes(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= len(fence) and stripped == fence[0] * len(stripped)


def _spans(prose: str) -> list[tuple[Kind, str]]:
    out: list[tuple[Kind, str]] = []
    at = 0
    for m in _SPAN.finditer(prose):
        out.append(("text", prose[at : m.start()]))
        out.append(("code", m.group(0)))
        at = m.end()
    out.append(("text", prose[at:]))
    return out


def safe_segments(text: str) -> list[tuple[Kind, str]]:
    """:func:`segments`, each made safe to send (see the module's docstring)."""
    out: list[tuple[Kind, str]] = []
    for kind, raw in segments(text):
        if kind == "text":
            shown = neutral(md.escape(_SYSTEM_MARKER.sub("", raw)))
            shown = _QUOTE.sub(lambda m: m.group(1) + m.group(2).replace("&gt;", ">"), shown)
        else:
            shown = _TOKEN_OPENING.sub("<" + md.ZWSP, visible(raw))
        out.append((kind, shown))
    return out


def cut_pointer(thread_id: str) -> str:
    """What follows a cut text: where the whole of it is."""
    ref = visible(md.one_line(thread_id)).replace("`", "ˋ")
    return f"{md.ELLIPSIS} (cut: see `opsloop trace {ref}`)"


def safe_markdown(
    text: str, thread_id: str, limit: int = MAX_MARKDOWN, *, head: str = "", tail: str = ""
) -> str:
    """``head`` + model ``text`` made safe + ``tail``, within ``limit`` characters: when
    the text does not fit, it is cut and followed by :func:`cut_pointer` (``head`` and
    ``tail`` are ours, already markdown, and always kept)."""
    parts = safe_segments(text.strip())
    whole = "".join(s for _, s in parts)
    room = limit - md.slack_len(head) - md.slack_len(tail)
    if md.slack_len(whole) <= room:
        return f"{head}{whole}{tail}"
    pointer = cut_pointer(thread_id)
    kept = _fit(parts, max(room - md.slack_len(pointer) - 1, 0))
    glue = "\n" if kept.endswith(("```", "~~~")) else ""
    return f"{head}{kept}{glue}{pointer}{tail}"


def growing_markdown(text: str) -> str:
    """As much of :func:`safe_markdown` of an answer that begins with ``text`` (an answer
    still being written) as ``text`` already settles: made safe the way the whole will
    be, for a stream to show now.

    What later text may change is held back: the last word (``@her`` may become
    ``@here``), and anything the text so far and the text up to its last word do not
    make safe alike (an inline code span not closed yet is not code yet, a fence not
    closed yet is closed here), nor half of an entity. Not cut: whether the whole fits
    in Slack's limit is for the whole to say."""
    text = text.lstrip()
    end = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t")) + 1
    end = min(end, _open_span(text))
    if end <= 0:
        return ""
    words = "".join(s for _, s in safe_segments(text[:end]))
    whole = "".join(s for _, s in safe_segments(text))
    same = 0
    for a, b in zip(words, whole, strict=False):
        if a != b:
            break
        same += 1
    settled = words[:same]
    half = _HALF_ENTITY.search(settled)
    return settled[: half.start()] if half else settled


def _open_span(text: str) -> int:
    """Where in ``text`` a code span that later text may close could begin: the first
    backtick after the last fence that no span closes (``len(text)`` if none)."""
    at, first = 0, len(text)
    for kind, part in segments(text):
        if kind == "fence":
            first = len(text)  # the prose before a fence is settled
        elif kind == "text" and "`" in part and first == len(text):
            first = at + part.index("`")
        at += len(part)
    return first


def _fit(parts: list[tuple[Kind, str]], room: int) -> str:
    """Whole segments while they fit, then as much of the next as can be cut safely."""
    out: list[str] = []
    used = 0
    for kind, shown in parts:
        size = md.slack_len(shown)
        if used + size <= room:
            out.append(shown)
            used += size
            continue
        left = room - used
        if kind == "text":
            out.append(md.truncate(shown, left, ""))
        elif kind == "fence":
            out.append(_cut_fence(shown, left))
        break  # an inline code span is all or nothing
    return "".join(out).rstrip()


def _cut_fence(block: str, room: int) -> str:
    """A fenced block's first lines within ``room``, its fence still closed."""
    lines = block.splitlines(keepends=True)
    opening, closing = lines[0], lines[-1].strip()
    if not opening.endswith("\n"):
        return ""
    budget = room - md.slack_len(opening) - md.slack_len(closing) - 2
    body: list[str] = []
    for line in lines[1:-1]:
        if md.slack_len(line) > budget:
            if budget > 1:
                body.append(md.truncate(line.rstrip("\n"), budget - 1, "") + "\n")
            break
        body.append(line)
        budget -= md.slack_len(line)
    if not body:
        return ""
    return opening + "".join(body) + closing
