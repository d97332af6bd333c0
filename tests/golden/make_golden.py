"""Writes the golden logs: real threads played through the runner, the front-door
functions and the SQLite store, each exported as one JSONL file.

Run by hand, from the checkout: ``.venv/bin/python tests/golden/make_golden.py``. The
tests read the files as data and never run this (tests/golden/README.md says when to).

A file's first line is its header: the thread's name, its Slack key, the tool factories
of ``tests.support.demo_tools`` that replay it, and the status its log reduces to. Every
other line is one stored row as ``engine.mapper.to_row`` maps it (the payload is the
stored JSON text, ``schema_version`` as written), ``created_at`` in ISO 8601.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine import events as ev  # noqa: E402
from engine import mapper  # noqa: E402
from engine.config import RunnerConfig  # noqa: E402
from engine.config_file import PolicyRule  # noqa: E402
from engine.context import Prompt, project  # noqa: E402
from engine.inputs import (  # noqa: E402
    Decider,
    Edit,
    cancel,
    decide_approval,
    decide_reconcile,
    edit_call,
    finish_wait,
    post_user_message,
    receive_alert,
    revoke_grant,
)
from engine.models.base import Decision, ModelError  # noqa: E402
from engine.models.scripted import ScriptedModel, Step, ask, call, say  # noqa: E402
from engine.replay import replay_all  # noqa: E402
from engine.reviewers import ReviewerRule  # noqa: E402
from engine.rules import Defaults, PolicySet  # noqa: E402
from engine.runner import Runner  # noqa: E402
from engine.state import ThreadState, reduce  # noqa: E402
from engine.store import Store, ThreadKey, open_store  # noqa: E402
from tests.support import demo_tools  # noqa: E402

HERE = Path(__file__).resolve().parent
FORMAT = 1  # of the header line; the rows are the store's own
TEAM, CHANNEL = "T0GOLDEN", "C0GOLDEN"
ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"
OPEN = ReviewerRule()
POLICY = PolicySet(
    rules=(
        PolicyRule(tool="purge", policy="reject", reason="nothing is ever purged"),
        PolicyRule(
            tool="restart",
            when={"properties": {"name": {"const": "db"}}},
            policy="reject",
            reason="the database is restarted by hand",
        ),
        PolicyRule(tool="restart", policy="approve_before_run", approvers=[BOB, CAROL], quorum=2),
    ),
    defaults=Defaults(ReviewerRule(frozenset({BOB}))),
    policy_hash="9" * 64,
)
# A rule that reminds its approvers, and escalates an expiry to a channel (issue 17 §3).
REMINDING = PolicySet(
    rules=(
        PolicyRule(
            tool="deploy",
            policy="approve_before_run",
            approvers=[BOB],
            expires_in="2h",
            remind_after="30m",
            escalate_to=[CAROL, "C0GOLDESC"],
        ),
    ),
    defaults=Defaults(ReviewerRule(frozenset({BOB}))),
    policy_hash="8" * 64,
)

# A rule whose approval may create a standing grant (issue 17 §4).
GRANTING = PolicySet(
    rules=(
        PolicyRule(tool="restart", policy="approve_before_run", approvers=[BOB], max_grant="1h"),
    ),
    defaults=Defaults(ReviewerRule(frozenset({BOB}))),
    policy_hash="7" * 64,
)


class Clock:
    """The real time plus an offset the script moves forward (a retry falls due, an
    approval expires), so inputs given before a jump keep their order."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return ev.utcnow() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


