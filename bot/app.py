"""The Bolt app: Slack's events, clicks, modal submissions and ``/opsloop``, as engine inputs.

Each listener translates, nothing more: it reads the payload (:mod:`bot.payloads`),
makes one front-door call of :mod:`engine.inputs` (deduplicated on the delivery), then
acknowledges. ``process_before_response=True`` makes Bolt send its HTTP answer only
after the listener returns, so an input Slack sees acknowledged is stored: if the
database is down the listener raises, Bolt answers 500 and Slack delivers again later,
where the dedupe key makes the retry count once. Anything slow (the model, tools,
posting to Slack) happens elsewhere: the worker, woken with ``kick(thread_id)``, or a
background task here for an ephemeral note, a modal or the Home tab.

Every delivery gets a 2xx unless storing it failed: events the bot ignores (edits,
bots, chatter) are acknowledged on purpose, since an unmatched request is answered 404
and Slack retries those.

Serving over HTTP: route ``POST /slack/events`` to :func:`handle_slack_request` (it
refuses malformed signature headers with a 4xx before Bolt, which would answer them
500) and call :func:`drain` on shutdown. Over Socket Mode, hand the app to
``AsyncSocketModeHandler`` as it is.
"""

from __future__ import annotations

import asyncio
import logging
import re
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot import home
from bot import payloads as p
from bot.blocks import (
    ACTIVE,
    APPROVE_ACTION,
    CANCEL_ACTION,
    REASON_ACTION,
    REASON_BLOCK,
    REJECT_ACTION,
    REJECT_CALLBACK,
    Binding,
    parse_binding,
    reject_modal,
)
from bot.mrkdwn import escape, mention
from bot.reviewers import ReviewerLookupError, Reviewers
from engine.errors import ThreadNotFound
from engine.events import utcnow
from engine.inputs import (
    Accepted,
    Refused,
    cancel,
    decide_approval,
    post_user_message,
    why_not_decidable,
)
from engine.policy import ApproverPolicy
from engine.store import Store, ThreadInfo

log = logging.getLogger("opsloop.bot")

Kick = Callable[[str], None]

LIST_LIMIT = 500  # threads read for /opsloop and the Home tab
RECENT = 10  # recent threads on the Home tab
DRAIN_TIMEOUT_S = 5.0
INVALID_BUTTON = "This button is not valid (it does not belong to a pending call). Nothing changed."
LOOKUP_FAILED = (
    "I could not check your user groups with Slack just now. Nothing changed: try again "
    "in a minute."
)
_BY_USER = re.compile(r"\bby ([UW][A-Z0-9]{2,})\b")
# Events that Bolt does not authorise with auth.test (the app is being removed).
_NO_AUTH_EVENTS = frozenset({"app_uninstalled", "tokens_revoked", "team_access_revoked"})


class SlackUnavailable(Exception):
    """Slack's Web API refused a call a listener cannot do without (auth.test)."""


# --- background work -------------------------------------------------------------------


class _Background:
    """Tasks that outlive a request (ephemerals, modals, Home): kept referenced, their
    failures logged, awaited by :func:`drain` on shutdown."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, what: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(what, work))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _run(what: str, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except SlackApiError as exc:
            log.warning("%s failed: %s", what, exc.response.get("error") or exc)
        except Exception:
            log.exception("%s failed", what)


_BACKGROUND: weakref.WeakKeyDictionary[AsyncApp, _Background] = weakref.WeakKeyDictionary()


async def drain(app: AsyncApp, timeout: float = DRAIN_TIMEOUT_S) -> None:  # noqa: ASYNC109
    """Wait for ``app``'s background Slack calls (ephemerals, modals, Home) to finish."""
    background = _BACKGROUND.get(app)
    if background is None or not background.tasks:
        return
    _done, pending = await asyncio.wait(set(background.tasks), timeout=timeout)
    for task in pending:
        task.cancel()


# --- HTTP -------------------------------------------------------------------------------


