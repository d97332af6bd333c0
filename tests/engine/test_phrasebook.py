"""The offline phrasebook model: each phrase walks one path of the product, decided from
the projected log alone; and end to end through the real Runner, Store and demo tools."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from engine import events as ev
from engine.context import project
from engine.inputs import Decider, decide_approval, post_user_message
from engine.models.base import Decision
from engine.models.phrasebook import (
    CI_REPO,
    CI_WORKFLOW,
    DISPATCH,
    ONCALL,
    PHRASEBOOK,
    PhrasebookModel,
)
from engine.policy import classify
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.support.fakes import FakeClock
from tests.support.logs import (
    REQUESTER,
    REVIEWER,
    alert,
    approval_asked,
    clarification_asked,
    decided,
    requested,
    stamp,
    started,
    user,
)
from tests.tools.test_demo import demo_loaded
from tools import ToolRegistry
from tools.builtin.docs import search_docs

MODEL = PhrasebookModel()


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("OPSLOOP_DEMO_URL", f"sqlite:///{tmp_path / 'demo.db'}")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "rollback.md").write_text("# Rollback\n\nRun `make rollback` to undo a deploy.\n")
    monkeypatch.setenv("OPSLOOP_DOCS_DIR", str(docs))
    with demo_loaded() as module:
        yield module


@pytest.fixture
def registry(demo: ModuleType) -> ToolRegistry:
    """What OPSLOOP_TOOLS=tools.builtin,tools.demo gives the runner (tickets aside)."""
    reg = ToolRegistry()
    for t in (search_docs, demo.deploy, demo.run_job, demo.check_health):
        reg.register(t)
    return reg


async def decide(events: list[ev.Event], reg: ToolRegistry, turn: int = -1) -> Decision:
    prompt = replace(project(stamp(events), reg.all()), turn=turn)
    return await MODEL.next_step(prompt)


def tool_result(call_id: str, output: Any = None, error: str | None = None) -> ev.ToolResult:
    if error is not None:
        return ev.ToolResult(actor="tool", tool_call_id=call_id, attempt=1, ok=False, error=error)
    return ev.ToolResult(actor="tool", tool_call_id=call_id, attempt=1, ok=True, output=output)


def ran(call_id: str, tool: str, policy: ev.Policy, **arguments: Any) -> list[ev.Event]:
    """A call from the model's decision up to its start (approval granted if needed)."""
    log: list[ev.Event] = [
        decided(call_id, tool, **arguments),
        requested(call_id, tool, policy=policy, **arguments),
    ]
    if policy == "approve_before_run":
        log += [
            approval_asked(call_id, tool, **arguments),
            ev.ApprovalGranted(actor=REVIEWER, tool_call_id=call_id),
        ]
    return [*log, started(call_id)]


def final_text(decision: Decision) -> str:
    assert decision.tool_use is None and decision.stop_reason == "end_turn", decision
    return decision.text


# --- the first step of each phrase ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tool", "arguments", "verdict"),
    [
        ("<@U0BOT> look up rollback", "search_docs", {"query": "rollback"}, "run_now"),
        ("search the docs for rollback", "search_docs", {"query": "rollback"}, "run_now"),
        (
            "deploy api to staging",
            "deploy",
            {"service": "api", "environment": "staging"},
            "approve_before_run",
        ),
        (
            "<@U0BOT> Deploy api version 1.4.2 to production.",
            "deploy",
            {"service": "api", "version": "1.4.2", "environment": "production"},
            "approve_before_run",
        ),
        (
            "run the backfill job for 20 seconds",
            "run_job",
            {"name": "backfill", "seconds": 20},
            "wait_for_external_event",
        ),
        (
            "run job reindex for 2 minutes",
            "run_job",
            {"name": "reindex", "seconds": 120},
            "wait_for_external_event",
        ),
        ("check health of api", "check_health", {"service": "api"}, "run_now"),
        ("is web healthy?", "check_health", {"service": "web"}, "run_now"),
    ],
)
async def test_a_phrase_becomes_a_valid_call_of_its_tool(
    registry, text, tool, arguments, verdict
) -> None:
    decision = await decide([user(text)], registry, turn=0)
    use = decision.tool_use
    assert use is not None and (use.name, use.input) == (tool, arguments)
    assert use.id == "toolu_offline_0000"
    assert (decision.stop_reason, decision.model) == ("tool_use", "offline phrasebook")
    assert (decision.usage.input_tokens, decision.usage.output_tokens) == (0, 0)
    assert classify(decision, registry).kind == verdict  # the runner accepts it as is


@pytest.mark.parametrize(
    ("text", "tool", "arguments"),
    [
        ("deploy api to staging please 🙏", "deploy", {"service": "api", "environment": "staging"}),
        ("<@U0BOT> check health of api pls", "check_health", {"service": "api"}),
        ("can you check health of api?", "check_health", {"service": "api"}),
        ("could you please look up rollback :pray:", "search_docs", {"query": "rollback"}),
        (
            "🚀 run the backfill job for 20 seconds, thanks!",
            "run_job",
            {"name": "backfill", "seconds": 20},
        ),
        ("is web healthy? 🤔 thank you", "check_health", {"service": "web"}),
        (
            "Please deploy api to production :pray::skin-tone-2: thx",
            "deploy",
            {"service": "api", "environment": "production"},
        ),
    ],
)
async def test_emoji_and_politeness_around_a_phrase_are_understood(
    registry, text, tool, arguments
) -> None:
    use = (await decide([user(text)], registry)).tool_use
    assert use is not None and (use.name, use.input) == (tool, arguments)


