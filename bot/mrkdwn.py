"""Text for Slack's mrkdwn: escaping, our own mentions and dates, safe truncation.

Slack parses ``<…>`` in message text as mentions (``<@U1>``, ``<!channel>``), links
(``<https://x|label>``) and dates, and decodes only ``&amp;``, ``&lt;`` and ``&gt;``
(https://docs.slack.dev/messaging/formatting-message-text#escaping). So every text
written by the model, a tool or a person goes through :func:`escape`, and the only
``<…>`` tokens in what we send are the ones this module builds (:func:`mention`,
:func:`group_mention`, :func:`date`).

Lengths are counted in UTF-16 code units (:func:`slack_len`): never fewer than Python's
code points, so a text within a limit by this count is within it however Slack counts.

Pure: no I/O here.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from typing import Any

ELLIPSIS = "…"
ZWSP = "\u200b"  # zero-width space: breaks ``` so a text cannot close our fence
USER_ID = re.compile(r"^[UW][A-Z0-9]+$")
GROUP_ID = re.compile(r"^S[A-Z0-9]+$")
ENTITIES = ("&amp;", "&lt;", "&gt;")
# Renders "today at 6:25 PM" or "Dec 1st at 6:25 PM": a sentence puts no "at" or "on"
# before it ("Approved by @bob today at 6:25 PM").
DATE_FORMAT = "{date_short_pretty} at {time}"
AGO_FORMAT = "{ago}"  # "12 minutes ago"
_FENCE_OVERHEAD = len("```\n\n```")
# Control characters, and the bidirectional overrides and isolates that can make a text
# read differently from what it is (CVE-2021-42574, "Trojan Source"): never shown.
_HIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u202a-\u202e\u2066-\u2069]")
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
_CLUSTER_BACKOFF = 32  # give up keeping a grapheme whole after this many code points


def escape(text: object) -> str:
    """``text`` with ``&``, ``<`` and ``>`` escaped: it can neither ping nor link.

    Control characters and bidirectional overrides are dropped too, so that a text
    cannot show a reviewer something other than what it says.
    """
    text = _HIDDEN.sub("", str(text))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def fence_safe(text: str) -> str:
    """``text`` with no two backticks in a row, so it opens or closes no ``` fence."""
    return re.sub(r"`(?=`)", "`" + ZWSP, text)


def mention(user_id: str | None) -> str:
    """``<@U…>`` for a Slack user id; anything else is shown as escaped text."""
    if not user_id:
        return "someone"
    if USER_ID.match(user_id):
        return f"<@{user_id}>"
    return escape(user_id)


def group_mention(group_id: str) -> str:
    """``<!subteam^S…>`` for a user-group id; anything else as escaped text."""
    if GROUP_ID.match(group_id):
        return f"<!subteam^{group_id}>"
    return escape(group_id)


def date(when: datetime, fmt: str = DATE_FORMAT) -> str:
    """Slack's date token, shown in each reader's time zone; UTC text as the fallback."""
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    fallback = when.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(when.timestamp())}^{fmt}|{fallback}>"


def ago(when: datetime) -> str:
    """Slack's "12 minutes ago" for ``when`` (kept current by Slack), UTC as the fallback."""
    return date(when, AGO_FORMAT)


# --- text people wrote, and text written for people ---------------------------------------

_SLACK_TOKEN = re.compile(r"<([^<>\n]*)>")
_QUOTE = re.compile(r"^&gt;(?= |$)", re.MULTILINE)
_SYSTEM_MARKER = re.compile(r"\[system\] ?")
_PEOPLE = re.compile(
    r"&lt;@(?P<token>[UW][A-Z0-9]+)(?:\|[^&\n]*)?&gt;|(?<![\w@])(?P<bare>[UW][A-Z0-9]{2,})(?!\w)"
)