async def handle_slack_request(app: AsyncApp, request: web.Request) -> web.Response:
    """``POST /slack/events`` for aiohttp: events, interactivity and slash commands.

    Bolt's adapter would answer 500 to a malformed ``X-Slack-Request-Timestamp`` or
    signature (Slack then retries) and to a body that is not JSON or UTF-8; these are
    the sender's fault, so they get a 4xx here. Everything else is Bolt's answer:
    401 for a bad or stale signature, 500 when storing failed.
    """
    problem = p.verify_headers(request.headers)
    if problem is not None:
        return web.json_response({"error": problem}, status=401)
    raw = await request.read()
    try:
        body = raw.decode("utf-8")
        bolt_request = AsyncBoltRequest(
            body=body,
            query=request.query_string,
            headers=request.headers,  # type: ignore[arg-type]
        )
    except ValueError:  # UnicodeDecodeError, JSONDecodeError
        return web.json_response({"error": "malformed body"}, status=400)
    response = await app.async_dispatch(bolt_request)
    return await to_aiohttp_response(response)


# --- the wiring -------------------------------------------------------------------------


@dataclass
class _Identity:
    """The bot's auth.test, checked before Bolt's own authorisation.

    Bolt answers a failed auth.test with HTTP 200 and a user-facing message: an event
    arriving then would be acknowledged and lost. Raising instead makes Bolt answer 500,
    so Slack delivers it again. Checked once per process (until it succeeds).
    """

    url: str | None = None
    checked: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def ensure(self, client: AsyncWebClient) -> None:
        if self.checked:
            return
        async with self.lock:
            if self.checked:
                return
            try:
                response = await client.auth_test()
            except SlackApiError as exc:
                error = exc.response.get("error") or exc
                raise SlackUnavailable(f"auth.test failed ({error}); Slack will retry") from exc
            self.url = response.get("url")
            self.checked = True


@dataclass
class _Deps:
    store: Store
    approvers: ApproverPolicy
    kick: Kick
    groups: Reviewers | None
    background: _Background
    identity: _Identity

    def wake(self, thread_id: str) -> None:
        try:
            self.kick(thread_id)
        except Exception:  # stored already: the worker's sweep finds it anyway
            log.exception("kick %s failed", thread_id)

    async def decide(
        self,
        binding: Binding,
        reviewer: str,
        decision: Literal["approve", "reject"],
        groups: frozenset[str],
        dedupe_key: str,
        reason: str = "",
    ) -> Accepted | Refused:
        """``decision`` on exactly the call the card was made for."""
        return await decide_approval(
            self.store,
            binding.thread_id,
            tool_call_id=binding.tool_call_id,
            reviewer=reviewer,
            decision=decision,
            policy=self.approvers,
            reason=reason,
            arguments_hash=binding.arguments_hash,
            reviewer_groups=groups,
            dedupe_key=dedupe_key,
        )

    async def reviewer_groups(self, user: str) -> frozenset[str]:
        """The approver groups ``user`` is in; looked up only when that can matter."""
        if not self.approvers.groups or user in self.approvers.approvers:
            return frozenset()
        if self.groups is None:
            return frozenset()
        return await self.groups.groups_of(user, self.approvers.groups)

    def notify(self, client: AsyncWebClient, clicked: p.Click, text: str) -> None:
        """Tell the clicker, and only them, what happened (in the background)."""
        if not clicked.channel or not clicked.user:
            log.info("cannot tell %s: %s", clicked.user or "someone", text)
            return
        self.background.spawn(
            "chat.postEphemeral",
            client.chat_postEphemeral(
                channel=clicked.channel,
                user=clicked.user,
                text=text,
                thread_ts=clicked.thread_ts,
            ),
        )