async def test_politeness_alone_is_not_mistaken_for_a_phrase(registry) -> None:
    answer = final_text(await decide([user("thanks 🙏")], registry))
    assert answer.startswith("I didn't catch “thanks”")


async def test_a_very_long_message_is_not_echoed_back_in_full(registry) -> None:
    words = "lorem ipsum dolor sit amet " * 400  # ~10,000 characters
    for text in (f"look up {words}", f"deploy {'x' * 5000} to staging", words):
        decision = await decide([user(text)], registry)
        assert len(decision.text) < 1500, (text[:20], len(decision.text))
        assert "…" in decision.text
    # A result names the query again: cut there too (a result this short is kept whole).
    query = ("lorem ipsum dolor sit amet " * 10).strip()
    log = [user(f"look up {query}"), *ran("toolu_1", "search_docs", "run_now", query=query)]
    empty = {"query": query, "results": []}
    answer = final_text(await decide([*log, tool_result("toolu_1", empty)], registry))
    cut = query[:199].rsplit(" ", 1)[0]  # after a whole word
    assert answer == f"Nothing in the docs matches “{cut}…”."


async def test_deploy_without_a_service_asks_which_one(registry) -> None:
    for text in ("deploy", "deploy to production"):
        decision = await decide([user(text)], registry)
        assert decision.tool_use is not None
        assert decision.tool_use.name == ev.CLARIFICATION_TOOL
        assert decision.tool_use.input["question"].startswith("Which service should I deploy?")
        # The thread's status line says where to answer (issue 15 §12): not again here.
        assert "thread" not in decision.tool_use.input["question"].lower()
        assert classify(decision, registry).kind == "clarify"


async def test_an_unknown_environment_is_explained_not_guessed(registry) -> None:
    text = final_text(await decide([user("deploy api to dev")], registry))
    assert "staging or production" in text and "dev" in text


@pytest.mark.parametrize("text", ["hello", "help", "<@U0BOT>", "what is the weather"])
async def test_anything_else_gets_the_phrasebook(registry, text) -> None:
    answer = final_text(await decide([user(text)], registry))
    assert all(f"`{phrase}`" in answer for phrase, _ in PHRASEBOOK)
    assert ("didn't catch" in answer) == (text == "what is the weather")


async def test_a_phrase_whose_tool_is_not_loaded_says_which_module_is_missing(registry) -> None:
    builtins_only = ToolRegistry()
    builtins_only.register(search_docs)
    for text in ("deploy api to staging", "deploy", "check health of api"):
        answer = final_text(await decide([user(text)], builtins_only))
        assert "isn't loaded" in answer and "tools.demo" in answer
    answer = final_text(await decide([user("look up rollback")], ToolRegistry()))
    assert "`search_docs`" in answer and "tools.builtin" in answer


async def test_the_same_prompt_gives_the_same_decision_and_ids(registry) -> None:
    log = [user("deploy api to staging")]
    # Two processes project the same log and ask two models: one decision, one id.
    prompts = [replace(project(stamp(log), registry.all()), turn=3) for _ in range(2)]
    first = await PhrasebookModel().next_step(prompts[0])
    second = await PhrasebookModel().next_step(prompts[1])
    assert first == second
    assert first.tool_use is not None and first.tool_use.id == "toolu_offline_0003"
    later = await decide(log, registry, 4)  # the next decision of the thread: a new id
    assert later.tool_use is not None and later.tool_use.id == "toolu_offline_0004"
    # Without a turn (a hand-made prompt) the assistant turns count instead.
    fallback = await decide(log, registry)
    assert fallback.tool_use is not None and fallback.tool_use.id == "toolu_offline_0000"


# --- after a result ---------------------------------------------------------------------


async def test_search_hits_are_summarised(registry) -> None:
    hits = {
        "query": "rollback",
        "results": [
            {"file": "ops.md", "line": 3, "snippet": "## Rollback\nRun make rollback", "score": 4}
        ],
    }
    log = [user("look up rollback"), *ran("toolu_1", "search_docs", "run_now", query="rollback")]
    answer = final_text(await decide([*log, tool_result("toolu_1", hits)], registry))
    assert answer.startswith("Found 1 match for “rollback”")
    assert "*ops.md:3* Rollback Run make rollback" in answer
    empty = {"query": "rollback", "results": []}
    answer = final_text(await decide([*log, tool_result("toolu_1", empty)], registry))
    assert answer == "Nothing in the docs matches “rollback”."