class Receipts:
    """A front door that 'posts' every line and card not shown yet and hands back the
    receipts, as bot.delivery does (one ts per message)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.posted = 0

    async def show(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> list[ev.MessagePosted]:
        shown = {e.shows_event_id for e in events if isinstance(e, ev.MessagePosted)}
        receipts = []
        for e in events:
            if e.facts.people != "nothing" and e.event_id not in shown:
                self.posted += 1
                ts = f"1767000000.{self.posted:06d}"
                receipts.append(ev.MessagePosted(shows_event_id=e.event_id, channel=CHANNEL, ts=ts))
        return receipts

    async def rest(self, thread_id: str) -> None:
        """The delivery's resting pass: receipts appended by the store's own write."""
        log = await self.store.select_events(thread_id)
        if receipts := await self.show(thread_id, log, state := reduce(log)):
            await self.store.append(thread_id, state.last_seq, receipts, state=state)


class FailingModel(ScriptedModel):
    """A scripted model whose step ``i`` first raises ``failures[i]``, one per call."""

    def __init__(self, script: list[Step], failures: dict[int, list[ModelError]]) -> None:
        super().__init__(script)
        self.failures = failures

    async def next_step(self, prompt: Prompt) -> Decision:
        if pending := self.failures.get(prompt.turn):
            raise pending.pop(0)
        return await super().next_step(prompt)


@dataclass
class Play:
    """One thread being played: its key, runner, clock and front door."""

    store: Store
    key: ThreadKey
    runner: Runner
    clock: Clock
    door: Receipts
    factory: str  # of tests.support.demo_tools: the tools that replay the thread
    thread_id: str = ""
    said: int = 0

    async def say(self, text: str, user: str = ALICE) -> None:
        self.said += 1
        posted = await post_user_message(
            self.store,
            self.key,
            text=text,
            user=user,
            dedupe_key=f"Ev{self.key.root_ts}-{self.said}",
        )
        self.thread_id = posted.thread_id

    async def run(self) -> str:
        state = await self.runner.run(self.thread_id)
        assert state is not None
        return state.status

    async def vote(self, user: str, decision: ev.ApprovalDecision = "approve", **kw: Any) -> Any:
        state = await self.store.load(self.thread_id)
        assert state.pending is not None
        return await decide_approval(
            self.store,
            self.thread_id,
            tool_call_id=state.pending.tool_call_id,
            decision=decision,
            reviewers=OPEN,
            decider=Decider(user),
            dedupe_key=f"click-{state.last_seq}-{user}",
            **kw,
        )


def play(store: Store, root_ts: str, model: ScriptedModel, factory: str, **kw: Any) -> Play:
    clock = Clock()
    door = Receipts(store)
    tools = getattr(demo_tools, factory)(Counter())
    runner = Runner(store, model, tools, kw.pop("config", None), clock=clock, front_door=door, **kw)
    return Play(store, ThreadKey(TEAM, CHANNEL, root_ts), runner, clock, door, factory)


async def approvals(store: Store) -> Play:
    """A quorum of two approves a restart (the requester's own vote is refused); a
    rule refuses a restart of the database; the model names an unknown tool."""
    model = ScriptedModel(
        [
            call("restart", name="api", _text="Restarting api needs two approvals."),
            call("restart", name="db"),
            call("reboot_everything", name="all"),
            say("api was restarted; the database is restarted by hand."),
        ]
    )
    p = play(store, "1767000001.000100", model, "make_ruled_tools", policy=POLICY)
    await p.say("restart api, and the database too")
    assert await p.run() == "awaiting_approval"
    refused = await p.vote(ALICE)
    assert refused.event is not None and refused.event.type == "approval_refused"
    await p.vote(BOB)
    assert await p.run() == "awaiting_approval"
    await p.vote(CAROL)
    assert await p.run() == "idle"
    await p.door.rest(p.thread_id)
    return p


async def clarified(store: Store) -> Play:
    """The model asks which service; a reviewer rejects the deploy; the second request's
    approval expires."""
    model = ScriptedModel(
        [
            ask("Which service should I deploy?"),
            call("deploy", name="web"),
            call("deploy", name="web", _text="Asking again."),
            say("Nobody approved the deploy in time; web was not deployed."),
        ]
    )
    p = play(store, "1767000002.000100", model, "make_ruled_tools", policy=POLICY)
    await p.say("deploy it")
    assert await p.run() == "awaiting_reply"
    await p.say("web, please")
    assert await p.run() == "awaiting_approval"
    await p.vote(BOB, "reject", reason="not during the freeze")
    assert await p.run() == "awaiting_approval"
    p.clock.advance(25 * 3600)  # past the default 24 h approval deadline
    assert await p.run() == "idle"
    return p


async def reconciled(store: Store) -> Play:
    """A non-idempotent restart loses its connection: a person says it happened."""
    model = ScriptedModel(
        [call("restart", name="lost"), say("lost was restarted, as a reviewer confirmed.")]
    )
    p = play(store, "1767000003.000100", model, "make_ruled_tools", policy=POLICY)
    await p.say("restart lost")
    assert await p.run() == "awaiting_approval"
    await p.vote(BOB)
    await p.vote(CAROL)
    assert await p.run() == "awaiting_reconcile"
    state = await store.load(p.thread_id)
    assert state.pending is not None
    done = await decide_reconcile(
        store,
        p.thread_id,
        tool_call_id=state.pending.tool_call_id,
        decider=Decider(BOB),
        decision="happened",
        note="the service came back at 12:04",
        reviewers=OPEN,
        dedupe_key="reconcile-1",
    )
    assert done.event is not None and done.event.type == "reconcile_decided"
    assert await p.run() == "idle"
    return p


async def retried(store: Store) -> Play:
    """A flaky tool retried twice (no policy file), then a job that never reports back
    times out."""
    model = ScriptedModel(
        [
            call("flaky", name="cache"),
            call("gated_train", name="ranker"),
            say("The cache is warm; the ranker's training timed out."),
        ]
    )
    p = play(store, "1767000004.000100", model, "make_ruled_tools")
    await p.say("warm the cache, then train the ranker")
    for _ in range(2):
        assert await p.run() == "sleeping"
        p.clock.advance(10)
    assert await p.run() == "awaiting_job"
    p.clock.advance(61)  # gated_train waits 60 s
    assert await p.run() == "idle"
    return p


async def compacted(store: Store) -> Play:
    """A small context budget folds the older turns into a summary; the model then fails
    once (retried) and then for good."""
    tools = demo_tools.make_tools(Counter())
    opening = "look up a few things, each of them long: " + "x" * 200
    head = project([ev.UserMessage(text=opening, seq=1, actor=ALICE)], tools.all())
    config = RunnerConfig(context_budget_tokens=head.estimated_tokens + 300)
    failures = {
        3: [
            ModelError("overloaded", retryable=True, retry_after=5),
            ModelError("the request was invalid", retryable=False),
        ]
    }
    script = [call("lookup", name=f"{c}" * 300) for c in "abc"]
    p = play(
        store, "1767000005.000100", FailingModel(script, failures), "make_tools", config=config
    )
    await p.say(opening)
    assert await p.run() == "sleeping"
    p.clock.advance(6)
    assert await p.run() == "failed"
    return p


async def cancelled(store: Store) -> Play:
    """A webhook finishes a job; the next job's wait is cancelled by the requester."""
    model = ScriptedModel([call("train", name="v1"), call("train", name="v2")])
    p = play(store, "1767000006.000100", model, "make_tools")
    await p.say("train v1, then v2")
    assert await p.run() == "awaiting_job"
    state = await store.load(p.thread_id)
    assert state.pending is not None and state.pending.wait is not None
    wait_id = state.pending.wait.wait_id
    await finish_wait(store, p.thread_id, wait_id=wait_id, result={"accuracy": 0.93}, actor="hook")
    assert await p.run() == "awaiting_job"
    done = await cancel(
        store, p.thread_id, decider=Decider(ALICE), reviewers=OPEN, reason="v2 is not needed"
    )
    assert done.event is not None and done.event.type == "thread_cancelled"
    return p


async def withdrawn(store: Store) -> Play:
    """The requester changes their mind while the restart waits for reviewers: the card
    is withdrawn and the model restarts what they asked for instead."""
    model = ScriptedModel(
        [
            call("restart", name="api"),
            call("restart", name="web", _text="Restarting web instead."),
            say("web was restarted."),
        ]
    )
    p = play(store, "1767000007.000100", model, "make_ruled_tools", policy=POLICY)
    await p.say("restart api")
    assert await p.run() == "awaiting_approval"
    await p.say("sorry, I meant web, not api")
    assert await p.run() == "awaiting_approval"
    await p.vote(BOB)
    await p.vote(CAROL)
    assert await p.run() == "idle"
    await p.door.rest(p.thread_id)
    return p


async def reminded(store: Store) -> Play:
    """Nobody decides on a deploy: its approver is reminded after 30 minutes, its expiry
    after two hours is escalated to a channel, and the model hears nobody approved."""
    model = ScriptedModel(
        [call("deploy", name="api"), say("Nobody approved the deploy; api was not deployed.")]
    )
    p = play(store, "1767000008.000100", model, "make_ruled_tools", policy=REMINDING)
    await p.say("deploy api")
    assert await p.run() == "awaiting_approval"
    p.clock.advance(31 * 60)
    assert await p.run() == "awaiting_approval"  # reminded
    p.clock.advance(90 * 60)
    assert await p.run() == "idle"
    await p.door.rest(p.thread_id)
    return p


async def edited(store: Store) -> Play:
    """A reviewer edits a restart before approving it (api → web, one vote of the two its
    rule needs); the second approver's vote runs it as edited, and the model hears who
    changed what."""
    model = ScriptedModel([call("restart", name="api"), say("web was restarted.")])
    p = play(store, "1767000009.000100", model, "make_ruled_tools", policy=POLICY)
    await p.say("restart api")
    assert await p.run() == "awaiting_approval"
    state = await store.load(p.thread_id)
    assert state.pending is not None
    change = Edit(
        p.thread_id,
        state.pending.tool_call_id,
        {"name": "web"},
        state.pending.arguments_hash,
        approve=True,
        dedupe_key=f"view-{state.last_seq}-{BOB}",
    )
    done = await edit_call(
        store, change, decider=Decider(BOB), tools=p.runner.tools, policies=POLICY, reviewers=OPEN
    )
    assert done.event is not None and done.event.type == "approval_edited"  # type: ignore[union-attr]
    assert await p.run() == "awaiting_approval"
    await p.vote(CAROL)
    assert await p.run() == "idle"
    await p.door.rest(p.thread_id)
    return p


async def granted(store: Store) -> Play:
    """A reviewer approves a restart for an hour; the same restart again runs at once by
    that grant (approval_granted by grant:<id>); once the grant is revoked, the next
    restart needs a vote again."""
    again = call("restart", name="api")
    model = ScriptedModel(
        [again, again, say("api was restarted twice."), again, say("api was restarted again.")]
    )
    p = play(store, "1767000010.000100", model, "make_ruled_tools", policy=GRANTING)
    await p.say("restart api, and again if it flaps")
    assert await p.run() == "awaiting_approval"
    await p.vote(BOB, grant=True, now=p.clock())
    assert await p.run() == "idle"  # the second restart ran by the grant
    [grant_id] = (await store.load(p.thread_id)).grants
    revoked = await revoke_grant(
        store,
        p.thread_id,
        grant_id=grant_id,
        decider=Decider(BOB),
        reviewers=OPEN,
        dedupe_key="click-revoke",
    )
    assert revoked.event is not None and revoked.event.type == "grant_revoked"  # type: ignore[union-attr]
    await p.say("it flapped again")
    assert await p.run() == "awaiting_approval"
    await p.vote(BOB)
    assert await p.run() == "idle"
    await p.door.rest(p.thread_id)
    return p


async def alerted(store: Store) -> Play:
    """An Alertmanager alert opens a thread (alert_received, with the source's
    instruction); the model looks and answers; the same alert fires again, then a
    person asks in the thread; the alert resolves (the thread says so, nobody runs)."""
    from engine.alerts import Alert

    model = ScriptedModel(
        [
            call("lookup", name="api latency"),
            say("p99 is high on api since 09:00; nothing changed in deploys."),
            say("Still firing: same cause."),
            say("Nothing to do now; it is recovering."),
        ]
    )
    p = play(store, "", model, "make_tools")

    async def received(status: Any, starts: str) -> None:
        alert = Alert(
            source="alertmanager",
            fingerprint="5b9b5a2e3c1f0a7d",
            status=status,
            summary="p99 latency above 2s on api",
            delivery=f"5b9b5a2e3c1f0a7d|{status}|{starts}",
            labels={"alertname": "HighLatency", "service": "api", "severity": "page"},
            annotations={"runbook_url": "https://runbooks.example/latency"},
            url="https://prometheus.example/graph?g0.expr=latency",
        )
        event = alert.event(
            channel=CHANNEL,
            instruction="Investigate with read-only tools and summarise. Do not act.",
        )
        done = await receive_alert(store, event, team=TEAM)
        p.thread_id = done.thread_id

    await received("firing", "2026-01-05T09:00:00Z")
    info = await store.get_thread(p.thread_id)
    # As delivery does once the alert is posted at the top of the channel.
    p.key = ThreadKey(TEAM, CHANNEL, "1767000011.000100")
    assert await store.set_root(p.thread_id, info.root_ts, p.key.root_ts)
    assert await p.run() == "idle"
    await received("firing", "2026-01-05T09:30:00Z")  # fired again: a new startsAt
    assert await p.run() == "idle"
    await p.say("is it still bad?")
    assert await p.run() == "idle"
    await received("resolved", "2026-01-05T09:30:00Z")
    assert await p.run() == "idle"
    await p.door.rest(p.thread_id)
    return p


async def stopped(store: Store) -> Play:
    """A plan message streamed and stopped, a 👍 on it; then the requester presses Slack's
    stop button before the model answers, and asks again (the model reads the stop)."""
    from engine.agent_inputs import give_feedback, request_stop

    model = ScriptedModel([call("lookup", name="api"), say("api is fine."), say("db is fine too.")])
    p = play(store, "1767000012.000100", model, "make_tools")
    await p.say("check the api")
    assert await p.run() == "idle"
    log = await store.select_events(p.thread_id)
    state = reduce(log)
    plan = "1767000012.000900"  # as bot.stream records the run's plan message
    streamed = [
        ev.MessagePosted(shows_event_id=log[0].event_id, channel=CHANNEL, ts=plan, kind="stream"),
        ev.StreamStopped(ts=plan, channel=CHANNEL),
    ]
    await store.append(p.thread_id, state.last_seq, streamed, state=state)
    fed = await give_feedback(
        store, p.thread_id, ts=plan, value="up", user=BOB, dedupe_key="click-feedback"
    )
    assert fed.event is not None and fed.event.type == "feedback_given"
    await p.say("and the db?")
    done = await request_stop(
        store, p.thread_id, decider=Decider(ALICE), reviewers=OPEN, dedupe_key="stop-1"
    )
    assert done.event is not None and done.event.type == "stop_requested"
    assert await p.run() == "idle"  # stopped before the model was asked
    await p.say("the db, please")
    assert await p.run() == "idle"
    await p.door.rest(p.thread_id)
    return p


THREADS: dict[str, Callable[[Store], Awaitable[Play]]] = {
    "approvals": approvals,
    "clarified": clarified,
    "reconciled": reconciled,
    "retried": retried,
    "compacted": compacted,
    "cancelled": cancelled,
    "withdrawn": withdrawn,
    "reminded": reminded,
    "edited": edited,
    "granted": granted,
    "alerted": alerted,
    "stopped": stopped,
}


def row_json(event: ev.Event) -> str:
    row = mapper.to_row(event)
    row["created_at"] = row["created_at"].isoformat()
    return json.dumps(row, ensure_ascii=False)


async def export(name: str, p: Play) -> None:
    log = await p.store.select_events(p.thread_id)
    status = reduce(log).status
    bad = [r.verdict() for r in replay_all(log, p.runner.tools.all()) if not r.matches]
    assert not bad, f"{name}: {bad}"
    header = {
        "golden": FORMAT,
        "thread": name,
        "about": " ".join((THREADS[name].__doc__ or "").split()),
        "release": version("opsloop"),
        "key": {"team": p.key.team, "channel": p.key.channel, "root_ts": p.key.root_ts},
        "tools_from": demo_tools.__name__,
        "tools": [p.factory],
        "status": status,
        "events": len(log),
    }
    lines = [json.dumps(header, ensure_ascii=False), *(row_json(e) for e in log)]
    (HERE / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{name}.jsonl: written, {len(log)} events, {status}")


def types_on_disk() -> set[str]:
    return {
        json.loads(line)["type"]
        for path in HERE.glob("*.jsonl")
        for line in path.read_text(encoding="utf-8").splitlines()[1:]
    }


async def write(overwrite: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(f"sqlite:///{tmp}/golden.db")
        try:
            for name, script in THREADS.items():
                if (HERE / f"{name}.jsonl").exists() and not overwrite:
                    # An existing file is what an older release wrote: that is its worth.
                    print(f"{name}.jsonl: kept")
                    continue
                await export(name, await script(store))
        finally:
            await store.close()
    missing = [t for t in ev.EVENT_TYPES if t not in types_on_disk()]
    if missing:
        raise SystemExit(f"no golden thread holds {', '.join(missing)}: add a thread above")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the golden logs that are missing.")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="rewrite the files that exist too (they stand for an older release's logs)",
    )
    asyncio.run(write(parser.parse_args(argv).overwrite))


if __name__ == "__main__":
    main()
