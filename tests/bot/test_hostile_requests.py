"""What a sender can throw at ``POST /slack/events``: never a 500, never a traceback.

One table of requests, each sent over HTTP to the real Bolt app (``bot.app``): unsigned
bodies are refused before anything is parsed, signed but malformed ones get a 4xx (or a
200 that ignores them, where Slack would retry a 4xx for nothing), and nothing is stored.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
from multidict import CIMultiDict

from bot.app import MAX_BODY
from bot.render.approval import APPROVE_ACTION
from engine.store import Store
from tests.bot.test_app import (
    ANN,
    CHANNEL,
    ROOT,
    awaiting_approval,
    button,
    mention,
    served,
    submission,
    thread_at,
    types_of,
)
from tests.fakes import slack as fake
from tests.fakes.slack import SIGNING_SECRET, FakeSlack

DEEP = 100_000


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as s:
        yield s


def form(**fields: str) -> bytes:
    return urlencode(fields).encode()


def event_with(**changes: Any) -> dict[str, Any]:
    """A mention whose ``event`` has ``changes`` (None: the field removed)."""
    payload = mention()
    for name, value in changes.items():
        if value is None:
            payload["event"].pop(name, None)
        else:
            payload["event"][name] = value
    return payload


def click_with(**changes: Any) -> dict[str, Any]:
    payload = button(ANN, APPROVE_ACTION, "x")
    payload.update(changes)
    return payload


def envelope_with(**changes: Any) -> dict[str, Any]:
    payload = mention()
    payload.update(changes)
    return payload


def as_json(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def as_form(payload: Any) -> bytes:
    return form(payload=json.dumps(payload))


@dataclass(frozen=True)
class Case:
    body: bytes
    content_type: str = "application/json"
    signed: bool = True
    expect: tuple[int, ...] = (400,)
    headers: tuple[tuple[str, str], ...] = ()


FORM = "application/x-www-form-urlencoded"
VIEW = submission("x", "r")["view"]
TWO_STAMPS = ("X-Slack-Request-Timestamp", "abc")  # added after the signed one
TWO_SIGNATURES = ("X-Slack-Signature", "v0=00")
IGNORED = (200,)
STEP_EDIT: dict[str, Any] = {"type": "workflow_step_edit", "callback_id": "copy_review"}
STEP_SAVE: dict[str, Any] = {
    "type": "view_submission",
    "view": {"type": "workflow_step", "callback_id": "copy_review"},
}
STEP_EXECUTE: dict[str, Any] = {
    "type": "event_callback",
    "event": {"type": "workflow_step_execute"},
}
STEP = {"workflow_id": "12345", "step_id": "111-222-333-444-555"}

CASES: dict[str, Case] = {
    # Unsigned: refused before parsing, however deep.
    "unsigned deep json": Case(b"[" * DEEP + b"]" * DEEP, signed=False, expect=(401,)),
    "unsigned deep payload": Case(
        form(payload="[" * DEEP + "]" * DEEP), FORM, signed=False, expect=(401,)
    ),
    "unsigned deep object": Case(b'{"a":' * DEEP + b"1" + b"}" * DEEP, signed=False, expect=(401,)),
    # Signed, but not an object Bolt can read.
    "deep json": Case(b'{"a":' * DEEP + b"1" + b"}" * DEEP),
    "deep payload": Case(form(payload="[" * DEEP + "]" * DEEP), FORM),
    "a list": Case(b"[1,2,3]"),
    "null": Case(b"null"),
    "payload is a string": Case(form(payload='"x"'), FORM),
    "payload is a list": Case(form(payload="[1]"), FORM),
    "payload not json": Case(form(payload="{nope"), FORM),
    "not utf-8": Case(b'{"type": "\xff"}'),
    # Signed envelopes with fields of the wrong type.
    "event is a string": Case(as_json(envelope_with(event="x"))),
    "event is a list": Case(as_json(envelope_with(event=[1]))),
    "event type is a number": Case(as_json(event_with(type=5))),
    "team is a list": Case(as_json(envelope_with(team_id=[1]))),
    "authorizations is a string": Case(as_json(envelope_with(authorizations="x"))),
    "text is a number": Case(as_json(event_with(text=5)), expect=IGNORED),
    "user is a number": Case(as_json(event_with(user=5))),  # Bolt itself would raise
    "user is an object": Case(as_json(event_with(user={"id": ANN})), expect=IGNORED),
    "no channel": Case(as_json(event_with(channel=None)), expect=IGNORED),
    "no ts": Case(as_json(event_with(ts=None)), expect=IGNORED),
    "channel too long": Case(as_json(event_with(channel="C" * 200)), expect=IGNORED),
    "ts not a ts": Case(as_json(event_with(ts="1" * 100)), expect=IGNORED),
    "team too long": Case(as_json(envelope_with(team_id="T" * 200)), expect=IGNORED),
    "user too long": Case(as_json(event_with(user="U" * 200)), expect=IGNORED),
    # Interactions.
    "actions empty": Case(as_form(click_with(actions=[])), FORM),
    "actions a string": Case(as_form(click_with(actions="x")), FORM),
    "action not an object": Case(as_form(click_with(actions=["x"])), FORM),
    "container a string": Case(as_form(click_with(container="x")), FORM),
    "user of a click a number": Case(as_form(click_with(user=5)), FORM),
    "channel of a click a list": Case(as_form(click_with(channel=[1])), FORM),
    "state values a string": Case(
        as_form({**submission("x", "r"), "view": {**VIEW, "state": {"values": "x"}}}),
        FORM,
    ),
    "view a string": Case(as_form({**submission("x", "r"), "view": "x"}), FORM),
    "response_urls a string": Case(
        as_form({**submission("x", "r"), "response_urls": "x"}), FORM
    ),
    # Legacy Steps from Apps bodies, as bolt-python's own tests send them
    # (tests/slack_bolt_async/logger/test_unmatched_suggestions.py, test_step): Bolt reads
    # body["workflow_step"] of an edit or save (and body["view"]["type"] of any
    # submission) for every middleware, present or not.
    "step edit without its step": Case(as_form(STEP_EDIT), FORM),
    "step save without its step": Case(as_form(STEP_SAVE), FORM),
    "step execute without its step": Case(as_json(STEP_EXECUTE), expect=IGNORED),
    "submission view without a type": Case(
        as_form({**submission("x", "r"), "view": {k: v for k, v in VIEW.items() if k != "type"}}),
        FORM,
    ),
    "step edit with its step": Case(
        as_form({**STEP_EDIT, "workflow_step": STEP}), FORM, expect=IGNORED
    ),
    "step save with its step": Case(
        as_form({**STEP_SAVE, "workflow_step": STEP}), FORM, expect=IGNORED
    ),
    "step execute with its step": Case(
        as_json({**STEP_EXECUTE, "event": {**STEP_EXECUTE["event"], "workflow_step": STEP}}),
        expect=IGNORED,
    ),
    # Headers.
    "two timestamps": Case(as_json(mention()), expect=(400, 401), headers=(TWO_STAMPS,)),
    "two signatures": Case(as_json(mention()), expect=(400, 401), headers=(TWO_SIGNATURES,)),
}  # fmt: skip


def signed_headers(case: Case) -> CIMultiDict[str]:
    headers: CIMultiDict[str] = CIMultiDict({"Content-Type": case.content_type})
    if case.signed:
        headers.update(fake.sign(SIGNING_SECRET, case.body, int(time.time())))
    for name, value in case.headers:
        headers.add(name, value)
    return headers


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.exc_info or r.levelno >= logging.ERROR
    ]


@pytest.mark.parametrize("name", list(CASES))
async def test_hostile_requests_get_no_500_and_store_nothing(
    store: Store, slack: FakeSlack, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    case = CASES[name]
    caplog.set_level(logging.INFO)
    async with served(store, slack) as s:
        resp = await s.http.post("/slack/events", data=case.body, headers=signed_headers(case))
        status = resp.status
    assert status in case.expect, (status, await resp.text())
    assert await store.list_threads() == []
    assert s.kicks == []
    assert no_tracebacks(caplog) == []


async def test_a_body_over_the_limit_is_413(store: Store, slack: FakeSlack) -> None:
    body = as_json({**mention(), "padding": "x" * MAX_BODY})
    async with served(store, slack) as s:
        headers = {**fake.sign(SIGNING_SECRET, body, int(time.time()))}
        resp = await s.http.post("/slack/events", data=io.BytesIO(body), headers=headers)
    assert resp.status == 413
    assert await store.list_threads() == []


async def test_a_lone_surrogate_in_text_is_stored_replaced(
    store: Store, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON may carry ``\\ud800``; neither PostgreSQL nor a UTF-8 encoder takes it."""
    body = as_json(mention()).replace(b"deploy api", b"deploy \\ud800 api")
    async with served(store, slack) as s:
        headers = {**fake.sign(SIGNING_SECRET, body, int(time.time()))}
        headers["Content-Type"] = "application/json"
        resp = await s.http.post("/slack/events", data=body, headers=headers)
    assert resp.status == 200
    thread_id = await thread_at(store)
    assert thread_id is not None
    [message] = await store.select_events(thread_id)
    assert message.text == "deploy \ufffd api to staging"  # type: ignore[union-attr]
    assert no_tracebacks(caplog) == []


Mangle = Callable[[dict[str, Any]], dict[str, Any]]


async def test_two_mentions_without_ts_do_not_share_a_thread(
    store: Store, slack: FakeSlack
) -> None:
    """Without a ts both would get the key ``msg:C…:`` and the second would vanish."""
    async with served(store, slack) as s:
        for text in ("first", "second"):
            assert (await s.send(event_with(ts=None, text=f"<@U0FAKEBOT1> {text}")))[0] == 200
        assert (await s.send(mention()))[0] == 200  # a whole one still counts
    assert [t.channel for t in await store.list_threads()] == [CHANNEL]
    thread_id = await thread_at(store, ROOT)
    assert thread_id is not None
    assert await types_of(store, thread_id) == ["user_message"]


async def test_a_malformed_click_on_a_real_card_changes_nothing(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await awaiting_approval(store)
    before = await types_of(store, thread_id)
    async with served(store, slack) as s:
        click = button(ANN, APPROVE_ACTION, value)
        for bad in ({"container": "x"}, {"user": {"id": 5}}, {"channel": "x" * 500}):
            status, _ = await s.send({**click, **bad})
            assert status in (200, 400)
    assert await types_of(store, thread_id) == before