def build_app(
    *,
    store: Store,
    token: str,
    signing_secret: str,
    client: AsyncWebClient | None = None,
    approvers: ApproverPolicy,
    kick: Kick,
    groups: Reviewers | None = None,
) -> AsyncApp:
    """The Bolt app for ``store``. ``client`` (its token wins over ``token``) is the Web
    API client, pointing at ``SLACK_API_URL``; ``kick(thread_id)`` wakes the worker;
    ``groups`` resolves user-group approvers (made from the client if None)."""
    identity = _Identity()

    async def check_identity(body: dict[str, Any], client: AsyncWebClient, next_: Any) -> Any:
        if body.get("type") not in ("url_verification", "ssl_check") and (
            (body.get("event") or {}).get("type") not in _NO_AUTH_EVENTS
        ):
            await identity.ensure(client)
        return await next_()

    if client is not None and not client.token:
        client.token = token
    app = AsyncApp(
        token=None if client is not None else token,
        signing_secret=signing_secret,
        client=client,
        process_before_response=True,
        before_authorize=check_identity,
    )
    if groups is None and approvers.groups:
        groups = Reviewers(app.client)
    background = _Background()
    _BACKGROUND[app] = background
    deps = _Deps(store, approvers, kick, groups, background, identity)
    _register(app, deps)
    return app


