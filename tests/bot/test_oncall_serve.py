"""A real ``opsloop serve`` with ``integrations.pagerduty``: the model asks to acknowledge
an incident, a rule makes whoever is on call its approver, the card names who is on
call, the schedule hands over, and only the new on-call's click runs the tool."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.render.approval import APPROVE_ACTION
from tests.bot.test_cli import _free_port
from tests.bot.test_serve_crash import _send, _wait_call, _wait_healthy, _wait_shown, serve
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.pagerduty import FROM_EMAIL, TOKEN, FakePagerDuty
from tests.fakes.slack import BOT_USER_ID, FakeSlack, app_mention_event

pytestmark = pytest.mark.slow

ALICE, BOB, REQUESTER = "U0ALICE001", "U0BOB00001", "U0ANN00001"
CHANNEL, ROOT = "C0INCIDENT", "1700000600.000100"
INCIDENT = "Q0INCIDENT1"


class Fakes:
    """Claude, Slack and PagerDuty on a loop of their own, for a test blocking on a
    process; ``run(fn)`` changes a fake on that loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.claude, self.slack, self.pd = FakeAnthropic(), FakeSlack(), FakePagerDuty()

    def run(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)


@contextmanager
def fakes_in_a_thread() -> Iterator[Fakes]:
    fakes = Fakes()
    thread = threading.Thread(target=fakes.loop.run_forever, daemon=True)
    thread.start()
    started = (fakes.claude, fakes.slack, fakes.pd)
    for fake in started:
        asyncio.run_coroutine_threadsafe(fake.__aenter__(), fakes.loop).result(10)
    try:
        yield fakes
    finally:
        for fake in started:
            asyncio.run_coroutine_threadsafe(fake.__aexit__(None, None, None), fakes.loop).result(
                10
            )
        fakes.loop.call_soon_threadsafe(fakes.loop.stop)
        thread.join(10)
        fakes.loop.close()


def config_file(path: Path, pd_url: str) -> Path:
    path.write_text(
        "integrations:\n"
        "  pagerduty:\n"
        "    token: ${PAGERDUTY_TOKEN}\n"
        f"    api_url: {pd_url}\n"
        f"    from_email: {FROM_EMAIL}\n"
        "policy:\n"
        "  - tool: pagerduty_acknowledge\n"
        "    policy: approve_before_run\n"
        "    approvers: [oncall:PSCHED01]\n"
    )
    return path


def test_an_on_call_hand_over_between_posting_and_clicking_is_honoured(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    with fakes_in_a_thread() as f:
        for user, name in ((ALICE, "alice"), (BOB, "bob")):
            f.slack.add_user(user, name)["profile"]["email"] = f"{name}@acme.example"
        f.pd.add_user("PALICE1", "Alice", "alice@acme.example")
        f.pd.add_user("PBOB0001", "Bob", "bob@acme.example")
        f.pd.add_user("PBOT0001", "Ops bot", FROM_EMAIL)
        f.pd.put_on_call(["PALICE1"], schedule="PSCHED01")
        f.pd.add_incident(INCIDENT, "API 5xx above 2%")
        f.claude.tool_use("pagerduty_acknowledge", {"incident_id": INCIDENT}, text="On it.")
        f.claude.text("Acknowledged the incident.")
        text = f"<@{BOT_USER_ID}> ack the API incident"
        f.slack.add_message(CHANNEL, text, user=REQUESTER, ts=ROOT)

        port = _free_port()
        proc = serve(
            db,
            f.claude.url,
            f.slack.url,
            None,
            port=port,
            OPSLOOP_CONFIG=str(config_file(tmp_path / "opsloop.yaml", f.pd.url)),
            PAGERDUTY_TOKEN=TOKEN,
        )
        try:
            _wait_healthy(proc, port)
            mention = app_mention_event(user=REQUESTER, text=text, channel=CHANNEL, ts=ROOT)
            assert _send(port, mention) == 200
            card = _wait_call(f.slack, proc, lambda c: APPROVE_ACTION in str(c.params))
            assert f"On call now: PSCHED01: <@{ALICE}>" in str(card.params["blocks"])

            f.run(lambda: f.pd.put_on_call(["PBOB0001"], schedule="PSCHED01"))  # hand-over
            late = f.slack.click_on(card, APPROVE_ACTION, user=ALICE, thread_ts=ROOT)
            assert _send(port, late) == 200
            refused = _wait_call(
                f.slack, proc, lambda c: c.method == "chat.postEphemeral" and ALICE in str(c.params)
            )
            assert "nor on call for it now" in str(refused.params)
            assert f.pd.incidents[INCIDENT].status == "triggered"

            click = f.slack.click_on(card, APPROVE_ACTION, user=BOB, thread_ts=ROOT)
            assert _send(port, click) == 200
            _wait_shown(f.slack, proc, "Acknowledged the incident.")
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        f.claude.assert_clean()
        assert f.pd.incidents[INCIDENT].status == "acknowledged"
        [put] = f.pd.calls_to("PUT", "/incidents/{id}")
        assert put.headers["From"] == FROM_EMAIL
    assert "Traceback" not in err and TOKEN not in err
