"""End-to-end latencies of real ``opsloop serve`` processes, on SQLite and PostgreSQL.

Run: ``.venv/bin/python bench/latency.py [--quick] [--flows-only]``. The fake Slack Web
API and the fake Anthropic API run in a process of their own
(``bench/_latency_fakes.py``) and stamp (``time.time()``) every post, update, streamed
message call (``chat.startStream`` / ``appendStream`` / ``stopStream``), loading status
(``assistant.threads.setStatus``), model request and streamed answer's first token as
it arrives; the model answers at once. Each *flow* is one Slack thread, tagged in its
first message so every stamp is matched to its thread (by thread ts, card ts or tag,
never by order):

1. mention → first post: an ``app_mention`` → the first message in it (a post or a plan
   message started); mention → loading status: from the mention's HTTP ack to the
   first ``assistant.threads.setStatus`` with words in that thread (target p99 < 300 ms
   on both backends);
2. the model asks for ``bench_deploy`` (approve_before_run): a card; Approve is clicked;
   click → card updated (``chat.update`` of that card) and click → tool started (the
   tool writes its own ``time.time()`` to a file when it runs);
3. the model asks a question (at the end of the run's plan message); the requester
   replies in the thread: reply → next model request;
4. the model starts ``bench_wait`` (wait_for_external_event); its wait id is read from
   the log and ``POST /hooks/{wait_id}`` is sent: webhook → resume (the next model
   request); the model streams its answer, ``STREAM_GAP_S`` between events: its first
   token → the first ``chat.startStream`` / ``appendStream`` carrying answer text in
   that thread (target p99 < 50 ms on both backends: issue 22's "first streamed
   character"); the thread is idle.

``--flows-only`` stops there (no alerts, CI runs, SIGKILL or adapter figure).

Then alerts: ``POST /alerts/alertmanager`` (Alertmanager's webhook JSON, one new alert
each, bearer token; ``alerts.alertmanager`` in an ``opsloop.yaml`` of the bench's) →
the thread's first model request: alert → first model request (target p50 < 200 ms on
both backends: a triage summary is due in the channel within 90 s of the page, and the
model's own time must be all of it).

Then GitHub Actions runs (``integrations.github`` against a fake GitHub in the bench's
own process, ``poll_every`` ``POLL_EVERY_S``; a rule lets ``github_dispatch_workflow``
dispatch without a card, ``wait_for_external_event``): the model dispatches a workflow
and the thread waits on its run; once the wait is in the log the fake completes the
run, and run finished → the thread's next model request is timed two ways: by a signed
``workflow_run`` webhook to ``POST /hooks/github`` (from the moment it is sent; target
p50 < 100 ms) and by polling alone (from the moment the run completed, at a random
phase of the polls; target: p99 within one ``poll_every``, plus the 100 ms a resume
may take).

Then SIGKILL → resume: a few threads are mentioned to one process and held inside their
model call; that process is SIGKILLed and a replacement started on the same database;
the figure is from the replacement being healthy (first 200 of ``/healthz``) to each
thread's model request arriving again (0 when it came before).

Then model first token → ``on_text`` first character (``bench/model_stream.py``, once,
no database): the Anthropic adapter's share of a streamed answer's first character
(target p99 < 50 ms).

SQLite: one process (a temporary file). PostgreSQL: a schema of its own, dropped after,
and two replicas: mentions go to replica 1; clicks, replies and webhooks to replica 2;
replica 1 is the one killed. Every ``OPSLOOP_*`` setting keeps its default (lease 30 s,
sweep 1 s). One JSON line on stdout, logs on stderr. Targets (PostgreSQL, two
replicas): the first five p50 under 100 ms; SIGKILL → resume under 2 s (every thread,
both backends); the loading status and the streamed character as above.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import model_stream  # noqa: E402
from bench._latency_fakes import (  # noqa: E402
    ANSWER,
    CI_REPO,
    QUESTION,
    REQUESTER,
    SHOWS,
    STREAM_GAP_S,
    Stamp,
    Stamps,
    next_record,
    run_fakes,
    shown_in,
)
from bench._serve import Replica, post_hook, post_slack, serve_env  # noqa: E402
from bench.slack_ack import PG_URL, log  # noqa: E402
from bot.render.approval import APPROVE_ACTION  # noqa: E402
from bot.render.common import parse_binding  # noqa: E402
from engine import events as ev  # noqa: E402
from engine.store import Store, ThreadKey, open_store  # noqa: E402
from tests.fakes.github import TOKEN as GITHUB_TOKEN  # noqa: E402
from tests.fakes.github import WEBHOOK_SECRET as GITHUB_SECRET  # noqa: E402
from tests.fakes.github import FakeGitHub, delivery  # noqa: E402
from tests.fakes.slack import (  # noqa: E402
    BOT_USER_ID,
    TEAM_ID,
    app_mention_event,
    block_actions_payload,
    message_event,
)

REVIEWER = "U0BENCHREV"
TARGET_P50_MS = 100.0
TARGET_RESUME_MS = 2000.0
TARGET_ALERT_P50_MS = 200.0
ALERT = "alert_to_model_request"
ALERT_TOKEN = "bench-alertmanager-token"
# Run finished → the thread's next model request, woken by GitHub's webhook or by a poll.
RUN_WEBHOOK = "run_finished_to_model_request_webhook"
RUN_POLLING = "run_finished_to_model_request_polling"
POLL_EVERY_S = 2.0  # integrations.github.poll_every of the bench (GitHub's default: 15 s)
TARGET_POLL_MS = POLL_EVERY_S * 1000 + TARGET_P50_MS  # one poll_every, plus a resume
FIVE = (
    "mention_to_first_post",
    "click_to_card_updated",
    "click_to_tool_started",
    "reply_to_model_request",
    "webhook_to_resume",
)
SIGKILL = "sigkill_to_resume"
KILLED = "kill_to_resume"  # from the SIGKILL itself, for the record (no target)
# Issue 22's live plan: the mention's ack → the thread's first loading status, and the
# model's first token of the streamed answer → the answer's first character at Slack.
LOADING = "mention_to_loading_status"
STREAMED = "first_token_to_first_streamed_character"
TARGET_LOADING_P99_MS = 300.0
TARGET_STREAMED_P99_MS = 50.0
# A clicking person needs more than this to read a card: the bench waits as long after a
# thread came to rest before it acts, so an input never races the delivery of the last.
SETTLE_S = 0.3


@dataclass(frozen=True)
class Plan:
    warmup: int  # flows per backend not counted (imports, prepared statements, pools)
    flows: int
    kill_threads: int  # threads held in a model call when the process is SIGKILLed
    flows_only: bool = False  # the thread flows alone: no alerts, CI runs or SIGKILL

    @classmethod
    def pick(cls, quick: bool, flows_only: bool = False) -> Plan:
        warmup, flows, kills = (1, 5, 2) if quick else (2, 20, 4)
        return cls(warmup, flows, 0 if flows_only else kills, flows_only)

    @property
    def figures(self) -> tuple[str, ...]:
        """The figures this plan times, in the JSON line's order."""
        later = () if self.flows_only else (ALERT, RUN_WEBHOOK, RUN_POLLING, SIGKILL, KILLED)
        return (*FIVE, LOADING, STREAMED, *later)