async def test_a_deployment_is_reported_with_its_number(registry) -> None:
    args = {"service": "api", "version": "1.4.2", "environment": "staging"}
    out = {"deployment": 3, **args}
    log = [user("deploy api 1.4.2"), *ran("toolu_1", "deploy", "approve_before_run", **args)]
    answer = final_text(await decide([*log, tool_result("toolu_1", out)], registry))
    assert answer == "Deployed api 1.4.2 to staging (deployment #3)."


async def test_a_rejected_deployment_says_not_deployed_and_why(registry) -> None:
    args = {"service": "api", "environment": "production"}
    log = [
        user("deploy api to production"),
        decided("toolu_1", "deploy", **args),
        requested("toolu_1", "deploy", policy="approve_before_run", **args),
        approval_asked("toolu_1", "deploy", **args),
        ev.ApprovalRejected(actor=REVIEWER, tool_call_id="toolu_1", reason="freeze until Monday"),
    ]
    answer = final_text(await decide(log, registry))
    assert answer.startswith("Not deployed: api to production.\n> Reviewer")
    assert f"Reviewer {REVIEWER} rejected this call: freeze until Monday" in answer


async def test_the_answer_to_the_question_names_the_service_to_deploy(registry) -> None:
    asked = [user("deploy to production"), *clarification_asked("toolu_1", "Which service?")]
    reply = ev.ClarificationAnswered(actor=REQUESTER, tool_call_id="toolu_1", text="api")
    decision = await decide([*asked, reply], registry, turn=1)
    assert decision.tool_use is not None
    assert (decision.tool_use.name, decision.tool_use.input) == (
        "deploy",
        {"service": "api", "environment": "production"},
    )
    assert decision.tool_use.id == "toolu_offline_0001"
    never = ev.ClarificationAnswered(actor=REQUESTER, tool_call_id="toolu_1", text="never mind")
    assert "won't deploy" in final_text(await decide([*asked, never], registry))


async def test_a_finished_or_timed_out_job_is_reported(registry) -> None:
    log = [
        user("run the backfill job for 20 seconds"),
        *ran("toolu_1", "run_job", "wait_for_external_event", name="backfill", seconds=20),
        ev.WaitStarted(
            actor="tool",
            tool_call_id="toolu_1",
            wait_id="thr_test.w1",
            description="job backfill (20 s)",
            data={"job_id": 1},
            wake_at=ev.utcnow(),
            timeout_at=ev.utcnow(),
        ),
    ]
    done = ev.WaitFinished(
        tool_call_id="toolu_1",
        wait_id="thr_test.w1",
        result={"job": "backfill", "status": "succeeded", "ran_for_s": 20},
    )
    assert final_text(await decide([*log, done], registry)) == (
        "Job backfill succeeded after 20 s."
    )
    late = ev.WaitTimedOut(tool_call_id="toolu_1", wait_id="thr_test.w1")
    answer = final_text(await decide([*log, late], registry))
    assert answer == "Job backfill did not finish:\n> Timed out waiting for the job."


async def test_a_health_check_answered_after_a_retry_says_so(registry) -> None:
    log = [user("check health of api"), *ran("toolu_1", "check_health", "run_now", service="api")]
    out = {"service": "api", "status": "healthy", "attempt": 2}
    answer = final_text(await decide([*log, tool_result("toolu_1", out)], registry))
    assert answer.startswith("api is healthy (answered on attempt 2")
    failed = tool_result("toolu_1", error="health endpoint timed out (gave up after 5 attempts)")
    answer = final_text(await decide([*log, failed], registry))
    assert answer.startswith("Could not check api:") and "gave up after 5 attempts" in answer


async def test_a_new_message_starts_afresh_after_an_answer(registry) -> None:
    log = [
        user("check health of api"),
        *ran("toolu_1", "check_health", "run_now", service="api"),
        tool_result("toolu_1", {"service": "api", "status": "healthy", "attempt": 2}),
        ev.ModelDecision(actor="model", text="api is healthy.", stop_reason="end_turn"),
        ev.FinalAnswer(actor="model", text="api is healthy."),
        user("look up rollback"),
    ]
    decision = await decide(log, registry, turn=2)
    assert decision.tool_use is not None and decision.tool_use.name == "search_docs"
    assert decision.tool_use.id == "toolu_offline_0002"


async def test_words_said_while_a_call_ran_do_not_hide_its_result(registry) -> None:
    args = {"service": "api", "environment": "staging"}
    asked = [
        user("deploy api to staging"),
        decided("toolu_1", "deploy", **args),
        requested("toolu_1", "deploy", policy="approve_before_run", **args),
        approval_asked("toolu_1", "deploy", **args),
    ]
    done = [
        ev.ApprovalGranted(actor=REVIEWER, tool_call_id="toolu_1"),
        started("toolu_1"),
        tool_result("toolu_1", {"deployment": 1, "version": "1.0.0", **args}),
    ]
    answer = final_text(await decide([*asked, user("thanks!"), *done], registry))
    assert answer == (
        "Deployed api 1.0.0 to staging (deployment #1).\n"
        "(I didn't catch “thanks”; say `help` for what I know.)"
    )
    decision = await decide([*asked, user("check health of api"), *done], registry, turn=1)
    assert decision.tool_use is not None and decision.tool_use.name == "check_health"
    assert decision.text.startswith("Deployed api 1.0.0 to staging (deployment #1).\n\n")
    # Once the model has answered, a new message is only itself.
    answered = [*done, ev.ModelDecision(actor="model", text="ok"), ev.FinalAnswer(text="ok")]
    answer = final_text(await decide([*asked, *answered, user("thanks")], registry))
    assert answer.startswith("I didn't catch “thanks”")


