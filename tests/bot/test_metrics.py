"""GET /metrics and the counts behind it: a real ``opsloop serve`` through one approved
thread, then the runner's and the Slack client's counters in process."""

from __future__ import annotations

import json
import logging
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from anthropic import AsyncAnthropic
from prometheus_client.parser import text_string_to_metric_families
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.web.async_client import AsyncWebClient

from bot.health import make_health_app
from bot.render.approval import APPROVE_ACTION
from bot.slack_metrics import error_of, instrument, method_of
from engine import metrics
from engine.context import Prompt
from engine.inputs import post_user_message
from engine.logs import bound
from engine.models.anthropic import AnthropicModel
from engine.models.base import ModelError
from engine.models.scripted import ScriptedModel, call, say
from engine.runner import Runner, RunnerConfig
from engine.store import Store, ThreadKey, open_store, store_for
from tests.bot.test_cli import SECRETS, _free_port, fakes_in_a_thread
from tests.bot.test_serve_crash import _send, _wait_call, _wait_healthy, _wait_shown, serve
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic
from tests.fakes.slack import BOT_USER_ID, TOKEN, FakeSlack, app_mention_event
from tests.support.demo_tools import make_tools
from tests.support.fakes import FakeClock

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> tuple[str, Samples]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        kind, text = resp.headers["Content-Type"], resp.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return kind, samples


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


@pytest.mark.slow
def test_metrics_of_a_real_serve_after_one_approved_thread(tmp_path: Path) -> None:
    """Mention → card → Approve → the ticket is filed → the answer; one 429 on the way.
    The scrape counts exactly that, and the JSON log lines name the thread, no secret."""
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    tickets = f"sqlite:///{tmp_path / 'tickets.db'}"
    channel, root = "C0METRICS", "1700000600.000100"
    with fakes_in_a_thread() as (claude, slack):
        claude.tool_use("create_ticket", {"title": "Flaky deploys"}, text="Filing it.")
        claude.text("Filed the ticket.")
        text = f"<@{BOT_USER_ID}> file a ticket"
        slack.add_message(channel, text, user="U_ALICE", ts=root)
        slack.rate_limit("chat.postMessage", times=1, retry_after=1)  # waited out inline

        port = _free_port()
        proc = serve(
            db,
            claude.url,
            slack.url,
            None,
            port=port,
            OPSLOOP_TICKETS_URL=tickets,
            OPSLOOP_LOG_FORMAT="json",
        )
        try:
            _wait_healthy(proc, port)
            mention = app_mention_event(user="U_ALICE", text=text, channel=channel, ts=root)
            assert _send(port, mention) == 200
            card = _wait_call(slack, proc, lambda c: APPROVE_ACTION in str(c.params))
            click = slack.click_on(card, APPROVE_ACTION, user="U_BOB", thread_ts=root)
            assert _send(port, click) == 200
            _wait_shown(slack, proc, "Filed the ticket.")
            _wait_call(
                slack, proc, lambda c: c.method == "chat.update" and "U_BOB" in str(c.params)
            )
            kind, samples = _settled_scrape(port, proc, slack)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        claude.assert_clean()

    assert kind.startswith("text/plain; version=0.0.4")
    # The runner: two model steps around one tool step; two model calls, their tokens.
    assert total(samples, "opsloop_steps_total", action="ask_model") == 2
    assert total(samples, "opsloop_steps_total", action="execute_tool") == 1
    assert total(samples, "opsloop_model_calls_total", outcome="ok") == 2
    assert total(samples, "opsloop_model_calls_total", outcome="error") == 0
    assert total(samples, "opsloop_model_call_seconds_count") == 2
    assert total(samples, "opsloop_model_tokens_total", kind="input") > 0
    assert total(samples, "opsloop_model_tokens_total", kind="output") > 0
    assert total(samples, "opsloop_model_errors_total") == 0
    # The tool: one call, and it worked.
    assert total(samples, "opsloop_tool_calls_total", tool="create_ticket") == 1
    assert total(samples, "opsloop_tool_calls_total", tool="create_ticket", outcome="ok") == 1
    assert total(samples, "opsloop_tool_call_seconds_count", tool="create_ticket") == 1
    # The database's view at the scrape.
    assert total(samples, "opsloop_threads", status="idle") == 1
    assert total(samples, "opsloop_threads") == 1
    assert total(samples, "opsloop_threads", status="awaiting_approval") == 0  # shown at 0
    assert total(samples, "opsloop_approvals_pending") == 0
    assert total(samples, "opsloop_approval_oldest_age_seconds") == 0
    # Slack: every call counted, the one 429 among them; two requests answered.
    assert total(samples, "opsloop_slack_api_calls_total", method="chat.update") >= 1
    assert total(samples, "opsloop_slack_api_ratelimited_total", method="chat.postMessage") == 1
    assert total(samples, "opsloop_slack_api_ratelimited_total") == 1
    assert total(samples, "opsloop_slack_ack_seconds_count") == 2
    assert total(samples, "opsloop_lease_takeovers_total", reason="dead_owner") == 0
    assert not [k for k in samples if "thread_id" in dict(k[1]) or "user" in dict(k[1])]

    lines = [json.loads(line) for line in err.splitlines() if line.strip()]  # all JSON
    assert lines and all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    assert any(
        line.get("thread_id") for line in lines if line["logger"] == "opsloop.models.anthropic"
    )
    for secret in SECRETS.values():
        assert secret not in err


