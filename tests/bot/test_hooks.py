"""``POST /hooks/{wait_id}`` resumes a thread waiting on a job, only when signed."""

from __future__ import annotations

import json
import time
from collections import Counter

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bot.hooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, add_hook_route, signature
from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.runner import Runner
from engine.store import ThreadKey
from tests.support.demo_tools import make_tools

SECRET = "hook-secret-3c9d"


def signed_headers(body: bytes, secret: str = SECRET, at: float | None = None) -> dict[str, str]:
    stamp = str(int(at or time.time()))
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: signature(secret, stamp, body)}


async def waiting_thread(store) -> tuple[str, str]:
    effects: Counter = Counter({"poll": -100})  # the job never finishes by itself
    model = ScriptedModel([call("train", name="m1"), say("trained")])
    posted = await post_user_message(
        store, ThreadKey("T", "C", "1.5"), text="train it", user="U1", dedupe_key="e1"
    )
    state = await Runner(store, model, make_tools(effects)).run(posted.thread_id)
    assert state.status == "awaiting_job"
    return posted.thread_id, state.pending.wait.wait_id


async def test_a_signed_hook_finishes_the_wait_once(store):
    thread_id, wait_id = await waiting_thread(store)
    kicked: list[str] = []
    app = web.Application()
    add_hook_route(app, store, SECRET, kicked.append)
    async with TestClient(TestServer(app)) as client:
        body = json.dumps({"accuracy": 0.93}).encode()
        bad = await client.post(f"/hooks/{wait_id}", data=body, headers=signed_headers(body, "x"))
        assert bad.status == 401
        stale = signed_headers(body, at=time.time() - 3600)
        assert (await client.post(f"/hooks/{wait_id}", data=body, headers=stale)).status == 401
        assert (await client.post(f"/hooks/{wait_id}", data=body)).status == 401
        assert (await store.load(thread_id)).status == "awaiting_job"  # nothing changed

        headers = signed_headers(body)
        ok = await client.post(f"/hooks/{wait_id}", data=body, headers=headers)
        assert ok.status == 200, await ok.text()
        again = await client.post(f"/hooks/{wait_id}", data=body, headers=headers)
        assert again.status == 200  # a redelivery is a no-op
        unknown = b"{}"
        missing = await client.post(
            "/hooks/thr_nope.abc", data=unknown, headers=signed_headers(unknown)
        )
        assert missing.status == 404
    events = await store.select_events(thread_id)
    finished = [e for e in events if e.type == "wait_finished"]
    assert len(finished) == 1 and finished[0].result == {"accuracy": 0.93}
    assert kicked == [thread_id]


async def test_without_a_secret_hooks_are_refused(store):
    thread_id, wait_id = await waiting_thread(store)
    app = web.Application()
    add_hook_route(app, store, None, lambda _t: None)
    async with TestClient(TestServer(app)) as client:
        body = b"{}"
        resp = await client.post(f"/hooks/{wait_id}", data=body, headers=signed_headers(body))
        assert resp.status == 401
        assert "OPSLOOP_WEBHOOK_SECRET" in (await resp.json())["error"]
    assert (await store.load(thread_id)).status == "awaiting_job"
