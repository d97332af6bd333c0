"""How an alert shows in Slack: the post its thread opens on, and the lines of the same
alert firing again or resolving in that thread.

What a monitoring system sent is escaped like any text from outside (it can neither
ping nor link); only its link is made a link, and only an http(s) one
(``engine.alerts`` keeps no other).

Pure: no I/O here.
"""

from __future__ import annotations

from bot.limits import MAX_TEXT, Block
from bot.mrkdwn import escape, inline_code, truncate
from bot.render.common import context, section, short
from engine import events as ev

SOURCE_NAMES = {"alertmanager": "Alertmanager", "pagerduty": "PagerDuty", "generic": "Alert"}
LABELS_SHOWN = 8
SUMMARY_CHARS = 500
DETAILS_CHARS = 1000
# Annotations worth showing under the summary, in this order (Alertmanager's usual ones).
DETAIL_KEYS = ("description", "message")


def source_name(source: str) -> str:
    return SOURCE_NAMES.get(source, source.title())


def alert_root(e: ev.AlertReceived, *, resolved: bool = False) -> list[Block]:
    """The bot's post at the top of the channel for the alert ``e`` that opened the
    thread; ``resolved``: the alert has resolved since (the post is updated)."""
    mark = "✅ *Resolved*" if resolved else "🔥 *Firing*"
    title = f"{mark} · {_bold(e.summary, SUMMARY_CHARS)}"
    blocks = [section(truncate(title, MAX_TEXT))]
    detail = next((e.annotations[k] for k in DETAIL_KEYS if e.annotations.get(k)), "")
    if detail and detail != e.summary:
        blocks.append(section(truncate(escape(detail), DETAILS_CHARS)))
    blocks.append(context(_about(e)))
    return blocks


def alert_line(e: ev.AlertReceived) -> list[Block]:
    """A later ``alert_received`` of the thread's alert: it fired again, or resolved."""
    if e.status == "resolved":
        text = f"✅ {source_name(e.source)} says the alert resolved: {short(e.summary)}"
    else:
        text = f"🔥 {source_name(e.source)} says the alert fired again: {short(e.summary)}"
    return [context(text + _link(e.url))]


def _about(e: ev.AlertReceived) -> str:
    """Where it came from, which alert, its labels, its link."""
    parts = [escape(source_name(e.source)), inline_code(truncate(e.fingerprint, 100))]
    labels = [f"{k}={v}" for k, v in sorted(e.labels.items())]
    if labels:
        more = f" (+{len(labels) - LABELS_SHOWN})" if len(labels) > LABELS_SHOWN else ""
        parts.append(short(", ".join(labels[:LABELS_SHOWN]), 600) + more)
    return " · ".join(parts) + _link(e.url)


def _link(url: str) -> str:
    if not url:
        return ""
    return f" · <{escape(url)}|Open in the source>"


def _bold(text: str, limit: int) -> str:
    """``text`` escaped, on one line, in bold (its own ``*`` neutralised)."""
    return "*" + short(text, limit).replace("*", "∗") + "*"
