"""Chat markup decoded into the plain words a person meant, for the model's prompt.

Slack sends message text with ``&``, ``<`` and ``>`` escaped and with mentions, channels
and links as ``<…>`` tokens (https://api.slack.com/reference/surfaces/formatting).
The log keeps that text as Slack sent it; the projection shows the model what the
person saw on screen: ``<@U123>`` as ``@alice``, ``<#C123|ops>`` as ``#ops``,
``<https://x|label>`` as ``label (https://x)``, ``&lt;`` as ``<``.

Pure: no I/O here, and nothing of Slack's SDK: only the text format.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# A token is everything between "<" and the next ">": a literal "<" or ">" in text is
# always escaped, so neither can occur inside one.
_TOKEN = re.compile(r"<([^<>]*)>")
_ENTITY = re.compile(r"&(amp|lt|gt);")
_ENTITIES = {"amp": "&", "lt": "<", "gt": ">"}


def unescape(text: str) -> str:
    """Slack's three entities decoded, each exactly once (``&amp;lt;`` is ``&lt;``)."""
    return _ENTITY.sub(lambda m: _ENTITIES[m.group(1)], text)


def decode(text: str, names: Mapping[str, str] | None = None) -> str:
    """``text`` as Slack sent it, rendered as a person reads it in the client.

    ``names`` maps user ids to display names; a user without one shows as ``@U123``.
    """
    names = names or {}
    out: list[str] = []
    last = 0
    for match in _TOKEN.finditer(text):
        out.append(unescape(text[last : match.start()]))
        out.append(_token(match.group(1), names))
        last = match.end()
    out.append(unescape(text[last:]))
    return "".join(out)


def _token(inner: str, names: Mapping[str, str]) -> str:
    target, _, label = inner.partition("|")
    label = unescape(label)
    if target.startswith("@"):  # <@U123> or <@U123|alice>
        user = target[1:]
        name = names.get(user) or label or user
        return name if name.startswith("@") else f"@{name}"
    if target.startswith("#"):  # <#C123|ops>, or <#C123> when Slack left the name out
        channel = label or target[1:]
        return channel if channel.startswith("#") else f"#{channel}"
    if target.startswith("!"):
        return _special(target[1:], label)
    url = unescape(target)
    if not label or label == url or url.endswith(f"//{label}") or url == f"mailto:{label}":
        # Slack linked what the person typed (a bare domain, an address): show that.
        return label or url
    return f"{label} ({url})"


def _special(command: str, label: str) -> str:
    """``<!here>``, ``<!subteam^S123|@sre>``, ``<!date^…|fallback>`` and the like."""
    kind, _, rest = command.partition("^")
    if kind in ("here", "channel", "everyone"):
        return f"@{kind}"
    if kind == "subteam":
        group = label or rest
        return group if group.startswith("@") else f"@{group}"
    return label or f"<!{command}>"


def names_from(source: Mapping[str, Any]) -> dict[str, str]:
    """The ``names`` a front door stored beside a message: only str → str entries."""
    raw = source.get("names")
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str) and v}


def decoded(text: str, source: Mapping[str, Any]) -> str:
    """``text`` decoded when ``source`` says Slack sent it; other front doors' verbatim."""
    if source.get("kind") != "slack":
        return text
    return decode(text, names_from(source))
