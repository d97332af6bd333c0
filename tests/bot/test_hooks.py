"""``POST /hooks/{wait_id}`` resumes a thread waiting on a job, only when signed."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections import Counter

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict

from bot import signing
from bot.hooks import MAX_BODY, SIGNATURE_HEADER, TIMESTAMP_HEADER, add_hook_route, signature
from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.runner import Runner
from engine.store import ThreadKey
from tests.support.demo_tools import make_tools

SECRET = "hook-secret-3c9d"


def signed_headers(
    body: bytes, wait_id: str, secret: str = SECRET, at: float | None = None
) -> dict[str, str]:
    stamp = str(int(at or time.time()))
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: signature(secret, stamp, wait_id, body)}


async def waiting_thread(store, ts: str = "1.5") -> tuple[str, str]:
    effects: Counter = Counter({"poll": -100})  # the job never finishes by itself
    model = ScriptedModel([call("train", name="m1"), say("trained")])
    posted = await post_user_message(
        store, ThreadKey("T", "C", ts), text="train it", user="U1", dedupe_key=f"e{ts}"
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
        bad = await client.post(
            f"/hooks/{wait_id}", data=body, headers=signed_headers(body, wait_id, "x")
        )
        assert bad.status == 401
        stale = signed_headers(body, wait_id, at=time.time() - 3600)
        assert (await client.post(f"/hooks/{wait_id}", data=body, headers=stale)).status == 401
        assert (await client.post(f"/hooks/{wait_id}", data=body)).status == 401
        assert (await store.load(thread_id)).status == "awaiting_job"  # nothing changed

        headers = signed_headers(body, wait_id)
        ok = await client.post(f"/hooks/{wait_id}", data=body, headers=headers)
        assert ok.status == 200, await ok.text()
        again = await client.post(f"/hooks/{wait_id}", data=body, headers=headers)
        assert again.status == 200  # a redelivery is a no-op
        unknown = b"{}"
        missing = await client.post(
            "/hooks/thr_nope.abc", data=unknown, headers=signed_headers(unknown, "thr_nope.abc")
        )
        assert missing.status == 404
    events = await store.select_events(thread_id)
    finished = [e for e in events if e.type == "wait_finished"]
    assert len(finished) == 1 and finished[0].result == {"accuracy": 0.93}
    assert kicked == [thread_id]


def by_the_contract(body: bytes, wait_id: str, stamp: str) -> dict[str, str]:
    """Headers built from DESIGN.md's words alone, not from our helper."""
    base = f"v1:{stamp}:{wait_id}:".encode() + body
    digest = hmac.new(SECRET.encode(), base, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: f"v1={digest}"}


async def test_a_signature_replayed_to_another_wait_never_finishes_it(store):
    first, first_wait = await waiting_thread(store, "1.5")
    other, other_wait = await waiting_thread(store, "2.5")
    kicked: list[str] = []
    body = json.dumps({"accuracy": 0.93}).encode()
    headers = by_the_contract(body, first_wait, str(int(time.time())))
    async with await _hook_client(store, kicked) as client:
        replayed = await client.post(f"/hooks/{other_wait}", data=body, headers=headers)
        assert replayed.status == 401, await replayed.text()
        assert (await client.post(f"/hooks/{first_wait}", data=body, headers=headers)).status == 200
        for wait_id in (first_wait, other_wait, first_wait, other_wait):  # and after it is used
            resp = await client.post(f"/hooks/{wait_id}", data=body, headers=headers)
            assert resp.status == (200 if wait_id == first_wait else 401)
    finished = [e for e in await store.select_events(first) if e.type == "wait_finished"]
    assert len(finished) == 1 and finished[0].wait_id == first_wait  # stored once
    assert [e for e in await store.select_events(other) if e.type == "wait_finished"] == []
    assert (await store.load(other)).status == "awaiting_job"
    assert kicked == [first]