# --- end to end: Runner + Store + demo tools --------------------------------------------

KEY = ThreadKey("T1", "C1", "1700000000.000100")


async def post(store: Store, text: str, n: int = 1, user_id: str = "U_ANN") -> str:
    posted = await post_user_message(store, KEY, text=text, user=user_id, dedupe_key=f"m{n}")
    return posted.thread_id


async def final_answers(store: Store, thread_id: str) -> list[str]:
    return [e.text for e in await store.select_events(thread_id) if e.type == "final_answer"]


def demo_rows(tmp_path: Path, table: str) -> list[tuple]:
    path = tmp_path / "demo.db"
    if not path.exists():
        return []
    with contextlib.closing(sqlite3.connect(path)) as conn:
        if not conn.execute("SELECT name FROM sqlite_master WHERE name = ?", (table,)).fetchall():
            return []
        return conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()


class Runs:
    """Makes a new Runner and model for each run, as a restarted process would."""

    def __init__(self, store: Store, registry: ToolRegistry) -> None:
        self.store, self.registry, self.clock = store, registry, FakeClock()

    def __call__(self) -> Runner:
        return Runner(self.store, PhrasebookModel(), self.registry, clock=self.clock)


@pytest.fixture
async def run(store, registry, demo):
    try:
        yield Runs(store, registry)
    finally:
        await demo.dispose_demo_engines()


async def test_end_to_end_a_lookup_answers_from_the_docs(store, run) -> None:
    tid = await post(store, "<@U0BOT> look up rollback")
    assert (await run().run(tid)).status == "idle"
    [answer] = await final_answers(store, tid)
    assert answer.startswith("Found 2 matches for “rollback”")
    assert "*rollback.md:1*" in answer


async def test_end_to_end_an_approved_deploy_deploys_once(store, run, tmp_path) -> None:
    tid = await post(store, "deploy api version 1.4.2 to production")
    state = await run().run(tid)
    assert state.status == "awaiting_approval"
    assert demo_rows(tmp_path, "deployments") == []  # nothing runs before the approval
    granted = await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="approve", reviewers=ReviewerRule(), now=run.clock.now,
    )  # fmt: skip
    assert granted.event.type == "approval_granted"
    assert (await run().run(tid)).status == "idle"
    assert (await run().run(tid)).status == "idle"  # a second worker finds nothing to do
    [row] = demo_rows(tmp_path, "deployments")
    assert row[1:7] == (f"{tid}:toolu_offline_0000", tid, "api", "1.4.2", "production", "U_ANN")
    assert await final_answers(store, tid) == ["Deployed api 1.4.2 to production (deployment #1)."]


async def test_end_to_end_a_rejected_deploy_is_not_deployed(store, run, tmp_path) -> None:
    tid = await post(store, "deploy api to staging")
    state = await run().run(tid)
    await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="reject", reason="freeze until Monday", reviewers=ReviewerRule(),
        now=run.clock.now,
    )  # fmt: skip
    assert (await run().run(tid)).status == "idle"
    assert demo_rows(tmp_path, "deployments") == []
    [answer] = await final_answers(store, tid)
    assert answer.startswith("Not deployed: api to staging.\n> Reviewer U_BOB")
    assert "U_BOB rejected this call: freeze until Monday" in answer


async def test_end_to_end_the_reply_to_the_question_is_deployed(store, run, tmp_path) -> None:
    tid = await post(store, "<@U0BOT> deploy to staging")
    state = await run().run(tid)
    assert state.status == "awaiting_reply"
    assert state.question.question.startswith("Which service should I deploy?")
    reply = await post(store, "web", n=2)
    assert reply == tid
    state = await run().run(tid)
    assert state.status == "awaiting_approval"
    assert state.pending.arguments == {"service": "web", "environment": "staging"}
    await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="approve", reviewers=ReviewerRule(), now=run.clock.now,
    )  # fmt: skip
    assert (await run().run(tid)).status == "idle"
    assert len(demo_rows(tmp_path, "deployments")) == 1
    assert await final_answers(store, tid) == ["Deployed web 1.0.0 to staging (deployment #1)."]