@dataclass(frozen=True)
class Backend:
    name: str  # "sqlite" | "postgresql"
    channel: str
    first_ts: int  # thread i's root ts is f"{first_ts + i}.000100"
    replicas: int

    def root(self, i: int) -> str:
        return f"{self.first_ts + i}.000100"

    def tag(self, i: int) -> str:
        return f"{self.name[:2]}{i}"

    def ci_root(self, i: int, via: str) -> str:
        """Root ts of CI thread ``i`` (``via`` webhook | polling), apart from the others."""
        return f"{self.first_ts + (10_000 if via == 'webhook' else 20_000) + i}.000100"

    def ci_tag(self, i: int, via: str) -> str:
        return f"{'g' if via == 'webhook' else 'h'}{self.tag(i)}"


BACKENDS = (
    Backend("sqlite", "C0LATSQL", 1_700_100_000, 1),
    Backend("postgresql", "C0LATPG", 1_700_200_000, 2),
)


def mention_text(backend: Backend, i: int, flows: int) -> str:
    """Thread ``i``'s first message; threads from ``flows`` on are the kill threads."""
    if i >= flows:
        return f"<@{BOT_USER_ID}> hold tag=k{backend.tag(i)}"
    return f"<@{BOT_USER_ID}> deploy tag={backend.tag(i)}"


# --- one backend ------------------------------------------------------------------------


