"""A new authorization link for an MCP server, posted privately to its ``admins``.

With ``auth: {type: authorization_code, admins: [U…]}``, each link serve asks for
(tools/mcp/auth.py: once per link, not at every retry that reuses it) is posted to each
admin in their DM with the app (``chat.postMessage`` with the user id as ``channel``):
which server, that opening it grants opsloop the admin's access there, and until when
it is used. A failed post is one log line (its Slack error code, never the link) and
changes nothing else: the connect goes on, and ``opsloop doctor`` still shows the link.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from urllib.parse import urlsplit

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.mrkdwn import date, escape, inline_code

log = logging.getLogger("opsloop.oauth")

# Each post is bounded: the connect that made the link waits for it.
POST_TIMEOUT_S = 10.0


def link_token(url: str, label: str) -> str:
    """``<url|label>``, escaped: neither can end the token early (a ``|`` in the URL is
    percent-encoded; ``&``, ``<`` and ``>`` become entities, which Slack decodes)."""
    return f"<{escape(url.replace('|', '%7C'))}|{escape(label)}>"


def notice_text(server: str, url: str, expires_at: datetime) -> str:
    """The DM an admin gets (mrkdwn; every part from outside escaped)."""
    name = inline_code(server)
    where = escape(urlsplit(url).netloc or "the authorization server")
    return (
        f"opsloop needs an authorization for the MCP server {name}.\n"
        f"{link_token(url, f'Authorize opsloop for {server}')} (at {where}).\n"
        f"Opening it grants opsloop *your* access on {name}: the tools opsloop runs "
        "there act with your rights. Only open it if that is intended.\n"
        f"The link is good until {date(expires_at)}; a new one is sent after that, "
        "and `opsloop doctor` shows the current one."
    )


def _why(exc: Exception) -> str:
    """A failed post in a word: Slack's error code, else the exception's type (never its
    text, which may quote what was sent)."""
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error") or "slack_error")
    return "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__


async def post_authorization_link(
    slack: AsyncWebClient, server: str, url: str, expires_at: datetime, admins: Sequence[str]
) -> None:
    """Post ``url`` to each of ``admins`` privately; one warning line for those it could
    not reach. Raises nothing but a cancellation."""
    text = notice_text(server, url, expires_at)
    failed: list[str] = []
    people = list(dict.fromkeys(admins))
    for admin in people:
        try:
            async with asyncio.timeout(POST_TIMEOUT_S):
                # No unfurl: Slack would fetch the link itself, and opening it is the admin's act.
                await slack.chat_postMessage(
                    channel=admin, text=text, unfurl_links=False, unfurl_media=False
                )
        except Exception as exc:
            failed.append(f"{admin}:{_why(exc)}")
    if failed:
        log.warning(
            "mcp authorization link not posted server=%s admins=%s: `opsloop doctor` shows it",
            server,
            ",".join(failed),
        )
    else:
        log.info("mcp authorization link posted server=%s admins=%s", server, ",".join(people))