async def test_end_to_end_a_one_second_job_is_waited_for(store, run, demo, monkeypatch) -> None:
    clock = run.clock
    monkeypatch.setattr(demo, "_now", clock)  # the job's clock is the runner's
    tid = await post(store, "run the backfill job for 1 second")
    state = await run().run(tid)
    assert state.status == "awaiting_job"
    assert (state.wake_at - clock.now).total_seconds() == 1
    assert (await run().run(tid)).status == "awaiting_job"  # not due: nothing happens
    await demo.dispose_demo_engines()  # the job lives in the table, not in this process
    clock.advance(1)
    assert (await store.due_threads(clock.now)) == [tid]
    assert (await run().run(tid)).status == "idle"
    types = [e.type for e in await store.select_events(tid)]
    assert types.count("wait_started") == 1 and "wait_finished" in types
    assert await final_answers(store, tid) == ["Job backfill succeeded after 1 s."]


async def test_end_to_end_a_job_nobody_finishes_times_out(store, run, demo, monkeypatch) -> None:
    clock = run.clock
    frozen = clock.now
    monkeypatch.setattr(demo, "_now", lambda: frozen)  # the job's time never moves on
    tid = await post(store, "run job backfill for 1 second")
    await run().run(tid)
    clock.advance(3 * 1 + 30)
    assert (await run().run(tid)).status == "idle"
    assert await final_answers(store, tid) == [
        "Job backfill did not finish:\n> Timed out waiting for the job."
    ]


async def test_end_to_end_a_failed_health_check_is_retried(store, run) -> None:
    clock = run.clock
    tid = await post(store, "check health of api")
    state = await run().run(tid)
    assert state.status == "sleeping"
    [retry] = [e for e in await store.select_events(tid) if e.type == "retry_scheduled"]
    assert (retry.attempt, retry.error) == (1, "health endpoint timed out")
    clock.advance((retry.wake_at - clock.now).total_seconds())
    assert (await run().run(tid)).status == "idle"
    results = [e for e in await store.select_events(tid) if e.type == "tool_result"]
    assert [(r.attempt, r.ok) for r in results] == [(2, True)]
    [answer] = await final_answers(store, tid)
    assert answer.startswith("api is healthy (answered on attempt 2")


async def test_end_to_end_hello_gets_the_phrasebook_and_a_phrase_follows(store, run) -> None:
    tid = await post(store, "hello")
    assert (await run().run(tid)).status == "idle"
    await post(store, "check health of api", n=2)
    state = await run().run(tid)
    assert state.status == "sleeping" and state.pending.intent == "check_health"
    [answer] = await final_answers(store, tid)
    assert "`deploy api to staging`" in answer


async def test_end_to_end_a_message_during_the_approval_is_answered_with_the_result(
    store, run
) -> None:
    tid = await post(store, "deploy api to staging")
    state = await run().run(tid)
    # Someone other than the requester: the card stands (the requester's own words
    # would withdraw it, and the model would decide again).
    await post(store, "any news?", n=2, user_id="U_CAROL")
    assert (await run().run(tid)).status == "awaiting_approval"  # words alone change nothing
    await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="approve", reviewers=ReviewerRule(), now=run.clock.now,
    )  # fmt: skip
    assert (await run().run(tid)).status == "idle"
    [answer] = await final_answers(store, tid)
    assert answer.startswith("Deployed api 1.0.0 to staging (deployment #1).\n(I didn't catch")


# --- the local demo: the catalog (MCP), the platform API (HTTP), the crash ----------------

CATALOG_TOOLS = {
    "mcp__catalog__list_services": {"type": "object", "properties": {}},
    "mcp__catalog__get_service": {
        "type": "object",
        "properties": {"service": {"type": "string"}},
        "required": ["service"],
    },
    "mcp__catalog__scale_service": {
        "type": "object",
        "properties": {
            "service": {"type": "string"},
            "replicas": {"type": "integer"},
            "simulate_crash": {"type": "boolean"},
        },
        "required": ["service", "replicas"],
    },
    "restart_service": {
        "type": "object",
        "properties": {"service": {"type": "string"}},
        "required": ["service"],
    },
}


async def _not_run(args: Any, ctx: Any) -> None:
    raise AssertionError("the phrasebook tests only decide")


@pytest.fixture
def demo_registry(registry: ToolRegistry) -> ToolRegistry:
    """The registry plus what local mode's own opsloop.yaml adds (stand-ins)."""
    from tools.schema_tool import schema_tool

    reg = registry.copy()
    for name, schema in CATALOG_TOOLS.items():
        reg.register(
            schema_tool(name=name, description=f"{name}.", schema=schema, func=_not_run, source="x")
        )
    return reg


@pytest.mark.parametrize(
    ("text", "tool", "arguments"),
    [
        ("list services", "mcp__catalog__list_services", {}),
        ("<@U0BOT> show the services please", "mcp__catalog__list_services", {}),
        ("show service api", "mcp__catalog__get_service", {"service": "api"}),
        ("who owns web?", "mcp__catalog__get_service", {"service": "web"}),
        (
            "scale api to 5 replicas",
            "mcp__catalog__scale_service",
            {"service": "api", "replicas": 5},
        ),
        (
            "scale api to 5 replicas and simulate a crash",
            "mcp__catalog__scale_service",
            {"service": "api", "replicas": 5, "simulate_crash": True},
        ),
        (
            "Scale the worker service to 2, simulate a crash.",
            "mcp__catalog__scale_service",
            {"service": "worker", "replicas": 2, "simulate_crash": True},
        ),
        ("restart api", "restart_service", {"service": "api"}),
    ],
)
async def test_the_demo_phrases_call_the_catalog_and_the_platform(
    demo_registry, text, tool, arguments
) -> None:
    decision = await decide([user(text)], demo_registry)
    assert decision.tool_use is not None, decision.text
    assert (decision.tool_use.name, decision.tool_use.input) == (tool, arguments)