@dataclass
class Samples:
    ms: dict[str, list[float]]  # by figure, each timed at least once

    @classmethod
    def of(cls, plan: Plan) -> Samples:
        return cls({k: [] for k in plan.figures})

    def add(self, key: str, start: float, end: float) -> None:
        self.ms[key].append(max(0.0, end - start) * 1000)


@dataclass
class Bench:
    backend: Backend
    store: Store
    stamps: Stamps
    effects: Path
    http: aiohttp.ClientSession
    front: Replica  # gets the mentions
    back: Replica  # gets clicks, replies and webhooks (the other replica on PostgreSQL)
    github: FakeGitHub
    samples: Samples

    async def flow(self, i: int, keep: bool) -> None:
        """One thread: mention, approve, answer the question, end the wait (module doc)."""
        tag, root = self.backend.tag(i), self.backend.root(i)
        card = await self.mention(i, tag, root, keep)
        assert card.value is not None
        await asyncio.sleep(SETTLE_S)
        question = await self.approve(tag, root, card, keep)
        await asyncio.sleep(SETTLE_S)
        await self.reply(i, tag, root, question, keep)
        await asyncio.sleep(SETTLE_S)
        await self.end_wait(tag, root, parse_binding(card.value).thread_id, keep)

    async def mention(self, i: int, tag: str, root: str, keep: bool) -> Stamp:
        """The mention → its first message and its loading status; the approval card
        once it is posted."""
        b, s = self.backend, self.stamps
        t_mention = time.time()
        mention = app_mention_event(
            user=REQUESTER,
            text=mention_text(b, i, i + 1),
            channel=b.channel,
            ts=root,
            event_id=f"Ev{uuid.uuid4().hex[:12]}",
        )
        await post_slack(self.http, self.front, mention)
        t_ack = time.time()  # Slack has its 200: the loading status is timed from here
        first = await s.first(
            lambda x: x.kind in ("post", "start") and x.thread_ts == root and x.t >= t_mention,
            f"{tag}: a first message",
        )
        loading = await s.first(
            lambda x: (
                x.kind == "status" and x.thread_ts == root and x.text != "" and x.t >= t_mention
            ),
            f"{tag}: a loading status",
        )
        card = await s.first(
            lambda x: x.kind == "post" and x.thread_ts == root and x.value is not None,
            f"{tag}: the approval card",
        )
        if keep:
            self.samples.add("mention_to_first_post", t_mention, first.t)
            self.samples.add(LOADING, t_ack, loading.t)
        return card

    async def approve(self, tag: str, root: str, card: Stamp, keep: bool) -> Stamp:
        """Approve is clicked on ``card`` → the card updated, the tool started; the
        question shown (its stamp)."""
        b, s = self.backend, self.stamps
        assert card.value is not None and card.ts is not None
        t_click = time.time()
        click = block_actions_payload(
            user=REVIEWER,
            action_id=APPROVE_ACTION,
            value=card.value,
            channel=b.channel,
            message_ts=card.ts,
            thread_ts=root,
        )
        await post_slack(self.http, self.back, click)
        updated = await s.first(
            lambda x: x.kind == "update" and x.ts == card.ts and x.t >= t_click,
            f"{tag}: the card updated",
        )
        # The tool ran before the model hears its result: its stamp is in the file by now.
        await s.first(
            lambda x: x.kind == "model" and x.tag == tag and x.stage == 1, f"{tag}: result"
        )
        started = self.tool_stamp(tag)
        question = await s.first(
            lambda x: shown_in(x, root, QUESTION[:-1], t_click), f"{tag}: the question"
        )
        if keep:
            self.samples.add("click_to_card_updated", t_click, updated.t)
            self.samples.add("click_to_tool_started", t_click, started)
        return question

    async def reply(self, i: int, tag: str, root: str, question: Stamp, keep: bool) -> None:
        """The requester replies → the next model request; the run stops at the wait (its
        plan message stopped, or today's line)."""
        b, s = self.backend, self.stamps
        t_reply = time.time()
        reply = message_event(
            user=REQUESTER,
            text="eu-west",
            channel=b.channel,
            ts=f"{b.first_ts + i}.000200",
            thread_ts=root,
            event_id=f"Ev{uuid.uuid4().hex[:12]}",
        )
        await post_slack(self.http, self.back, reply)
        asked = await s.first(
            lambda x: x.kind == "model" and x.tag == tag and x.stage == 2 and x.t >= t_reply,
            f"{tag}: the model asked after the reply",
        )
        await s.first(
            lambda x: (
                (
                    (x.kind == "stop" and x.thread_ts == root and x.ts != question.ts)
                    or shown_in(x, root, "Waiting for", t_reply)
                )
                and x.t >= t_reply
            ),
            f"{tag}: the wait shown",
        )
        if keep:
            self.samples.add("reply_to_model_request", t_reply, asked.t)

    async def end_wait(self, tag: str, root: str, thread_id: str, keep: bool) -> None:
        """The webhook → the next model request; its answer streamed: the model's first
        token → the answer's first character at Slack."""
        s = self.stamps
        wait_id = await self.wait_id(thread_id)
        t_hook = time.time()
        await post_hook(self.http, self.back, wait_id, {"status": "finished", "tag": tag})
        resumed = await s.first(
            lambda x: x.kind == "model" and x.tag == tag and x.stage == 3 and x.t >= t_hook,
            f"{tag}: the model asked after the webhook",
        )
        token = await s.first(
            lambda x: x.kind == "token" and x.tag == tag and x.stage == 3 and x.t >= t_hook,
            f"{tag}: the answer's first token (is the model called streaming?)",
        )
        character = await s.first(
            lambda x: (
                (x.kind in ("start", "append") and x.thread_ts == root and bool(x.answer))
                and x.t >= t_hook
            ),
            f"{tag}: the answer's first character streamed",
        )
        # Both stamps are the fakes' process's clock: text cannot reach Slack before it.
        if character.t < token.t:
            raise RuntimeError(f"{tag}: answer text reached Slack before the model wrote it")
        await s.first(lambda x: shown_in(x, root, ANSWER, t_hook), f"{tag}: the final answer")
        if keep:
            self.samples.add("webhook_to_resume", t_hook, resumed.t)
            self.samples.add(STREAMED, token.t, character.t)

    async def alert_flow(self, i: int, keep: bool) -> None:
        """A new Alertmanager alert → the first model request of the thread it opens."""
        s, tag = self.stamps, f"a{self.backend.tag(i)}"
        t_alert = time.time()
        await post_alert(self.http, self.front, alertmanager_body(tag))
        asked = await s.first(
            lambda x: x.kind == "model" and x.tag == tag and x.t >= t_alert,
            f"{tag}: the model asked about the alert",
        )
        await s.first(
            lambda x: x.kind in SHOWS and f"tag {tag}." in x.text, f"{tag}: the summary shown"
        )
        if keep:
            self.samples.add(ALERT, t_alert, asked.t)

    async def ci_flow(self, i: int, via: str, keep: bool) -> None:
        """The model dispatches a workflow; once the thread waits on its run, the run
        completes and the webhook says so (``via`` webhook), or a poll finds it (polling):
        run finished → the thread's next model request."""
        b, s = self.backend, self.stamps
        tag, root = b.ci_tag(i, via), b.ci_root(i, via)
        mention = app_mention_event(
            user=REQUESTER,
            text=ci_text(tag),
            channel=b.channel,
            ts=root,
            event_id=f"Ev{uuid.uuid4().hex[:12]}",
        )
        await post_slack(self.http, self.front, mention)
        await self.github.wait_for(
            lambda c: (
                c.path.endswith("/dispatches")
                and (c.body or {}).get("inputs", {}).get("environment") == tag
            ),
            timeout=30,
        )
        run = next(r for r in self.github.runs.values() if r.inputs.get("environment") == tag)
        thread_id = await self.waiting(root, tag)
        await asyncio.sleep(SETTLE_S)
        if via == "webhook":
            self.github.complete(run.id)
            t_done = time.time()
            await post_github_hook(self.http, self.back, self.github.workflow_run_event(run.id))
        else:
            # The run ends at a random moment between two polls, as a real one would.
            await asyncio.sleep(random.uniform(0, POLL_EVERY_S))
            self.github.complete(run.id)
            t_done = time.time()
        asked = await s.first(
            lambda x: x.kind == "model" and x.tag == tag and x.stage == 1 and x.t >= t_done,
            f"{tag}: the model asked after the run finished",
        )
        await s.first(lambda x: shown_in(x, root, f"tag {tag}."), f"{tag}: the answer posted")
        events = await self.store.select_events(thread_id)
        [finished] = [e for e in events if isinstance(e, ev.WaitFinished)]
        expected = "github" if via == "webhook" else "tool"  # the hook's actor, or the poll's
        if finished.actor != expected:
            raise RuntimeError(f"{tag}: the wait was ended by {finished.actor}, not {expected}")
        if keep:
            self.samples.add(RUN_WEBHOOK if via == "webhook" else RUN_POLLING, t_done, asked.t)

    async def waiting(self, root: str, tag: str, within: float = 30) -> str:
        """The thread at ``root`` once its wait on the run is in the log."""
        key = ThreadKey(TEAM_ID, self.backend.channel, root)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            thread_id = await self.store.find_thread(key)
            if thread_id is not None:
                events = await self.store.select_events(thread_id)
                if any(isinstance(e, ev.WaitStarted) for e in events):
                    return thread_id
            await asyncio.sleep(0.02)
        raise RuntimeError(f"{tag}: no wait on the run within {within:.0f} s")

    def tool_stamp(self, tag: str) -> float:
        rows = [json.loads(line) for line in self.effects.read_text().splitlines()]
        mine = [r for r in rows if r["tag"] == tag]
        if len(mine) != 1:
            raise RuntimeError(f"{tag}: bench_deploy ran {len(mine)} times, not once")
        return float(mine[0]["t"])

    async def wait_id(self, thread_id: str) -> str:
        events = await self.store.select_events(thread_id)
        waits = [e for e in events if isinstance(e, ev.WaitStarted)]
        if len(waits) != 1:
            raise RuntimeError(f"{thread_id}: {len(waits)} wait_started events, not 1")
        return waits[0].wait_id

    async def kill_and_resume(
        self, replicas: list[Replica], count: int, first_index: int, log_dir: Path
    ) -> None:
        """Mention threads (to each replica in turn) that are held in their model call, until one
        replica runs ``count`` of them (any replica may take a new thread); SIGKILL that
        one and start its replacement (added to ``replicas``); sample the replacement's
        healthy moment → each of those threads' next model request."""
        b, s = self.backend, self.stamps
        by_pid = {r.proc.pid: r for r in replicas if r.proc is not None}
        held: dict[int, list[tuple[str, str]]] = {pid: [] for pid in by_pid}  # (tag, root)
        for j in range(count * len(replicas)):  # then one replica surely runs `count`
            if max(len(v) for v in held.values()) == count:
                break
            i = first_index + j
            tag, root = f"k{b.tag(i)}", b.root(i)
            mention = app_mention_event(
                user=REQUESTER,
                text=mention_text(b, i, first_index),
                channel=b.channel,
                ts=root,
                event_id=f"Ev{uuid.uuid4().hex[:12]}",
            )
            # Alternately to each replica, as a load balancer would.
            await post_slack(self.http, replicas[j % len(replicas)], mention)
            await s.first(model_call(tag, nth=1), f"{tag}: held in its model call")
            pid = await self.lease_pid(root)
            if pid not in held:
                raise RuntimeError(f"{tag}: held by no replica of the bench (pid {pid})")
            held[pid].append((tag, root))
        pid = max(held, key=lambda p: len(held[p]))
        victim, on_victim = by_pid[pid], held.pop(pid)
        assert victim.proc is not None
        victim.kill()
        await victim.proc.wait()
        killed_at = time.time()
        elsewhere = sum(len(v) for v in held.values())
        log(f"{victim.name} SIGKILLed while it ran {count} threads ({elsewhere} ran elsewhere)")
        replacement = Replica(f"{victim.name}-replacement", victim.env, log_dir)
        replicas.append(replacement)  # stopped with the others, whatever happens next
        await replacement.start()
        for tag, _root in on_victim:
            again = await s.first(
                model_call(tag, nth=2),
                f"{tag}: resumed after the SIGKILL",
                within=120,
            )
            self.samples.add(SIGKILL, replacement.healthy_at, again.t)
            self.samples.add(KILLED, killed_at, again.t)
        for _tag, root in on_victim:
            await s.first(showing(root, "Resumed"), f"{root}: answered")
        for tag, root in [h for v in held.values() for h in v]:
            # Not interrupted: answered "held" after HOLD_S by the replica that ran it.
            # Not a sample, so only a warning when it is not seen.
            try:
                await s.first(showing(root, "held"), f"{tag}: answered")
            except RuntimeError as exc:
                asked = [(x.nth, round(x.t - killed_at, 2)) for x in s.seen if x.tag == tag]
                log(
                    f"warning: a thread the surviving replica ran: {exc}; its model requests "
                    f"(nth, seconds after the kill): {asked}"
                )

    async def lease_pid(self, root: str) -> int | None:
        """The pid in the lease owner of the thread at ``root`` (owners are
        ``host:pid:random``, a delivery's with ``/delivery`` after it)."""
        thread_id = await self.store.find_thread(ThreadKey(TEAM_ID, self.backend.channel, root))
        if thread_id is None:
            return None
        owner = (await self.store.get_thread(thread_id)).lease_owner or ""
        parts = owner.split("/")[0].split(":")
        return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def model_call(tag: str, *, nth: int) -> Callable[[Stamp], bool]:
    """A match for the ``nth`` model request of the thread tagged ``tag``."""
    return lambda x: x.kind == "model" and x.tag == tag and x.nth == nth