def slack_entities_decoded(text: str) -> str:
    """Undo Slack's own escaping (``&lt;`` ``&gt;`` ``&amp;``, the only entities it uses)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def person_text(text: str, *, slack: bool, people: frozenset[str] = frozenset()) -> str:
    """What a person wrote, as escaped mrkdwn that pings nobody new and links nowhere.

    ``slack``: the text is as Slack sends it (its own escaping, ``<@U…>`` tokens); it is
    decoded once and escaped once, so ``a > b`` shows as ``a > b``. A mention of one of
    the thread's ``people`` stays a mention, anyone else's is plain ``@U…``; a channel
    stays a channel link; a broadcast (``<!here>``) or a user group becomes plain
    ``@here``; a link shows its label.
    """
    if not slack:
        return escape(text)
    out: list[str] = []
    at = 0
    for m in _SLACK_TOKEN.finditer(text):
        out.append(escape(slack_entities_decoded(text[at : m.start()])))
        out.append(_slack_token(m.group(1), people))
        at = m.end()
    out.append(escape(slack_entities_decoded(text[at:])))
    return "".join(out)


def _slack_token(inner: str, people: frozenset[str]) -> str:
    target, _, label = inner.partition("|")
    label = slack_entities_decoded(label)
    if target.startswith("@"):
        uid = target[1:]
        return mention(uid) if uid in people else escape("@" + (label or uid).lstrip("@"))
    if target.startswith("#") and re.fullmatch(r"#[CG][A-Z0-9]+", target):
        return f"<{target}>"
    if target.startswith("!"):
        name = label or target[1:].split("^")[0]
        return escape("@" + name.lstrip("@"))
    return escape(label or slack_entities_decoded(target))


def for_people(escaped: str, people: frozenset[str] | set[str] = frozenset()) -> str:
    """Escaped text that the model wrote, as people should read it.

    The ids of the thread's ``people`` (bare, or as an escaped ``<@U…>`` token) become
    mentions, our internal ``[system]`` marker is dropped (the prompt's notes may be
    echoed), and a line-leading ``&gt;`` is a quote again (it can start no token).
    """

    def person(m: re.Match[str]) -> str:
        uid = m.group("token") or m.group("bare")
        return mention(uid) if uid in people else m.group(0)

    text = _SYSTEM_MARKER.sub("", escaped)
    text = _PEOPLE.sub(person, text) if people else text
    return _QUOTE.sub(">", text)


def slack_len(text: str) -> int:
    """Length in UTF-16 code units (an astral emoji counts 2)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines too) collapsed to one space."""
    return " ".join(str(text).split())


def inline_code(text: object) -> str:
    """``text`` escaped as one line of inline code; backticks cannot end it early."""
    flat = escape(one_line(text)).replace("`", "ˋ")
    return f"`{flat}`" if flat else "`(empty)`"


def compact_json(value: Any) -> str:
    """One-line JSON of ``value`` (unknown types as ``str``), not escaped."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except ValueError:  # a circular structure
        text = repr(value)
    return _show_bidi(text)


def pretty_json(value: Any) -> str:
    """Indented JSON of ``value`` for people to read, not escaped."""
    try:
        text = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    except (TypeError, ValueError):  # circular, or keys that cannot be sorted
        return compact_json(value)
    return _show_bidi(text)


def _show_bidi(text: str) -> str:
    """Bidirectional controls in JSON as visible ``\\u202e`` escapes (still valid JSON)."""
    return _BIDI.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def trace_pointer(thread_id: str) -> str:
    """Where the full text is: ``… (truncated; full text: `opsloop trace THREAD`)``."""
    return f"{ELLIPSIS} (truncated; full text: {inline_code(f'opsloop trace {thread_id}')})"


def truncate(text: str, limit: int, pointer: str = ELLIPSIS) -> str:
    """``text`` if it fits in ``limit``, else a prefix of it followed by ``pointer``.

    The cut keeps whole characters and grapheme clusters (an emoji with its modifiers),
    whole entities (``&amp;``) and whole ``<…>`` tokens, so an escaped text stays escaped
    and a mention is never half a mention. The result never exceeds ``limit``.
    """
    if limit <= 0:
        return ""
    if slack_len(text) <= limit:
        return text
    room = limit - slack_len(pointer)
    if room <= 0:  # not even the pointer fits: cut the pointer instead
        return _cut(pointer, limit)
    return _cut(text, room).rstrip() + pointer