async def test_a_v0_signature_is_refused_and_the_log_says_why(store, caplog):
    caplog.set_level(logging.INFO, logger="opsloop.hooks")
    thread_id, wait_id = await waiting_thread(store)
    body = b'{"accuracy": 0.93}'
    stamp = str(int(time.time()))
    v0 = {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: signing.signature(SECRET, stamp, body)}
    assert v0[SIGNATURE_HEADER].startswith("v0=")  # what a sender on the old scheme sends
    async with await _hook_client(store, []) as client:
        resp = await client.post(f"/hooks/{wait_id}", data=body, headers=v0)
        assert resp.status == 401
        assert "v0 signatures are no longer accepted" in (await resp.json())["error"]
    assert (await store.load(thread_id)).status == "awaiting_job"
    [line] = [r for r in caplog.records if "v0" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert line.getMessage().startswith("hook refused: v0 signatures are no longer accepted")


async def test_without_a_secret_hooks_are_refused(store):
    thread_id, wait_id = await waiting_thread(store)
    app = web.Application()
    add_hook_route(app, store, None, lambda _t: None)
    async with TestClient(TestServer(app)) as client:
        body = b"{}"
        resp = await client.post(
            f"/hooks/{wait_id}", data=body, headers=signed_headers(body, wait_id)
        )
        assert resp.status == 401
        assert "OPSLOOP_WEBHOOK_SECRET" in (await resp.json())["error"]
    assert (await store.load(thread_id)).status == "awaiting_job"


async def _hook_client(store, kicked: list[str]):
    app = web.Application()
    add_hook_route(app, store, SECRET, kicked.append)
    return TestClient(TestServer(app))


async def pieces(body: bytes, size: int):
    """The body as a chunked upload, a few bytes at a time (what arrives, arrives late)."""
    for i in range(0, len(body), size):
        await asyncio.sleep(0.01)
        yield body[i : i + size]


@pytest.mark.parametrize("how", ["two chunks", "many small chunks", "400 KB", "400 KB chunked"])
async def test_a_signed_body_is_read_whole_however_it_arrives(store, how: str) -> None:
    thread_id, wait_id = await waiting_thread(store)
    big = how.startswith("400 KB")
    result = {"log": "x" * 400_000} if big else {"accuracy": 0.93, "note": "y" * 5000}
    body = json.dumps(result).encode()
    kicked: list[str] = []
    async with await _hook_client(store, kicked) as client:
        data = (
            body
            if how == "400 KB"
            else pieces(body, len(body) // 2 + 1 if how == "two chunks" else 1000)
        )
        resp = await client.post(
            f"/hooks/{wait_id}", data=data, headers=signed_headers(body, wait_id)
        )
        assert resp.status == 200, await resp.text()
    [finished] = [e for e in await store.select_events(thread_id) if e.type == "wait_finished"]
    assert finished.result == result
    assert kicked == [thread_id]


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_is_413(store, chunked: bool) -> None:
    thread_id, wait_id = await waiting_thread(store)
    body = json.dumps({"log": "x" * (MAX_BODY + 10)}).encode()
    async with await _hook_client(store, []) as client:
        data = pieces(body, 256 * 1024) if chunked else body
        resp = await client.post(
            f"/hooks/{wait_id}", data=data, headers=signed_headers(body, wait_id)
        )
        assert resp.status == 413
    assert (await store.load(thread_id)).status == "awaiting_job"


def _with(body: bytes, wait_id: str, name: str, value: str) -> dict[str, str]:
    return {**signed_headers(body, wait_id), name: value}


def _repeated_stamp(body: bytes, wait_id: str) -> CIMultiDict[str]:
    headers = CIMultiDict(signed_headers(body, wait_id))
    headers.add(TIMESTAMP_HEADER, "abc")
    return headers


@pytest.mark.parametrize(
    ("name", "body", "headers", "status"),
    [
        ("non-ASCII signature", b"{}", lambda b, w: _with(b, w, SIGNATURE_HEADER, "v1=é"), 401),
        ("repeated timestamp", b"{}", _repeated_stamp, 401),
        ("timestamp not a number", b"{}", lambda b, w: _with(b, w, TIMESTAMP_HEADER, "abc"), 401),
        ("deep JSON", b"[" * 100_000 + b"]" * 100_000, signed_headers, 400),
        ("unsigned deep JSON", b"[" * 100_000 + b"]" * 100_000, lambda b, w: {}, 401),
        ("not UTF-8", b'{"a": "\xff"}', signed_headers, 400),
        ("a list", b"[1, 2]", signed_headers, 400),
    ],
)  # fmt: skip
async def test_hostile_hooks_are_4xx_without_a_traceback(
    store, caplog, name: str, body: bytes, headers, status: int
) -> None:
    caplog.set_level(logging.INFO)
    thread_id, wait_id = await waiting_thread(store)
    async with await _hook_client(store, []) as client:
        resp = await client.post(f"/hooks/{wait_id}", data=body, headers=headers(body, wait_id))
        assert resp.status == status, (name, await resp.text())
    assert (await store.load(thread_id)).status == "awaiting_job"
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