def showing(root: str, text: str) -> Callable[[Stamp], bool]:
    """A match for ``text`` shown in the thread at ``root``."""
    return lambda x: shown_in(x, root, text)


def alertmanager_body(tag: str) -> dict[str, Any]:
    """What Alertmanager posts for one new firing alert (webhook version 4)."""
    alert = {
        "status": "firing",
        "labels": {"alertname": "BenchAlert", "severity": "page", "tag": tag},
        "annotations": {"summary": f"bench alert tag={tag}"},
        "startsAt": "2025-01-06T09:00:00.000Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=bench",
        "fingerprint": f"bench-{tag}-{uuid.uuid4().hex[:8]}",
    }
    return {
        "version": "4",
        "status": "firing",
        "receiver": "opsloop",
        "groupKey": f'{{}}:{{alertname="BenchAlert",tag="{tag}"}}',
        "truncatedAlerts": 0,
        "groupLabels": {"alertname": "BenchAlert"},
        "commonLabels": alert["labels"],
        "commonAnnotations": alert["annotations"],
        "externalURL": "http://alertmanager:9093",
        "alerts": [alert],
    }


def ci_text(tag: str) -> str:
    return f"<@{BOT_USER_ID}> ship it through CI tag={tag}"


async def post_github_hook(
    http: aiohttp.ClientSession, replica: Replica, payload: dict[str, Any]
) -> None:
    """A ``workflow_run`` delivery, signed as GitHub signs it; it must end the wait."""
    body, headers = delivery(payload, secret=GITHUB_SECRET)
    async with http.post(f"{replica.base}/hooks/github", data=body, headers=headers) as resp:
        text = await resp.text()
        if resp.status != 200 or not json.loads(text).get("finished"):
            raise RuntimeError(f"{replica.name} answered {resp.status} to the run's hook: {text}")