async def test_help_lists_the_demo_phrases(demo_registry) -> None:
    answer = final_text(await decide([user("help")], demo_registry))
    for phrase in ("list services", "scale api to 5 replicas and simulate a crash", "restart api"):
        assert f"`{phrase}`" in answer


async def test_a_demo_phrase_without_the_local_file_says_where_its_tools_come_from(
    registry,
) -> None:
    for text in ("list services", "scale api to 3", "restart api"):
        answer = final_text(await decide([user(text)], registry))
        assert "isn't loaded" in answer and "localslack/opsloop.yaml" in answer


async def test_catalog_and_platform_results_are_summarised(demo_registry) -> None:
    def after(text: str, tool: str, output: Any, **args: Any) -> list[ev.Event]:
        return [
            user(text),
            *ran("toolu_1", tool, "run_now", **args),
            tool_result("toolu_1", output),
        ]

    services = {"services": [{"service": "api", "owner": "platform", "replicas": 3}]}
    listed = {"text": "…", "structured": services}
    log = after("list services", "mcp__catalog__list_services", listed)
    answer = final_text(await decide(log, demo_registry))
    assert answer == "The catalog has 1 service:\n• *api*: owner platform, 3 replicas"
    scaled = {"structured": {"service": "api", "replicas": 5, "was": 3}}
    log = after("scale api to 5", "mcp__catalog__scale_service", scaled, service="api", replicas=5)
    answer = final_text(await decide(log, demo_registry))
    assert answer == "Scaled api to 5 replicas (it had 3)."
    restarted = {"status": 200, "body": {"service": "api", "restart": 2}}
    log = after("restart api", "restart_service", restarted, service="api")
    answer = final_text(await decide(log, demo_registry))
    assert answer == "Restarted api through the platform API (restart #2)."


async def test_a_reconciled_call_reports_what_the_reviewer_said(demo_registry) -> None:
    args = {"service": "api", "replicas": 5, "simulate_crash": True}
    log = [
        user("scale api to 5 replicas and simulate a crash"),
        *ran("toolu_1", "mcp__catalog__scale_service", "approve_before_run", **args),
        ev.ToolOutcomeUnknown(actor="system", tool_call_id="toolu_1", attempt=1, error="gone"),
        ev.ReconcileDecided(
            actor=REVIEWER,
            tool_call_id="toolu_1",
            decision="happened",
            reviewer=REVIEWER,
            note="catalog shows 5",
        ),
    ]
    answer = final_text(await decide(log, demo_registry))
    assert answer.startswith("Scaled api to 5 replicas: ") and "catalog shows 5" in answer


async def test_a_new_request_after_a_cancelled_call_does_not_report_it(demo_registry) -> None:
    args = {"service": "api", "environment": "staging"}
    log = [
        user("deploy api to staging"),
        decided("toolu_1", "deploy", **args),
        requested("toolu_1", "deploy", policy="approve_before_run", **args),
        approval_asked("toolu_1", "deploy", **args),
        ev.ThreadCancelled(actor=REQUESTER, reason="wrong service"),
        user("scale web to 2"),
    ]
    decision = await decide(log, demo_registry)
    assert decision.tool_use is not None and decision.tool_use.name == "mcp__catalog__scale_service"
    # The text becomes the next card's Why: about this request, not the cancelled one.
    assert decision.text == "Scaling web to 2 replicas, once it is approved."


# --- wording (issue 15 §12 and §10) ----------------------------------------------------


async def test_one_replica_is_one_replica(demo_registry) -> None:
    worker = {"service": "worker", "owner": "data", "replicas": 1}
    log = [
        user("show service worker"),
        *ran("toolu_1", "mcp__catalog__get_service", "run_now", service="worker"),
        tool_result("toolu_1", {"structured": worker}),
    ]
    assert final_text(await decide(log, demo_registry)).endswith(", 1 replica.")
    decision = await decide([user("scale worker to 1")], demo_registry)
    assert decision.text.startswith("Scaling worker to 1 replica,")


async def test_a_card_that_may_need_two_approvals_does_not_promise_one(demo_registry) -> None:
    """The model speaks before the policy decides; a production deploy needs 2 of 2."""
    decision = await decide([user("deploy api to production")], demo_registry)
    assert decision.tool_use is not None and "a reviewer approves" not in decision.text
    assert decision.text.endswith(", once it is approved.")


def crashed_scale(*after: ev.Event) -> list[ev.Event]:
    args = {"service": "api", "replicas": 6, "simulate_crash": True}
    return [
        user("scale api to 6 replicas and simulate a crash"),
        *ran("toolu_1", "mcp__catalog__scale_service", "approve_before_run", **args),
        ev.ToolOutcomeUnknown(actor="system", tool_call_id="toolu_1", attempt=1, error="gone"),
        *after,
    ]