def _register(app: AsyncApp, d: _Deps) -> None:
    # --- messages ---------------------------------------------------------------------

    @app.event("app_mention")
    async def on_mention(ack: Any, body: dict[str, Any], context: Any) -> None:
        event = body.get("event") or {}
        if p.is_from_a_person(event, context.bot_user_id):
            await _store_message(d, body, context.bot_user_id)
        await ack()

    @app.event("message")
    async def on_message(ack: Any, body: dict[str, Any], context: Any) -> None:
        event = body.get("event") or {}
        kind = p.message_kind(event, context.bot_user_id)
        if kind in ("dm", "reply"):
            # A reply counts only in a thread the bot owns; a DM starts one.
            await _store_message(d, body, context.bot_user_id, start=kind == "dm")
        await ack()  # everything else is deliberately ignored, with a 200

    @app.event("app_home_opened")
    async def on_home_opened(ack: Any, event: dict[str, Any], client: AsyncWebClient) -> None:
        await ack()
        user = event.get("user")
        if event.get("tab", "home") == "home" and user:
            d.background.spawn("views.publish", _publish_home(d, client, user))

    # --- the approval card ------------------------------------------------------------

    @app.action(APPROVE_ACTION)
    async def on_approve(
        ack: Any, body: dict[str, Any], action: dict[str, Any], client: AsyncWebClient
    ) -> None:
        clicked = p.click(body, action)
        binding = _binding(clicked.value)
        if binding is None:
            await ack()
            d.notify(client, clicked, INVALID_BUTTON)
            return
        try:
            reviewer_groups = await d.reviewer_groups(clicked.user)
        except ReviewerLookupError:
            await ack()
            d.notify(client, clicked, LOOKUP_FAILED)
            return
        try:
            result = await d.decide(
                binding, clicked.user, "approve", reviewer_groups, f"click:{clicked.action_ts}"
            )
        except ThreadNotFound:
            await ack()
            d.notify(client, clicked, INVALID_BUTTON)
            return
        await ack()
        _answered(d, client, clicked, result)

    @app.action(REJECT_ACTION)
    async def on_reject(
        ack: Any, body: dict[str, Any], action: dict[str, Any], client: AsyncWebClient
    ) -> None:
        clicked = p.click(body, action)
        binding = _binding(clicked.value)
        try:
            state = await d.store.load(binding.thread_id) if binding else None
        except ThreadNotFound:
            state = None
        if binding is None or state is None:
            await ack()
            d.notify(client, clicked, INVALID_BUTTON)
            return
        why = await why_not_decidable(
            d.store, state, binding.tool_call_id, binding.arguments_hash, utcnow()
        )
        if why is not None:
            await ack()
            d.notify(client, clicked, _refusal_text(why))
            return
        call = state.pending
        assert call is not None
        try:
            reviewer_groups = await d.reviewer_groups(clicked.user)
        except ReviewerLookupError:
            await ack()
            d.notify(client, clicked, LOOKUP_FAILED)
            return
        if d.approvers.check("reject", clicked.user, state.requester, reviewer_groups):
            # Not theirs to decide: refused now (with its audit event), no modal.
            result = await d.decide(
                binding, clicked.user, "reject", reviewer_groups, f"click:{clicked.action_ts}"
            )
            await ack()
            _answered(d, client, clicked, result)
            return
        await ack()
        # The trigger id expires 3 s after the click: open the modal now, store nothing
        # until it is submitted.
        modal = reject_modal(
            thread_id=binding.thread_id,
            tool_call_id=binding.tool_call_id,
            arguments_hash=binding.arguments_hash,
            tool_name=call.intent,
        )
        d.background.spawn(
            "views.open", client.views_open(trigger_id=clicked.trigger_id, view=modal)
        )

    @app.view(REJECT_CALLBACK)
    async def on_reject_submitted(ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
        user = str((body.get("user") or {}).get("id", ""))
        binding = _binding(view.get("private_metadata"))
        if binding is None:
            await ack(response_action="errors", errors={REASON_BLOCK: "This form is not valid."})
            return
        try:
            reviewer_groups = await d.reviewer_groups(user)
        except ReviewerLookupError:
            await ack(response_action="errors", errors={REASON_BLOCK: _plain(LOOKUP_FAILED)})
            return
        try:
            result = await d.decide(
                binding,
                user,
                "reject",
                reviewer_groups,
                f"view:{view.get('id', '')}",
                reason=p.view_value(view, REASON_BLOCK, REASON_ACTION),
            )
        except ThreadNotFound:
            await ack(response_action="errors", errors={REASON_BLOCK: "This form is not valid."})
            return
        if isinstance(result, Refused):
            error = _plain(f"Nothing changed: {result.reason}.")
            await ack(response_action="errors", errors={REASON_BLOCK: error})
            return
        await ack()  # closes the modal
        d.wake(result.thread_id)

    # --- the status line --------------------------------------------------------------

    @app.action(CANCEL_ACTION)
    async def on_cancel(
        ack: Any, body: dict[str, Any], action: dict[str, Any], client: AsyncWebClient
    ) -> None:
        clicked = p.click(body, action)
        thread_id = clicked.value.strip()
        dedupe_key = f"click:{clicked.action_ts}"
        try:
            if not thread_id:
                raise ThreadNotFound("no thread id on the button")
            seen = await d.store.find_by_dedupe_key(thread_id, dedupe_key)
            if seen is not None:  # a redelivered click
                await ack()
                d.wake(thread_id)
                return
            user_groups = await d.reviewer_groups(clicked.user)
            result = await cancel(
                d.store,
                thread_id,
                by=clicked.user,
                policy=d.approvers,
                user_groups=user_groups,
                dedupe_key=dedupe_key,
            )
        except ThreadNotFound:
            await ack()
            d.notify(client, clicked, INVALID_BUTTON)
            return
        except ReviewerLookupError:
            await ack()
            d.notify(client, clicked, LOOKUP_FAILED)
            return
        await ack()
        _answered(d, client, clicked, result)

    # --- /opsloop ---------------------------------------------------------------------

    @app.command(re.compile(r"^/"))
    async def on_command(ack: Any, command: dict[str, Any]) -> None:
        name = str(command.get("command") or "/opsloop")
        words = str(command.get("text") or "").split()
        sub = words[0].lower() if words else "help"
        url = p.workspace_url(command.get("team_domain")) or d.identity.url
        if sub == "pending":
            text = home.pending_text(await _pending_rows(d, str(command.get("user_id")), url))
        elif sub == "status":
            text = home.status_text(await _status_rows(d, str(command.get("channel_id")), url))
        elif sub == "help":
            text = home.help_text(name)
        else:
            text = f"I don't know `{escape(sub)}`.\n" + home.help_text(name)
        await ack(text=text, response_type="ephemeral")

    # --- everything else: a deliberate 200 --------------------------------------------

    @app.event(re.compile(".*"))
    async def on_other_event(ack: Any) -> None:
        await ack()

    @app.action(re.compile(".*"))
    async def on_other_action(ack: Any) -> None:
        await ack()

    @app.view(re.compile(".*"))
    async def on_other_view(ack: Any) -> None:
        await ack()

    @app.view_closed(re.compile(".*"))
    async def on_view_closed(ack: Any) -> None:
        await ack()


# --- what the listeners do ----------------------------------------------------------------


async def _store_message(
    d: _Deps, body: dict[str, Any], bot_user_id: str | None, *, start: bool = True
) -> None:
    """A person's message as a ``user_message`` (or the answer to an open question).
    ``start``: a message outside any thread of ours starts one; else it is ignored."""
    event = body.get("event") or {}
    try:
        done = await post_user_message(
            d.store,
            p.thread_key(body),
            text=p.mention_text(event.get("text"), bot_user_id),
            user=str(event["user"]),
            dedupe_key=p.message_dedupe_key(event),
            source=p.message_source(body),
            start=start,
        )
    except ThreadNotFound:
        return  # a reply in a thread that is not ours
    d.wake(done.thread_id)


def _answered(
    d: _Deps, client: AsyncWebClient, clicked: p.Click, result: Accepted | Refused
) -> None:
    if isinstance(result, Accepted):
        d.wake(result.thread_id)
    else:
        d.notify(client, clicked, _refusal_text(result.reason))


def _binding(value: Any) -> Binding | None:
    try:
        return parse_binding(value if isinstance(value, str) else None)
    except ValueError:
        return None


def _refusal_text(reason: str) -> str:
    """``Nothing changed: already approved by <@U1> at 12:03 UTC.`` (mrkdwn, escaped)."""
    text = _BY_USER.sub(lambda m: f"by {mention(m.group(1))}", escape(reason.rstrip(".")))
    return f"Nothing changed: {text}."


def _plain(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _row(info: ThreadInfo, url: str | None, tool: str | None = None) -> home.ThreadRow:
    return home.ThreadRow(
        thread_id=info.id,
        channel=info.channel,
        root_ts=info.root_ts,
        status=info.status,
        requester=info.requester,
        updated_at=info.updated_at,
        link=p.permalink(url, info.channel, info.root_ts),
        tool=tool,
    )


async def _pending_rows(d: _Deps, user: str, url: str | None) -> list[home.ThreadRow]:
    """Calls awaiting approval that ``user`` may approve, newest first."""
    try:
        user_groups = await d.reviewer_groups(user)
    except ReviewerLookupError:
        user_groups = frozenset()
    waiting = await d.store.list_threads(status="awaiting_approval", limit=LIST_LIMIT)
    mine = [
        info
        for info in waiting
        if d.approvers.check("approve", user, info.requester, user_groups) is None
    ]
    rows = []
    for i, info in enumerate(mine):
        tool = None
        if i < home.MAX_LINES:  # the lines shown name their tool
            state = await d.store.load(info.id)
            tool = state.pending.intent if state.pending else None
        rows.append(_row(info, url, tool))
    return rows


async def _status_rows(d: _Deps, channel: str, url: str | None) -> list[home.ThreadRow]:
    threads = await d.store.list_threads(limit=LIST_LIMIT)
    return [_row(t, url) for t in threads if t.channel == channel and t.status in ACTIVE]


async def _publish_home(d: _Deps, client: AsyncWebClient, user: str) -> None:
    url = d.identity.url
    pending = await _pending_rows(d, user, url)
    threads = await d.store.list_threads(limit=LIST_LIMIT)
    recent = [_row(t, url) for t in threads if t.requester == user][:RECENT]
    await client.views_publish(user_id=user, view=home.home_view(user, pending, recent))