async def post_alert(http: aiohttp.ClientSession, replica: Replica, body: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {ALERT_TOKEN}", "Content-Type": "application/json"}
    url = f"{replica.base}/alerts/alertmanager"
    async with http.post(url, data=json.dumps(body).encode(), headers=headers) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"{replica.name} answered {resp.status} to the alert: {text}")


def bench_config(backend: Backend, github_url: str) -> str:
    """The bench's opsloop.yaml: Alertmanager's alerts, and the fake GitHub whose
    dispatches need no approval (the flows above time approvals already)."""
    return (
        f"alerts:\n  alertmanager:\n    channel: {backend.channel}A\n    token: {ALERT_TOKEN}\n"
        "integrations:\n  github:\n"
        f"    token: {GITHUB_TOKEN}\n    api_url: {github_url}\n    repos: [{CI_REPO}]\n"
        f"    webhook_secret: {GITHUB_SECRET}\n    poll_every: {POLL_EVERY_S:g}s\n"
        # No card: it dispatches and waits at once (run_now would refuse to wait).
        "policy:\n  - tool: github_dispatch_workflow\n    policy: wait_for_external_event\n"
    )


async def run_backend(
    backend: Backend,
    db_url: str,
    plan: Plan,
    stamps: Stamps,
    urls: tuple[str, str],
    tmp: Path,
    github: FakeGitHub,
) -> dict[str, Any]:
    slack_url, claude_url = urls
    effects = tmp / f"{backend.name}-effects.jsonl"
    effects.write_text("")  # a kept log directory may hold an earlier run's
    config = tmp / f"{backend.name}-opsloop.yaml"
    config.write_text(bench_config(backend, github.url))
    env = serve_env(
        db_url,
        slack_url,
        claude_url,
        OPSLOOP_TOOLS="bench._latency_tools",
        BENCH_LATENCY_EFFECTS=str(effects),
        OPSLOOP_CONFIG=str(config),
    )
    store = await open_store(db_url)  # the tables exist before two replicas start at once
    replicas: list[Replica] = []
    try:
        names = [f"{backend.name}-{k + 1}" for k in range(backend.replicas)]
        replicas += [Replica(name, env, tmp) for name in names]
        await asyncio.gather(*(r.start() for r in replicas))
        async with aiohttp.ClientSession() as http:
            front, back = replicas[0], replicas[-1]
            bench = Bench(
                backend, store, stamps, effects, http, front, back, github, Samples.of(plan)
            )
            try:
                await run_phases(bench, plan, replicas, tmp)
            except BaseException:
                for seen in stamps.seen[-20:]:  # what the fakes saw last
                    log(f"seen: {seen.kind} {seen.tag or seen.thread_ts} {seen.text[:80]!r}")
                for r in replicas:
                    log(f"{r.name}{r.tail()}")
                raise
    finally:
        for r in replicas:
            await r.stop()
        await store.close()
    result = summary(bench.samples)
    for key, row in result.items():
        log(f"{backend.name} {key}: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms (n={row['n']})")
    return {"replicas": backend.replicas, **result}