@pytest.mark.slow
@pytest.mark.parametrize("own_port", [True, False], ids=["OPSLOOP_METRICS_PORT", "unset"])
def test_metrics_on_their_own_port_are_not_on_the_main_one(tmp_path: Path, own_port: bool) -> None:
    """With OPSLOOP_METRICS_PORT a proxy in front of PORT cannot expose /metrics: the main
    port answers 404 there and the metrics port serves the scrape (and nothing else)."""
    port = _free_port()
    metrics_port = next(p for p in iter(_free_port, None) if p != port)
    extra = {"OPSLOOP_METRICS_PORT": str(metrics_port)} if own_port else {}
    with fakes_in_a_thread() as (claude, slack):
        proc = serve(
            f"sqlite:///{tmp_path / 'serve.db'}", claude.url, slack.url, None, port=port, **extra
        )
        try:
            _wait_healthy(proc, port)
            if own_port:
                assert _status(port, "/metrics") == 404
                kind, samples = scrape(metrics_port)
                assert _status(metrics_port, "/healthz") == 404
            else:
                kind, samples = scrape(port)  # 200 on the main port, as before
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    assert kind.startswith("text/plain; version=0.0.4")
    assert total(samples, "opsloop_threads") == 0  # read from the database: the full scrape
    assert ("opsloop_threads", frozenset({("status", "running")})) in samples


def _settled_scrape(port: int, proc, slack: FakeSlack, within: float = 30) -> tuple[str, Samples]:
    """A scrape once the thread is idle and every post the fake got is counted (the
    pass at rest may still be updating the card when the answer shows)."""
    deadline = time.monotonic() + within
    while True:
        kind, samples = scrape(port)
        posts = len(slack.calls_to("chat.postMessage"))
        counted = total(samples, "opsloop_slack_api_calls_total", method="chat.postMessage")
        if total(samples, "opsloop_threads", status="idle") == 1 and counted == posts:
            return kind, samples
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"never settled: {posts} posts, {counted} counted"
        time.sleep(0.1)


# --- in process -----------------------------------------------------------------------


def _opsloop_samples() -> dict[tuple[str, frozenset], float]:
    found = {}
    for family in metrics.REGISTRY.collect():
        for s in family.samples:
            if s.name.startswith("opsloop_"):
                found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def _since(before: dict) -> Counter:
    after = _opsloop_samples()
    return Counter({k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)})


def _sum(changes: Counter, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in changes.items() if n == name and wanted <= ls)