def code_block(text: str, limit: int, pointer: str = ELLIPSIS) -> str:
    """``text`` escaped in a ``` fence that it cannot close early, within ``limit``.

    When cut, the fence still closes, an ellipsis marks the cut inside it and
    ``pointer`` follows the fence (say, :func:`trace_pointer`).
    """
    body = fence_safe(escape(text)) or "(empty)"
    if slack_len(body) + _FENCE_OVERHEAD <= limit:
        return f"```\n{body}\n```"
    tail = "" if pointer == ELLIPSIS else "\n" + pointer
    room = limit - _FENCE_OVERHEAD - slack_len(tail)
    if room < 2:  # no room for a fence at all
        return truncate(body, limit)
    return f"```\n{truncate(body, room)}\n```{tail}"


def split_text(text: str, limit: int) -> list[str]:
    """Cut an escaped mrkdwn ``text`` into chunks of at most ``limit`` units.

    Prefers paragraph, then line, then word boundaries; a ``` fence left open by a cut
    is closed at the end of its chunk and reopened at the start of the next one.
    """
    chunks: list[str] = []
    rest = text
    reopen = ""
    while rest:
        rest = reopen + rest
        if slack_len(rest) <= limit:
            chunks.append(rest)
            break
        room = limit - 4  # keep space to close a fence: "\n```"
        head = _cut(rest, room)
        for sep in ("\n\n", "\n", " "):
            at = head.rfind(sep)
            if at > len(head) // 2:
                head = head[: at + len(sep)]
                break
        if not head:  # nothing fits (cannot happen with a sane limit)
            head = rest[:1]
        rest = rest[len(head) :]
        if head.count("```") % 2:
            chunks.append(head.rstrip("\n") + "\n```")
            reopen = "```\n"
        else:
            chunks.append(head)
            reopen = ""
    return [c for c in chunks if c.strip()]


# --- cutting ---------------------------------------------------------------------------


def _cut(text: str, room: int) -> str:
    """The longest prefix of ``text`` within ``room`` units that cuts nothing in half."""
    head = text[: _keep_cluster(text, _fits(text, room))]
    amp = head.rfind("&")
    if amp > head.rfind(";") and any(text.startswith(e, amp) for e in ENTITIES):
        head = head[:amp]  # never half an entity
    lt = head.rfind("<")
    if lt > head.rfind(">"):
        head = head[:lt]  # never half a <…> token
    return head


def _fits(text: str, room: int) -> int:
    """How many code points of ``text`` fit in ``room`` UTF-16 units."""
    if slack_len(text) == len(text):  # no astral character: one unit each
        return min(room, len(text))
    units = 0
    for i, ch in enumerate(text):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > room:
            return i
    return len(text)


def _is_flag_half(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF  # regional indicators pair up into flags


def _splits_cluster(text: str, end: int) -> bool:
    """Whether cutting ``text`` before index ``end`` splits a grapheme cluster."""
    ch, before = text[end], text[end - 1]
    if before == "\u200d":  # zero-width joiner: the next character belongs to it
        return True
    if _is_flag_half(ch) and _is_flag_half(before):
        run = 0
        while end - run - 1 >= 0 and _is_flag_half(text[end - run - 1]):
            run += 1
        return run % 2 == 1
    cp = ord(ch)
    return bool(
        unicodedata.category(ch) in ("Mn", "Me", "Mc")  # combining marks
        or cp == 0x200D
        or 0xFE00 <= cp <= 0xFE0F  # variation selectors
        or 0x1F3FB <= cp <= 0x1F3FF  # skin tones
        or 0xE0020 <= cp <= 0xE007F  # tag characters (subdivision flags)
    )


def _keep_cluster(text: str, end: int) -> int:
    """``end`` moved back to a grapheme boundary (within a few code points)."""
    for back in range(_CLUSTER_BACKOFF):
        at = end - back
        if at <= 0 or at >= len(text) or not _splits_cluster(text, at):
            return max(at, 0)
    return end  # a pathological run of marks: cut inside it