async def run_phases(bench: Bench, plan: Plan, replicas: list[Replica], tmp: Path) -> None:
    """The flows, then (unless ``plan.flows_only``) alerts, CI runs and the SIGKILL."""
    name, total = bench.backend.name, plan.warmup + plan.flows
    for i in range(total):
        await bench.flow(i, keep=i >= plan.warmup)
    log(f"{name}: {plan.flows} flows timed")
    if plan.flows_only:
        return
    for i in range(total):
        await bench.alert_flow(i, keep=i >= plan.warmup)
    log(f"{name}: {plan.flows} alerts timed")
    for via in ("webhook", "polling"):
        for i in range(total):
            await bench.ci_flow(i, via, keep=i >= plan.warmup)
        log(f"{name}: {plan.flows} workflow runs timed ({via})")
    await bench.kill_and_resume(replicas, plan.kill_threads, total, tmp)


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(samples: Samples) -> dict[str, dict[str, float]]:
    return {
        key: {
            "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(quantile(ms, 0.99), 1),
            "n": len(ms),
        }
        for key, ms in samples.ms.items()
    }


# --- main --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def pg_schema(url: str):
    admin = await asyncpg.connect(url.split("?")[0], timeout=10)
    schema = f"opsloop_bench_{uuid.uuid4().hex[:10]}"
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{url}{'&' if '?' in url else '?'}schema={schema}"
    finally:
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.close()
        log(f"dropped schema {schema}")


