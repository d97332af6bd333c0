"""``POST /hooks/github``: a signed ``workflow_run`` delivery ends the wait on its run,
once, whether or not the poll got there first; anything else is refused or ignored
and stores nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bot.github_hooks import PATH, add_github_hook_route
from bot.hooks import add_hook_route
from bot.runtime import Runtime, web_app
from engine import events as ev
from engine.config_file import parse_config
from engine.events import utcnow
from engine.inputs import Decider, decide_approval, post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.fakes.github import REPO, TOKEN, WEBHOOK_SECRET, FakeGitHub, delivery, signature
from tools import ToolRegistry
from tools.integrations.config import GitHubConfig
from tools.integrations.github import GitHubSource


def config(url: str, secret: str | None = WEBHOOK_SECRET) -> GitHubConfig:
    raw: dict[str, Any] = {"token": TOKEN, "api_url": url, "repos": [REPO], "poll_every": "15s"}
    if secret:
        raw["webhook_secret"] = secret
    return GitHubConfig.model_validate(raw)


@pytest.fixture
async def gh() -> AsyncIterator[FakeGitHub]:
    async with FakeGitHub() as fake:
        yield fake


class Waiting:
    """A thread whose approved deploy dispatched a run and waits on it."""

    def __init__(self, store: Store, gh: FakeGitHub, registry: ToolRegistry) -> None:
        self.store, self.gh, self.registry = store, gh, registry
        self.thread_id = ""
        self.run_id = 0

    def runner(self, *, later: timedelta = timedelta(0)) -> Runner:
        model = ScriptedModel(
            [
                call("github_dispatch_workflow", repo=REPO, workflow="deploy.yml", ref="main"),
                say("The deploy finished."),
            ]
        )
        return Runner(self.store, model, self.registry, clock=lambda: utcnow() + later)

    async def start(self, ts: str = "1.5") -> Waiting:
        key = ThreadKey("T1", "C1", ts)
        posted = await post_user_message(self.store, key, text="deploy", user="U_ALICE")
        self.thread_id = posted.thread_id
        state = await self.runner().run(self.thread_id)
        assert state is not None and state.pending is not None
        await decide_approval(
            self.store,
            self.thread_id,
            tool_call_id=state.pending.tool_call_id,
            decider=Decider("U_BOB"),
            decision="approve",
            reviewers=ReviewerRule(),
        )
        state = await self.runner().run(self.thread_id)
        assert state is not None and state.status == "awaiting_job", state
        assert state.pending is not None and state.pending.wait is not None
        self.run_id = state.pending.wait.data["github_run"]["run_id"]
        return self

    async def finished(self) -> list[ev.WaitFinished]:
        events = await self.store.select_events(self.thread_id)
        return [e for e in events if isinstance(e, ev.WaitFinished)]


@pytest.fixture
async def registry(gh: FakeGitHub) -> AsyncIterator[ToolRegistry]:
    source = GitHubSource(config(gh.url))
    reg = ToolRegistry()
    for tool in await source.open():
        reg.register(tool)
    try:
        yield reg
    finally:
        await source.close()


async def hook_client(
    store: Store, gh: FakeGitHub, kicked: list[str], secret: str | None = WEBHOOK_SECRET
) -> TestClient:
    app = web.Application()
    add_github_hook_route(app, store, config(gh.url, secret), kicked.append)
    add_hook_route(app, store, "hook-secret", kicked.append)  # as serve: after ours
    return TestClient(TestServer(app))


async def test_a_signed_completed_run_ends_its_wait_with_the_run_result(
    store: Store, gh: FakeGitHub, registry: ToolRegistry
) -> None:
    waiting = await Waiting(store, gh, registry).start()
    gh.complete(waiting.run_id, "failure", failed=("deploy",))
    body, headers = delivery(gh.workflow_run_event(waiting.run_id))
    kicked: list[str] = []
    async with await hook_client(store, gh, kicked) as client:
        resp = await client.post(PATH, data=body, headers=headers)
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["finished"] is True
        redelivered = await client.post(PATH, data=body, headers=headers)
        assert redelivered.status == 200
        assert (await redelivered.json())["matched"] is False  # nothing waits on it now
    [done] = await waiting.finished()
    assert done.actor == "github"
    assert done.result["conclusion"] == "failure"
    assert done.result["failed_jobs"] == ["deploy"]
    assert done.result["run_id"] == waiting.run_id
    assert done.result["html_url"].endswith(f"/actions/runs/{waiting.run_id}")
    assert done.result["found"] == "returned by the dispatch"
    assert kicked == [waiting.thread_id]
    state = await waiting.runner().run(waiting.thread_id)
    assert state is not None and state.status == "idle"


async def test_unsigned_or_wrongly_signed_deliveries_are_refused_and_store_nothing(
    store: Store, gh: FakeGitHub, registry: ToolRegistry
) -> None:
    waiting = await Waiting(store, gh, registry).start()
    gh.complete(waiting.run_id)
    body, headers = delivery(gh.workflow_run_event(waiting.run_id))
    _, wrong = delivery(gh.workflow_run_event(waiting.run_id), secret="not-the-secret")
    before = await store.select_events(waiting.thread_id)
    kicked: list[str] = []
    async with await hook_client(store, gh, kicked) as client:
        unsigned = {k: v for k, v in headers.items() if k != "X-Hub-Signature-256"}
        assert (await client.post(PATH, data=body, headers=unsigned)).status == 401
        resp = await client.post(PATH, data=body, headers=wrong)
        assert resp.status == 401 and (await resp.json())["error"] == "bad signature"
        malformed = {**headers, "X-Hub-Signature-256": "sha1=abc"}
        assert (await client.post(PATH, data=body, headers=malformed)).status == 401
        twice = [*headers.items(), ("X-Hub-Signature-256", headers["X-Hub-Signature-256"])]
        assert (await client.post(PATH, data=body, headers=twice)).status == 401
        tampered = body.replace(b'"success"', b'"failure"')
        assert (await client.post(PATH, data=tampered, headers=headers)).status == 401
    async with await hook_client(store, gh, kicked, secret=None) as client:
        resp = await client.post(PATH, data=body, headers=headers)
        assert resp.status == 401 and "webhook_secret is not set" in (await resp.json())["error"]
    assert await store.select_events(waiting.thread_id) == before
    assert kicked == []


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({"action": "completed", "repository": {"full_name": REPO}}).encode(),
        json.dumps(
            {"action": "completed", "workflow_run": {"id": "12"}, "repository": {}}
        ).encode(),
        json.dumps(
            {"action": "completed", "workflow_run": {"id": 12}, "repository": "acme/api"}
        ).encode(),
    ],
)
async def test_a_signed_body_that_is_not_a_workflow_run_event_is_a_400(
    store: Store, gh: FakeGitHub, registry: ToolRegistry, raw: bytes
) -> None:
    waiting = await Waiting(store, gh, registry).start()
    before = await store.select_events(waiting.thread_id)
    _, headers = delivery({})
    headers["X-Hub-Signature-256"] = signature(WEBHOOK_SECRET, raw)
    async with await hook_client(store, gh, []) as client:
        resp = await client.post(PATH, data=raw, headers=headers)
        assert resp.status == 400, await resp.text()
        assert "error" in await resp.json()
    assert await store.select_events(waiting.thread_id) == before


async def test_pings_other_events_and_runs_not_ours_are_answered_200_and_ignored(
    store: Store, gh: FakeGitHub, registry: ToolRegistry
) -> None:
    waiting = await Waiting(store, gh, registry).start()
    before = await store.select_events(waiting.thread_id)
    running = gh.workflow_run_event(waiting.run_id, action="in_progress")
    elsewhere = gh.workflow_run_event(waiting.run_id)
    elsewhere["repository"] = {"full_name": "acme/other"}
    pushed = gh.workflow_run_event(waiting.run_id)
    pushed["workflow_run"]["event"] = "push"
    unknown_run = gh.workflow_run_event(waiting.run_id)
    unknown_run["workflow_run"]["id"] = 1
    async with await hook_client(store, gh, []) as client:
        body, headers = delivery({"zen": "Keep it logically awesome.", "hook_id": 1}, event="ping")
        ping = await client.post(PATH, data=body, headers=headers)
        assert ping.status == 200 and (await ping.json())["pong"] is True
        body, headers = delivery({"ref": "refs/heads/main"}, event="push")
        assert (await client.post(PATH, data=body, headers=headers)).status == 200
        for payload in (running, elsewhere, pushed, unknown_run):
            body, headers = delivery(payload)
            resp = await client.post(PATH, data=body, headers=headers)
            assert resp.status == 200, await resp.text()
            assert (await resp.json()).get("finished") is not True
    assert await store.select_events(waiting.thread_id) == before


async def test_a_webhook_and_a_poll_racing_finish_the_wait_once(
    store: Store, gh: FakeGitHub, registry: ToolRegistry
) -> None:
    """The poll has asked GitHub and learnt the run ended when the delivery ends the
    wait; its own ending then conflicts, and the thread goes on from the webhook's."""
    waiting = await Waiting(store, gh, registry).start()
    gh.complete(waiting.run_id)
    gate = gh.hold("GET", f"/actions/runs/{waiting.run_id}")
    polling = asyncio.create_task(
        waiting.runner(later=timedelta(seconds=16)).run(waiting.thread_id)
    )
    await gh.wait_for(lambda c: c.path.endswith(f"/actions/runs/{waiting.run_id}"))
    body, headers = delivery(gh.workflow_run_event(waiting.run_id))
    async with await hook_client(store, gh, []) as client:
        resp = await client.post(PATH, data=body, headers=headers)
        assert (await resp.json())["finished"] is True
    gate.set()  # the poll's answer arrives after the webhook's ending
    state = await polling
    assert state is not None and state.status == "idle"
    [done] = await waiting.finished()
    assert done.actor == "github"
    answers = [e for e in await store.select_events(waiting.thread_id) if e.type == "final_answer"]
    assert len(answers) == 1