async def test_run_it_again_says_the_interrupted_call_had_taken_effect(demo_registry) -> None:
    """It said "Scaled api to 6 replicas (it had 6)": the catalog had saved the change
    before it crashed, so the second run changed nothing."""
    log = crashed_scale(
        ev.ReconcileDecided(
            actor=REVIEWER, tool_call_id="toolu_1", decision="retry", reviewer=REVIEWER
        ),
        tool_result("toolu_1", {"structured": {"service": "api", "replicas": 6, "was": 6}}),
    )
    answer = final_text(await decide(log, demo_registry))
    assert answer == (
        "api has 6 replicas: the interrupted call had taken effect before the crash, "
        "so running it again changed nothing."
    )


async def test_it_did_not_happen_is_reported_as_a_persons_word(demo_registry) -> None:
    """It said "Not scaled: api to 6 replicas." while the catalog showed 6: the demo's
    catalog saves the change before it crashes. The answer says whose word it is and
    where to look, and claims nothing about the catalog."""
    log = crashed_scale(
        ev.ReconcileDecided(
            actor=REVIEWER, tool_call_id="toolu_1", decision="abandon", reviewer=REVIEWER
        ),
    )
    answer = final_text(await decide(log, demo_registry))
    assert not answer.startswith("Not scaled")
    assert answer.startswith("I did not run it again: scaling api to 6 replicas did not happen")
    assert "a person said" in answer and "`show service api`" in answer


# --- local mode's GitHub, PagerDuty and alerts --------------------------------------------


@pytest.fixture
async def local_registry(demo_registry: ToolRegistry) -> ToolRegistry:
    """The demo registry plus the GitHub and PagerDuty tools (their real definitions)
    that local mode's own opsloop.yaml loads."""
    from tools.integrations.config import GitHubConfig, PagerDutyConfig
    from tools.integrations.github import GitHubSource
    from tools.integrations.pagerduty import PagerDutySource

    reg = demo_registry.copy()
    github = GitHubSource(GitHubConfig(token="x", repos=[CI_REPO]))
    pagerduty = PagerDutySource(PagerDutyConfig(token="x"), client=object())  # type: ignore[arg-type]
    for t in github.tools():
        reg.register(t)
    for t in await pagerduty.open():
        reg.register(t)
    return reg


def ci_call(environment: str, service: str = "api", **more: str) -> dict[str, Any]:
    inputs = {"service": service, "environment": environment, **more}
    return {"repo": CI_REPO, "workflow": CI_WORKFLOW, "ref": "main", "inputs": inputs}


@pytest.mark.parametrize(
    ("text", "tool", "arguments", "verdict"),
    [
        ("deploy api to staging through CI", DISPATCH, ci_call("staging"), "approve_before_run"),
        (
            "<@U0BOT> deploy api to production through CI please",
            DISPATCH,
            ci_call("production"),
            "approve_before_run",
        ),
        (
            "ship web v2.0.1 to prod via GitHub Actions",
            DISPATCH,
            ci_call("production", "web", version="2.0.1"),
            "approve_before_run",
        ),
        ("deploy worker with the deploy workflow", DISPATCH, ci_call("staging", "worker"), None),
        ("who is on call?", ONCALL, {}, "run_now"),
        ("on-call", ONCALL, {}, "run_now"),
        # Without "through CI" it is the demo's deploy, as before.
        ("deploy api to staging", "deploy", {"service": "api", "environment": "staging"}, None),
    ],
)
async def test_the_ci_and_on_call_phrases_call_github_and_pagerduty(
    local_registry, text, tool, arguments, verdict
) -> None:
    decision = await decide([user(text)], local_registry)
    assert decision.tool_use is not None, decision.text
    assert (decision.tool_use.name, decision.tool_use.input) == (tool, arguments)
    if verdict is not None:
        assert classify(decision, local_registry).kind == verdict  # valid as the tool says


async def test_a_ci_deploy_says_what_it_runs_and_an_unknown_environment_is_explained(
    local_registry,
) -> None:
    decision = await decide([user("deploy api to staging through CI")], local_registry)
    assert decision.text == (
        "Deploying api to staging through CI (deploy.yml on acme/platform), once it is "
        "approved; I'll report how the run ends."
    )
    answer = final_text(await decide([user("deploy api to qa through CI")], local_registry))
    assert "not “qa”" in answer and "`deploy api to staging through CI`" in answer
    answer = final_text(await decide([user("deploy through CI")], local_registry))
    assert answer.startswith("Which service?")


async def test_the_ci_and_on_call_phrases_without_the_local_file_say_where_tools_come_from(
    registry,
) -> None:
    for text in ("deploy api to staging through CI", "who is on call"):
        answer = final_text(await decide([user(text)], registry))
        assert "isn't loaded" in answer and "localslack/opsloop.yaml" in answer