async def fakes_urls(fakes: Any, urls: multiprocessing.Queue) -> tuple[str, str]:
    for _ in range(600):
        got = await asyncio.to_thread(next_record, urls, 0.1)
        if got is not None:
            return got
        if not fakes.is_alive():
            raise RuntimeError(f"the fakes' process exited with {fakes.exitcode}")
    raise RuntimeError("the fakes' process did not start within 60 s")


# Each backend's targets: (figure, quantile, bound in ms); the first five are PostgreSQL's.
TARGETS = (
    (LOADING, "p99", TARGET_LOADING_P99_MS),
    (STREAMED, "p99", TARGET_STREAMED_P99_MS),
    (SIGKILL, "p99", TARGET_RESUME_MS),
    (ALERT, "p50", TARGET_ALERT_P50_MS),
    (RUN_WEBHOOK, "p50", TARGET_P50_MS),
    (RUN_POLLING, "p99", TARGET_POLL_MS),
)


def targets(plan: Plan) -> dict[str, float]:
    """The targets of the figures ``plan`` times, as the JSON line lists them."""
    out = {"postgresql_first_five_p50_ms<": TARGET_P50_MS}
    out |= {f"{k}_{q}_ms<": bound for k, q, bound in TARGETS if k in plan.figures}
    if not plan.flows_only:
        out[f"{model_stream.KEY}_p99_ms<"] = model_stream.TARGET_P99_MS
    return out