async def test_a_webhook_after_the_poll_ended_the_wait_changes_nothing(
    store: Store, gh: FakeGitHub, registry: ToolRegistry
) -> None:
    waiting = await Waiting(store, gh, registry).start()
    gh.complete(waiting.run_id)
    state = await waiting.runner(later=timedelta(seconds=16)).run(waiting.thread_id)
    assert state is not None and state.status == "idle"
    [polled] = await waiting.finished()
    assert polled.actor == "tool"
    before = await store.select_events(waiting.thread_id)
    body, headers = delivery(gh.workflow_run_event(waiting.run_id))
    kicked: list[str] = []
    async with await hook_client(store, gh, kicked) as client:
        resp = await client.post(PATH, data=body, headers=headers)
        assert resp.status == 200
        assert (await resp.json())["matched"] is False  # no thread waits on it any more
    assert await store.select_events(waiting.thread_id) == before
    assert kicked == []


async def test_when_github_cannot_name_the_failed_jobs_the_wait_is_left_to_the_poll(
    store: Store, gh: FakeGitHub, registry: ToolRegistry
) -> None:
    waiting = await Waiting(store, gh, registry).start()
    gh.complete(waiting.run_id, "failure", failed=("build",))
    gh.fail("GET", "/jobs", 502)
    body, headers = delivery(gh.workflow_run_event(waiting.run_id))
    async with await hook_client(store, gh, []) as client:
        resp = await client.post(PATH, data=body, headers=headers)
        assert resp.status == 202 and (await resp.json())["finished"] is False
    assert await waiting.finished() == []
    state = await waiting.runner(later=timedelta(seconds=16)).run(waiting.thread_id)
    assert state is not None and state.status == "idle"
    [done] = await waiting.finished()
    assert done.result["failed_jobs"] == ["build"]


async def test_serve_routes_hooks_github_to_github_not_to_the_wait_hooks(
    store: Store, gh: FakeGitHub
) -> None:
    """``/hooks/{wait_id}`` would match ``/hooks/github`` too: ours is added first."""
    file = parse_config(
        f"integrations:\n  github:\n    token: {TOKEN}\n    api_url: {gh.url}\n"
        f"    repos: [{REPO}]\n    webhook_secret: {WEBHOOK_SECRET}\n",
        {},
    )
    nothing = cast(Any, None)  # the Slack side and the worker: not used by the hooks
    runtime = Runtime(store, *(nothing,) * 5, kick=lambda thread_id: None, config=file)
    runtime = dataclasses.replace(runtime, background=SimpleNamespace(sources=[]))  # no MCP
    body, headers = delivery({"zen": "Design for failure.", "hook_id": 1}, event="ping")
    async with TestClient(TestServer(web_app(runtime))) as client:
        resp = await client.post(PATH, data=body, headers=headers)
        assert resp.status == 200 and (await resp.json())["pong"] is True