def ci_ran(*after: ev.Event, environment: str = "staging") -> list[ev.Event]:
    args = ci_call(environment)
    return [
        user(f"deploy api to {environment} through CI"),
        *ran("toolu_1", DISPATCH, "approve_before_run", **args),
        ev.WaitStarted(
            actor="tool",
            tool_call_id="toolu_1",
            wait_id="thr_test.w1",
            description="deploy.yml on acme/platform at main (run 42)",
            data={"github_run": {"repo": CI_REPO, "run_id": 42}},
            wake_at=ev.utcnow(),
            timeout_at=ev.utcnow(),
        ),
        *after,
    ]


def run_finished(conclusion: str, failed: list[str] | None = None) -> ev.WaitFinished:
    result = {
        "repo": CI_REPO,
        "run_id": 42,
        "workflow": "Deploy",
        "conclusion": conclusion,
        "duration_s": 4.0,
        "html_url": "https://github.example/acme/platform/actions/runs/42",
        "failed_jobs": failed or [],
    }
    return ev.WaitFinished(
        actor="github", tool_call_id="toolu_1", wait_id="thr_test.w1", result=result
    )


async def test_how_the_ci_run_ended_is_the_answer(local_registry) -> None:
    answer = final_text(await decide(ci_ran(run_finished("success")), local_registry))
    assert answer == (
        "Deployed api to staging through CI: the Deploy run 42 succeeded in 4 s. "
        "https://github.example/acme/platform/actions/runs/42"
    )
    failed = ci_ran(run_finished("failure", ["deploy"]), environment="production")
    answer = final_text(await decide(failed, local_registry))
    assert answer.startswith("Not deployed: the Deploy run 42 of api to production ended failure")
    assert "Failed jobs: deploy." in answer
    late = ci_ran(ev.WaitTimedOut(tool_call_id="toolu_1", wait_id="thr_test.w1"))
    answer = final_text(await decide(late, local_registry))
    assert answer.startswith("Not deployed through CI: api to staging.\n> ")


async def test_who_is_on_call_is_listed(local_registry) -> None:
    oncalls = {
        "oncalls": [
            {
                "user": "Bob Chen",
                "email": "bob@opsloop-local.example",
                "schedule": {"id": "P0ONCALL", "name": "Schedule P0ONCALL"},
                "level": 1,
                "until": "2026-01-01T00:00:00Z",
            }
        ],
        "more": False,
    }
    log = [
        user("who is on call"),
        *ran("toolu_1", ONCALL, "run_now"),
        tool_result("toolu_1", oncalls),
    ]
    assert final_text(await decide(log, local_registry)) == (
        "On call now, says PagerDuty:\n• *Bob Chen* (bob@opsloop-local.example): "
        "Schedule P0ONCALL, level 1, until 2026-01-01T00:00:00Z"
    )
    log[-1] = tool_result("toolu_1", {"oncalls": [], "more": False})
    assert (
        final_text(await decide(log, local_registry)) == "Nobody is on call in PagerDuty right now."
    )


async def test_an_alert_is_investigated_with_a_read_only_check_and_summarised(
    local_registry,
) -> None:
    fired = alert(summary="api: 5xx responses above 5%")
    decision = await decide([fired], local_registry)
    assert decision.tool_use is not None
    assert (decision.tool_use.name, decision.tool_use.input) == ("check_health", {"service": "api"})
    assert classify(decision, local_registry).kind == "run_now"
    log = [
        fired,
        *ran("toolu_1", "check_health", "run_now", service="api"),
        tool_result("toolu_1", {"service": "api", "status": "healthy", "attempt": 1}),
    ]
    assert final_text(await decide(log, local_registry)) == (
        "api is healthy.\nThe alert: “api: 5xx responses above 5%”. I only looked: nothing "
        "was changed."
    )


async def test_a_resolved_alert_or_one_without_a_service_changes_nothing(local_registry) -> None:
    resolved = [alert(), alert(status="resolved")]
    answer = final_text(await decide(resolved, local_registry))
    assert (
        answer == "The alert has resolved (“p99 latency above 2s”). Nothing more to look at here."
    )
    nameless = alert(labels={"alertname": "DiskFull"})
    answer = final_text(await decide([nameless], local_registry))
    assert "names no service" in answer and "did nothing" in answer


async def test_help_lists_the_ci_and_on_call_phrases(local_registry) -> None:
    answer = final_text(await decide([user("help")], local_registry))
    for phrase in ("deploy api to staging through CI", "deploy api to production through CI"):
        assert f"`{phrase}`" in answer
    assert "`who is on call`" in answer


def test_the_readmes_local_mode_table_lists_every_phrase() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    missing = [p for p, _ in PHRASEBOOK if f"| `@opsloop {p}` |" not in readme]
    assert missing == []


def test_a_long_text_is_cut_at_a_sentence_or_a_word_never_inside_one() -> None:
    from engine.models.phrasebook import _cut

    sentences = "The sweep takes them over. " * 10
    assert _cut(sentences, 140).endswith("over.") and len(_cut(sentences, 140)) <= 140
    words = "takeover " * 40
    cut = _cut(words, 100)
    assert cut.endswith("takeover…") and len(cut) <= 100