def verdict(results: dict[str, dict[str, Any]]) -> dict[str, bool]:
    pg = results.get("postgresql")
    checks = {f"postgresql_{k}_p50": pg[k]["p50_ms"] < TARGET_P50_MS for k in FIVE} if pg else {}
    for name, row in results.items():
        for key, q, bound in TARGETS:
            if key in row:
                checks[f"{name}_{key}_{q}"] = row[key][f"{q}_ms"] < bound
    return checks


async def main(
    quick: bool, only: str | None = None, logs: Path | None = None, flows_only: bool = False
) -> dict[str, Any]:
    plan = Plan.pick(quick, flows_only)
    started = time.monotonic()
    count = plan.warmup + plan.flows + plan.kill_threads * max(b.replicas for b in BACKENDS)
    flows = plan.warmup + plan.flows
    roots = [
        (b.channel, mention_text(b, i, flows), b.root(i)) for b in BACKENDS for i in range(count)
    ]
    roots += [
        (b.channel, ci_text(b.ci_tag(i, via)), b.ci_root(i, via))
        for b in BACKENDS
        for via in ("webhook", "polling")
        for i in range(flows)
    ]
    spawn = multiprocessing.get_context("spawn")
    urls_q: multiprocessing.Queue = spawn.Queue()
    records: multiprocessing.Queue = spawn.Queue()
    stop = spawn.Event()
    fakes = spawn.Process(target=run_fakes, args=(roots, urls_q, records, stop), daemon=True)
    fakes.start()
    stamps = Stamps(records)
    pump = asyncio.create_task(stamps.pump())
    results: dict[str, dict[str, Any]] = {}
    try:
        urls = await fakes_urls(fakes, urls_q)
        # GitHub runs in this process: the bench completes its runs and sends their hooks.
        github = FakeGitHub(repos=(CI_REPO,))
        github.workflows[CI_REPO] = []
        inputs = {"environment", "opsloop_key"}
        github.add_workflow(CI_REPO, "deploy.yml", inputs=inputs, run_name="{opsloop_key}")
        async with github:
            with tempfile.TemporaryDirectory(prefix="opsloop-latency-") as tmp:
                sqlite, pg = BACKENDS
                where = logs or Path(tmp)  # the processes' logs (and the tool's stamps)
                if only in (None, "sqlite"):
                    db = f"sqlite:///{Path(tmp) / 'latency.db'}"
                    results["sqlite"] = await run_backend(
                        sqlite, db, plan, stamps, urls, where, github
                    )
                if only in (None, "postgresql"):
                    async with pg_schema(PG_URL) as url:
                        results["postgresql"] = await run_backend(
                            pg, url, plan, stamps, urls, where, github
                        )
    finally:
        stamps.closed = True
        await pump
        stop.set()
        await asyncio.to_thread(fakes.join, 30)
        if fakes.is_alive():
            fakes.kill()
    checks = verdict(results)
    adapter: dict[str, Any] = {}
    if not plan.flows_only:
        # The Anthropic adapter's share of the first streamed character (no database).
        streamed = await model_stream.measure(40 if quick else 200)
        adapter[model_stream.KEY] = streamed
        checks[f"{model_stream.KEY}_p99"] = streamed["p99_ms"] < model_stream.TARGET_P99_MS
    missed = [k for k, ok in checks.items() if not ok]
    log(f"done in {time.monotonic() - started:.0f} s; missed: {missed}")
    return {
        "bench": "latency",
        "flows": plan.flows,
        "kill_threads": plan.kill_threads,
        "flows_only": plan.flows_only,
        "model_latency_ms": 0,
        "stream_gap_ms": STREAM_GAP_S * 1000,
        **adapter,
        **results,
        "targets": targets(plan),
        "poll_every_s": POLL_EVERY_S,
        "checks": checks,
        "pass": all(checks.values()),
    }


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="5 flows and 2 killed threads a backend"
    )
    parser.add_argument(
        "--backend", choices=("sqlite", "postgresql"), help="only this one (default: both)"
    )
    parser.add_argument(
        "--logs", type=Path, metavar="DIR", help="keep the serve processes' logs in DIR"
    )
    parser.add_argument(
        "--flows-only",
        action="store_true",
        help="only the thread flows (the first five figures, loading status, streamed answer)",
    )
    args = parser.parse_args(argv)
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    try:
        result = asyncio.run(main(args.quick, args.backend, args.logs, args.flows_only))
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"latency: PostgreSQL unavailable: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"latency: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
