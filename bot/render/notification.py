"""The plain ``text`` sent with a message's blocks: what notifications and screen
readers say.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bot import mrkdwn as md
from bot.limits import MAX_FALLBACK_TEXT, Block
from bot.mrkdwn import escape, truncate
from bot.render.lines import event_line
from engine import events as ev
from engine.trace import summarize


def fallback_text(blocks_or_event: Sequence[Block] | ev.Event) -> str:
    """The plain ``text`` sent with blocks (notifications, screen readers), escaped."""
    if isinstance(blocks_or_event, ev.Event):
        blocks = event_line(blocks_or_event)
        if blocks is None:
            return truncate(escape(summarize(blocks_or_event)), MAX_FALLBACK_TEXT) or " "
        blocks_or_event = blocks
    parts = [_strip_fences(t) for t in _texts(blocks_or_event)]
    text = " · ".join(p for p in parts if p.strip()) or "opsloop"
    return truncate(text, MAX_FALLBACK_TEXT)


def _texts(blocks: Iterable[Block]) -> Iterable[str]:
    for block in blocks:
        if block.get("type") in ("header", "section") and isinstance(block.get("text"), dict):
            yield block["text"].get("text", "")
        for field in block.get("fields") or ():
            yield field.get("text", "")
        if block.get("type") == "context":
            for element in block.get("elements") or ():
                yield element.get("text", "")


def _strip_fences(text: str) -> str:
    return md.one_line(text.replace("```", " ").replace(md.ZWSP, ""))
