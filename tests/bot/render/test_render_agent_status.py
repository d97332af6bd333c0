"""The loading status under a thread and its agent session, read from the log."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot import mrkdwn as md
from bot.render.agent_status import (
    LOADING_MESSAGES,
    MAX_STATUS,
    loading_status,
    session_status,
    session_title,
)
from bot.render.plan import runs
from engine import events as ev
from tests.bot.render.plan_support import EVIL, NOW, REQUESTER, REVIEWER, Log


def wait(log: Log) -> Log:
    return log.add(
        ev.WaitStarted(
            tool_call_id="toolu_1",
            wait_id="w1",
            description="deploy job",
            wake_at=NOW + timedelta(hours=1),
            timeout_at=NOW + timedelta(hours=2),
        )
    )


# (name, the log, its loading status, its session status)
CASES = [
    ("new message", lambda: Log().ask(), "is thinking…", "processing"),
    (
        "model deciding",
        lambda: Log().ask().add(ev.ModelDecision(text="hm")),
        "is thinking…",
        "processing",
    ),
    (
        "call ready",
        lambda: Log().ask().call(),
        "is running check health (service: api)…",
        "processing",
    ),
    (
        "call started",
        lambda: Log().ask().call().start(),
        "is running check health (service: api)…",
        "processing",
    ),
    ("call done", lambda: Log().ask().run_tool(), "is thinking…", "processing"),
    ("awaiting approval", lambda: Log().ask().card(), None, "suspended"),
    (
        "approved",
        lambda: Log().ask().card().approve(),
        "is running check health (service: api)…",
        "processing",
    ),
    (
        "awaiting reply",
        lambda: (
            Log()
            .ask()
            .add(
                ev.ModelDecision(tool_name="request_clarification", tool_call_id="q1"),
                ev.ClarificationRequested(tool_call_id="q1", question="which one?"),
            )
        ),
        None,
        "suspended",
    ),
    (
        "awaiting job",
        lambda: wait(Log().ask().call(policy="wait_for_external_event").start()),
        None,
        "suspended",
    ),
    (
        "awaiting reconcile",
        lambda: (
            Log()
            .ask()
            .call(idempotent=False)
            .start()
            .add(ev.ToolOutcomeUnknown(tool_call_id="toolu_1", attempt=1))
        ),
        None,
        "suspended",
    ),
    (
        "sleeping on a tool retry",
        lambda: (
            Log()
            .ask()
            .call()
            .start()
            .add(
                ev.RetryScheduled(
                    tool_call_id="toolu_1", attempt=1, error="x", wake_at=NOW + timedelta(minutes=5)
                )
            )
        ),
        None,
        "suspended",
    ),
    (
        "sleeping on a model retry",
        lambda: (
            Log()
            .ask()
            .add(
                ev.RetryScheduled(attempt=1, error="overloaded", wake_at=NOW + timedelta(minutes=5))
            )
        ),
        None,
        "suspended",
    ),
    ("answered", lambda: Log().ask().answer(), None, "active"),
    ("failed", lambda: Log().ask().add(ev.ErrorRaised(message="boom")), None, "closed"),
    ("cancelled", lambda: Log().ask().add(ev.ThreadCancelled(actor=REQUESTER)), None, "closed"),
    ("stopped", lambda: Log().ask().call().stop(), None, "active"),
    (
        "stopping while a tool runs",
        lambda: Log().ask().call().start().stop(REVIEWER),
        "is stopping…",
        "processing",
    ),
    (
        "stopped once the tool ended",
        lambda: Log().ask().call().start().stop().result(),
        None,
        "active",
    ),
]


@pytest.mark.parametrize(
    ("build", "loading", "session"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_loading_and_session_status_follow_the_log(build, loading, session) -> None:
    log = build()
    assert loading_status(log.state, log.events) == loading
    assert session_status(log.state) == session


def test_a_new_thread_is_processing_and_shows_no_status() -> None:
    log = Log()
    assert loading_status(log.state, log.events) is None
    assert session_status(log.state) == "processing"
    assert session_title(log.events) == "New request"


def test_a_hostile_call_is_escaped_and_short_in_the_loading_status() -> None:
    for intent, args in ((EVIL, {"q": EVIL}), ("x" * 500, {"k": "<&>" * 1000})):
        log = Log().ask().call(intent=intent, arguments=args).start()
        status = loading_status(log.state, log.events)
        assert status is not None and status.startswith("is running ")
        assert md.slack_len(status) <= MAX_STATUS
        rest = status.replace("&lt;", "").replace("&gt;", "").replace("&amp;", "")
        assert "<" not in rest and ">" not in rest and "&" not in rest, status
        assert "@here" not in status and "](" not in status


def test_an_acronym_keeps_its_capitals() -> None:
    log = Log().ask().call(intent="API_status", arguments={}).start()
    assert loading_status(log.state, log.events) == "is running API status…"
    log = Log().ask().call(intent="get_API_key", arguments={}).start()
    assert loading_status(log.state, log.events) == "is running get API key…"


def test_loading_messages_are_few_and_short() -> None:
    assert 0 < len(LOADING_MESSAGES) <= 10
    assert all(0 < len(m) <= 50 and m.endswith("…") for m in LOADING_MESSAGES)


def test_the_session_title_is_the_first_request_in_a_few_words() -> None:
    log = Log().ask(f"<@U0BOT0001> why is checkout slow today? {EVIL}", source={"kind": "slack"})
    log.answer().ask("and now?")
    title = session_title(log.events, bot_user_id="U0BOT0001")
    assert (
        title == "why is checkout slow today?" == runs(log.events, bot_user_id="U0BOT0001")[0].title
    )
    hostile = session_title(Log().ask(EVIL).events)
    assert hostile.startswith("&lt;!channel&gt;") and "<" not in hostile
