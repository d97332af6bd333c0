"""What people do in the local workspace, sent to the app as Slack sends it: signed HTTP.

Events (a message, a mention, the bot's own posts, an edit, the Home tab opened) are
delivered in the background like the Events API does: a 2xx within 3 s is success;
anything else is retried with ``X-Slack-Retry-Num`` and ``X-Slack-Retry-Reason``, at
once, after a minute and after five (https://docs.slack.dev/apis/events-api#retries).
Each batch is kept in the workspace's ``outbox`` (saved with the message that caused
it) until the app has it, so a restart delivers what a crash cut off; the app's dedupe
keys make a second delivery harmless.

Interactions (clicks, modal submissions) and slash commands are answered at once: the
caller gets the app's answer (a modal's ``response_action`` errors, a command's text).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from localslack import slack_requests as sr
from localslack.workspace import Change, Workspace

log = logging.getLogger("opsloop.local.app")

SLACK_RETRY_DELAYS = (0.0, 60.0, 300.0)  # Slack's own schedule
EVENT_TIMEOUT_S = 3.0  # Slack gives up on an event answer after 3 s
# Slack shows "the app did not respond" after 3 s; on a laptop the first request (Bolt's
# auth.test, SQLite's first write) can take longer, so the page waits a little more.
INTERACTION_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class AppAnswer:
    """The app's HTTP answer; ``status`` 0 when there was none (``error`` says why)."""

    status: int
    body: bytes = b""
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> dict[str, Any] | None:
        """The body as a JSON object, or None (an empty ack, or not JSON)."""
        if not self.body.strip():
            return None
        try:
            data = json.loads(self.body)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def why(self) -> str:
        return self.error or f"HTTP {self.status}"