class _Fields(logging.Handler):
    """Keeps, for each record, the fields bound where it was logged."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, dict[str, str]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), dict(bound())))


async def test_the_runner_counts_steps_model_and_tool_calls_and_binds_its_log_fields(
    store: Store,
) -> None:
    effects: Counter = Counter()
    model = ScriptedModel([call("lookup", name="db"), call("broken", name="x"), say("done")])
    key = ThreadKey("T1", "C1", "1700000000.000100")
    tid = (await post_user_message(store, key, text="go", user="U_A", dedupe_key="m1")).thread_id
    fields = _Fields()
    runner_log = logging.getLogger("opsloop.runner")
    runner_log.addHandler(fields)
    before = _opsloop_samples()
    try:
        state = await Runner(store, model, make_tools(effects)).run(tid)
    finally:
        runner_log.removeHandler(fields)
    changes = _since(before)
    assert state is not None and state.status == "idle"
    assert _sum(changes, "opsloop_steps_total", action="ask_model") == 3
    assert _sum(changes, "opsloop_steps_total", action="execute_tool") == 0  # run with the decision
    assert _sum(changes, "opsloop_model_calls_total", model="scripted", outcome="ok") == 3
    assert _sum(changes, "opsloop_tool_calls_total", tool="lookup", outcome="ok") == 1
    assert _sum(changes, "opsloop_tool_calls_total", tool="broken", outcome="error") == 1
    assert _sum(changes, "opsloop_tool_call_seconds_count", tool="lookup") == 1
    failed = [f for msg, f in fields.seen if msg.startswith("tool failed")]
    assert failed and failed[0]["thread_id"] == tid and failed[0]["tool_call_id"]


async def test_a_run_after_an_approval_expired_observes_its_wake_lag(store: Store) -> None:
    clock = FakeClock()
    model = ScriptedModel([call("deploy", name="api"), say("nobody approved")])
    runner = Runner(
        store, model, make_tools(Counter()), RunnerConfig(approval_ttl_s=60), clock=clock
    )
    key = ThreadKey("T1", "C1", "1700000000.000200")
    tid = (await post_user_message(store, key, text="go", user="U_A", dedupe_key="m1")).thread_id
    assert (await runner.run(tid)).status == "awaiting_approval"
    counts, oldest = await store.status_counts()
    assert counts == {"awaiting_approval": 1} and oldest == clock()
    before = _opsloop_samples()
    clock.advance(63)  # due at 60 s: three seconds late
    assert (await runner.run(tid)).status == "idle"
    changes = _since(before)
    assert _sum(changes, "opsloop_wake_lag_seconds_count") == 1
    assert _sum(changes, "opsloop_wake_lag_seconds_sum") == pytest.approx(3.0)
    assert _sum(changes, "opsloop_steps_total", action="expire_approval") == 1


def test_slack_method_and_error_labels_stay_bounded() -> None:
    assert method_of("https://slack.com/api/chat.postMessage") == "chat.postMessage"
    assert method_of("http://127.0.0.1:9/api/conversations.replies?x=1") == "conversations.replies"
    assert method_of("https://proxy/api/U0123/whatever-it-is") == "other"
    ok = HttpResponse(status_code=200, headers={}, body={"ok": True})
    said_no = HttpResponse(
        status_code=200, headers={}, body={"ok": False, "error": "not_in_channel"}
    )
    odd = HttpResponse(status_code=200, headers={}, body={"ok": False, "error": "Weird Thing!"})
    down = HttpResponse(status_code=503, headers={}, body=None)
    assert error_of(ok, None) is None
    assert error_of(said_no, None) == "not_in_channel"
    assert error_of(odd, None) == "other"
    assert error_of(down, None) == "http_503"
    assert error_of(None, OSError("refused")) == "connection"


async def test_an_instrumented_client_counts_calls_errors_and_429s_by_method() -> None:
    async with FakeSlack() as slack:
        client = instrument(AsyncWebClient(token=TOKEN, base_url=slack.url))
        assert instrument(client) is client and len(client.retry_handlers) == 2  # once
        slack.fail("chat.update", "message_not_found")
        slack.rate_limit("chat.postMessage", times=1)
        before = _opsloop_samples()
        await client.auth_test()
        with pytest.raises(SlackApiError):
            await client.chat_update(channel="C1", ts="1.0", text="x")
        with pytest.raises(SlackApiError):
            await client.chat_postMessage(channel="C1", text="x")
        changes = _since(before)
    assert _sum(changes, "opsloop_slack_api_calls_total", method="auth.test") == 1
    assert _sum(changes, "opsloop_slack_api_calls_total", method="chat.update") == 1
    assert _sum(changes, "opsloop_slack_api_errors_total", method="chat.update") == 1
    assert (
        _sum(
            changes,
            "opsloop_slack_api_errors_total",
            method="chat.update",
            error="message_not_found",
        )
        == 1
    )
    assert _sum(changes, "opsloop_slack_api_ratelimited_total", method="chat.postMessage") == 1
    assert _sum(changes, "opsloop_slack_api_errors_total", method="auth.test") == 0


HELLO = {"role": "user", "content": "hello"}


@pytest.mark.parametrize(
    ("status", "etype", "kind"),
    [
        (429, "rate_limit_error", "rate_limited"),
        (529, "overloaded_error", "overloaded"),
        (500, "api_error", "server"),
        (401, "authentication_error", "auth"),
        (400, "invalid_request_error", "bad_request"),
    ],
)
async def test_the_anthropic_adapter_counts_its_errors_by_kind(
    status: int, etype: str, kind: str
) -> None:
    async with FakeAnthropic() as fake:
        fake.error(status, etype, "Something happened.")
        client = AsyncAnthropic(api_key=FAKE_API_KEY, base_url=fake.url, max_retries=0)
        model = AnthropicModel(client)
        before = _opsloop_samples()
        try:
            with pytest.raises(ModelError):
                await model.next_step(Prompt(system="s", messages=[HELLO], tools=[]))
        finally:
            await model.close()
        changes = _since(before)
    assert _sum(changes, "opsloop_model_errors_total", kind=kind) == 1
    assert _sum(changes, "opsloop_model_errors_total") == 1


async def test_metrics_answer_without_the_database_counts_when_it_is_unreachable() -> None:
    store = store_for("postgresql://postgres@127.0.0.1:1/x")  # built without connecting
    try:
        app = make_health_app(store)
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics")
            assert resp.status == 200
            text = await resp.text()
    finally:
        await store.close()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "opsloop_steps" in names and "opsloop_slack_ack_seconds" in names
    assert "opsloop_threads" not in names  # not read: no made-up zeros


async def test_metrics_read_the_database_at_each_scrape(sqlite_url: str) -> None:
    store = await open_store(sqlite_url)
    try:
        async with TestClient(TestServer(make_health_app(store))) as client:
            first = await (await client.get("/metrics")).text()
            key = ThreadKey("T1", "C1", "1700000000.000300")
            await post_user_message(store, key, text="go", user="U_A", dedupe_key="m1")
            second = await (await client.get("/metrics")).text()
    finally:
        await store.close()
    assert 'opsloop_threads{status="running"} 0.0' in first
    assert 'opsloop_threads{status="running"} 1.0' in second