class AppLink:
    """Sends the app at ``url`` (its ``POST /slack/events``) what Slack would send.

    ``before_send`` runs before an event batch leaves (``opsloop local`` saves the
    workspace there, so the app never hears of a message that a crash would lose).
    """

    def __init__(
        self,
        workspace: Workspace,
        *,
        signing_secret: str,
        retry_delays: Sequence[float] = SLACK_RETRY_DELAYS,
        event_timeout: float = EVENT_TIMEOUT_S,
        interaction_timeout: float = INTERACTION_TIMEOUT_S,
        before_send: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.workspace = workspace
        self.signing_secret = signing_secret
        self.retry_delays = tuple(retry_delays)
        self.event_timeout = event_timeout
        self.interaction_timeout = interaction_timeout
        self.before_send = before_send
        self.url = ""
        self.delivered: list[dict[str, Any]] = []  # (recent) event envelopes the app took
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._stop = asyncio.Event()
        self._sending = 0  # requests sent and not answered yet
        self._quiet = asyncio.Condition()

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, url: str) -> None:
        """Start sending to ``url``, beginning with what the outbox still holds."""
        self.url = url
        self._session = aiohttp.ClientSession(
            # Only our own app is reached: never through a proxy from the environment.
            trust_env=False,
            connector=aiohttp.TCPConnector(limit=20),
        )
        for key, batch in list(self.workspace.outbox.items()):
            self._spawn(key, batch["envelopes"], retried=True)

    async def close(self) -> None:
        """Stop sending; what was not delivered stays in the outbox for the next start.

        A request already sent is answered first (within its timeout): the app's handler
        runs to its end whether or not we wait, and must not find its database closed
        under it by the shutdown that follows."""
        self._closing = True
        self._stop.set()  # retries waiting for their turn give up now
        async with self._quiet:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interaction_timeout + 1):
                    await self._quiet.wait_for(lambda: not self._sending)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def idle(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until no event is being delivered (tests)."""
        async with asyncio.timeout(timeout):
            while self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- events -------------------------------------------------------------------------

    def feed(self, change: Change) -> None:
        """A workspace listener: send the app the events ``change`` makes Slack send."""
        self.send_events(events_for(self.workspace, change))

    def send_events(self, envelopes: list[dict[str, Any]]) -> None:
        """Deliver ``envelopes`` in order, in the background; kept in the outbox (and
        saved with the workspace's next save) until the app has them."""
        if not envelopes:
            return
        key = envelopes[0]["event_id"]
        self.workspace.outbox[key] = {"envelopes": envelopes, "at": time.time()}
        self.workspace.touch()
        if self._session is not None and not self._closing:
            self._spawn(key, envelopes, retried=False)

    def _spawn(self, key: str, envelopes: list[dict[str, Any]], *, retried: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(key, envelopes, retried))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, key: str, envelopes: list[dict[str, Any]], retried: bool) -> None:
        if self.before_send is not None:
            try:
                await self.before_send()
            except Exception:
                log.exception("saving the workspace failed; delivering anyway")
        for envelope in envelopes:
            if not await self._deliver_one(envelope, retried):
                return  # shutting down: left in the outbox
        self.workspace.outbox.pop(key, None)
        self.workspace.touch()

    async def _deliver_one(self, envelope: dict[str, Any], retried: bool) -> bool:
        """Deliver with Slack's retries; False if shutting down first (not delivered)."""
        event = envelope.get("event") or {}
        what = f"event_id={envelope.get('event_id')} type={event.get('type')}"
        reason = "http_timeout"
        for attempt, delay in enumerate([0.0, *self.retry_delays]):
            if delay:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
            if self._closing:
                return False
            retry = attempt if attempt else (1 if retried else 0)
            headers = {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": reason}
            answer = await self._post(envelope, self.event_timeout, headers if retry else {})
            if answer.ok:
                self.delivered.append(envelope)
                del self.delivered[:-200]
                return True
            if self._closing:
                return False
            reason = _retry_reason(answer)
            log.warning("the app did not take an event %s: %s", what, answer.why())
        log.warning("gave up delivering an event %s", what)
        return True

    # --- interactions -------------------------------------------------------------------

    async def interaction(self, payload: dict[str, Any]) -> AppAnswer:
        """A click, a modal submission or a closed modal; the app's answer."""
        return await self._post(payload, self.interaction_timeout)

    async def command(self, fields: dict[str, Any]) -> AppAnswer:
        """A slash command; the app's answer (its ``text`` and ``response_type``)."""
        return await self._post(fields, self.interaction_timeout)

    async def _post(
        self, payload: dict[str, Any], wait: float, extra: dict[str, str] | None = None
    ) -> AppAnswer:
        if self._session is None or self._closing:
            return AppAnswer(0, error="the local workspace is shutting down")
        body, headers = sr.signed(payload, self.signing_secret)
        headers = {**headers, **(extra or {}), "User-Agent": "Slackbot 1.0 (opsloop local)"}
        self._sending += 1
        try:
            async with self._session.post(
                self.url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=wait),
                allow_redirects=False,
            ) as response:
                return AppAnswer(response.status, await response.read())
        except TimeoutError:
            return AppAnswer(0, error="http_timeout")
        except aiohttp.ClientError as exc:
            return AppAnswer(0, error=f"connection_failed ({type(exc).__name__})")
        finally:
            self._sending -= 1
            async with self._quiet:
                self._quiet.notify_all()


def _retry_reason(answer: AppAnswer) -> str:
    if answer.status:
        return "http_error"
    return "http_timeout" if answer.error == "http_timeout" else "connection_failed"


def events_for(workspace: Workspace, change: Change) -> list[dict[str, Any]]:
    """The events Slack sends an app in every channel (the bot is in all of them) when
    ``change`` happens: a person's message is a ``message`` event, and also an
    ``app_mention`` when it mentions the bot outside a DM; the bot's own posts and edits
    come back as ``message`` events too (Bolt acknowledges and ignores them)."""
    identity = workspace.identity
    channel = workspace.channel(change.channel or "")
    if channel is None or change.kind not in ("message", "message_changed"):
        return []
    channel_type = "im" if channel.is_im else "channel"
    if change.kind == "message_changed":
        message, previous = change.data["message"], change.data["previous"]
        return [
            sr.message_changed_event(
                identity,
                channel=channel.id,
                message=message,
                previous=previous,
                channel_type=channel_type,
            )
        ]
    message = change.data
    if message.get("bot_id"):
        if message["bot_id"] != identity.bot_id:
            return []
        return [
            sr.bot_message_event(identity, message, channel=channel.id, channel_type=channel_type)
        ]
    user, text, ts = str(message.get("user") or ""), message.get("text", ""), message["ts"]
    thread_ts = message.get("thread_ts")
    events = []
    if not channel.is_im and f"<@{identity.bot_user_id}>" in text:
        events.append(
            sr.app_mention_event(
                identity, user=user, text=text, channel=channel.id, ts=ts, thread_ts=thread_ts
            )
        )
    extra = {"parent_user_id": message.get("parent_user_id", user)} if thread_ts else {}
    if message.get("client_msg_id"):
        extra["client_msg_id"] = message["client_msg_id"]
    events.append(
        sr.message_event(
            identity,
            user=user,
            text=text,
            channel=channel.id,
            ts=ts,
            thread_ts=thread_ts,
            channel_type=channel_type,
            **extra,
        )
    )
    return events
