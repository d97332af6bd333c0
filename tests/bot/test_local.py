"""``opsloop local`` in-process: the page's API drives the real Bolt app, runtime and worker
through signed Slack requests, against the local Web API; no browser, no network.

The model is a script (the offline phrasebook is tested by its own author); the tools are
the built-ins (``create_ticket`` needs approval).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.local_mode import Local, start_local
from bot.render.approval import APPROVE_ACTION, EDIT_ACTION, REJECT_ACTION
from bot.render.edit import APPROVE_BLOCK, EDIT_CALLBACK, VALUE_ACTION
from bot.render.modals import REASON_ACTION, REASON_BLOCK, REJECT_CALLBACK
from bot.runtime import bind
from engine.config import load_settings
from engine.models.scripted import ScriptedModel, Step, call, say
from engine.replay import replay
from engine.trace import trace_record
from localslack.identity import LOCAL
from tools import REGISTRY

ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"
OPS = "C0OPS"
BOT = LOCAL.bot_user_id
FILE_A_TICKET: list[Step] = [
    call("create_ticket", title="Flaky deploys", _text="Filing a ticket for the flakes."),
    say("Filed the ticket."),
]


class Page:
    """What the page does, through its JSON API (and its event stream)."""

    def __init__(self, local: Local, http: aiohttp.ClientSession) -> None:
        self.local = local
        self.url = local.url
        self.http = http

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path.lstrip("/"), params=params) as resp:
            return resp.status, await resp.json()

    async def post(self, path: str, body: Any, **headers: str) -> tuple[int, Any]:
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        headers = {"Content-Type": "application/json", **headers}
        async with self.http.post(self.url + path.lstrip("/"), data=data, headers=headers) as r:
            return r.status, await r.json()

    async def say(self, user: str, text: str, thread_ts: str | None = None, channel: str = OPS):
        body = {"user": user, "channel": channel, "text": text}
        if thread_ts:
            body["thread_ts"] = thread_ts
        status, answer = await self.post("/ui/messages", body)
        assert status == 201, answer
        return answer["message"]

    async def thread(self, root: str, user: str = ALICE, channel: str = OPS) -> dict[str, Any]:
        status, data = await self.get(f"/ui/channels/{channel}/threads/{root}", user=user)
        assert status == 200, data
        return data

    async def wait_thread(
        self,
        root: str,
        check: Callable[[dict[str, Any]], Any],
        user: str = ALICE,
        channel: str = OPS,
        within: float = 15,
    ) -> dict[str, Any]:
        """The thread once ``check(thread)`` holds (polled)."""
        async with asyncio.timeout(within):
            while True:
                data = await self.thread(root, user, channel)
                if check(data):
                    return data
                await asyncio.sleep(0.05)

    async def click(self, user: str, message: dict[str, Any], action_id: str) -> dict[str, Any]:
        body = {"user": user, "channel": OPS, "message_ts": message["ts"], "action_id": action_id}
        status, answer = await self.post("/ui/actions", body)
        assert status == 200, answer
        return answer


class Stream:
    """One page's server-sent events, collected in the background."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.changed = asyncio.Event()

    async def read(self, resp: aiohttp.ClientResponse) -> None:
        kind = ""
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                self.events.append((kind, json.loads(line[6:])))
                self.changed.set()

    async def wait(self, kind: str, check: Callable[[dict[str, Any]], Any] = bool) -> dict:
        async with asyncio.timeout(15):
            while True:
                for seen, data in self.events:
                    if seen == kind and check(data):
                        return data
                self.changed.clear()
                await self.changed.wait()

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


@contextlib.asynccontextmanager
async def stream(page: Page, user: str) -> AsyncIterator[Stream]:
    collected = Stream()
    resp = await page.http.get(page.url + "ui/events", params={"user": user})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    task = asyncio.create_task(collected.read(resp))
    try:
        await collected.wait("hello")
        yield collected
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await task
        resp.release()


Start = Callable[..., Awaitable[Page]]


@pytest.fixture
async def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Start]:
    """``await start(script)`` starts a local workspace (again, after a ``stop``) on one
    database and state file; everything is stopped at the end."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("OPSLOOP_TICKETS_URL", f"sqlite:///{tmp_path / 'tickets.db'}")
    # Inputs kick the worker; the sweep runs at start only (see _no_sweep_in_flight).
    settings = load_settings(
        {"DATABASE_URL": f"sqlite:///{tmp_path / 'local.db'}", "OPSLOOP_SWEEP_SECONDS": "60"}
    )
    running: list[tuple[Local, aiohttp.ClientSession]] = []

    async def start_one(script: list[Step] = FILE_A_TICKET) -> Page:
        sock = bind("127.0.0.1", 0)
        try:
            local = await start_local(
                settings,
                sock,
                make_model=lambda: ScriptedModel(script),
                model_kind="offline",
                suggestions=[("file a ticket", "files a ticket after approval")],
                state=tmp_path / "workspace.json",
                retry_delays=(0.05, 0.2),
                bundled=False,  # the bundled demo has its own tests (test_local_demo.py)
            )
        except BaseException:
            sock.close()
            raise
        http = aiohttp.ClientSession()
        running.append((local, http))
        return Page(local, http)

    yield start_one
    for local, http in running:
        await stop(local, http)


async def stop(local: Local, http: aiohttp.ClientSession) -> None:
    if not http.closed:
        await http.close()
    if not local.ui.closing:
        await _no_sweep_in_flight(local)
        await local.close(5)


async def _no_sweep_in_flight(local: Local) -> None:
    """Wait out the sweep the worker runs at start: APScheduler's shutdown cancels a job
    in flight (AsyncIOExecutor.shutdown), and a sweep cancelled mid-query leaves its
    SQLite connection to the garbage collector, which pytest reports as unraisable."""
    scheduler = local.runtime.background.worker.scheduler
    job = scheduler._aps.get_job("opsloop-sweep")

    def busy() -> bool:
        return bool(scheduler._sweeps) or (
            job is not None and job.next_run_time <= scheduler.clock()
        )

    for _ in range(500):  # another thread's state: polled, for up to 10 s
        if not busy():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the worker's sweep never finished")


def card_of(thread: dict[str, Any], action: str = APPROVE_ACTION) -> dict[str, Any] | None:
    return next((m for m in thread["replies"] if action in json.dumps(m.get("blocks"))), None)


def texts(thread: dict[str, Any]) -> str:
    return json.dumps([m.get("blocks") or m.get("text") for m in thread["replies"]])


async def events_of(page: Page, root: str) -> list[Any]:
    store = page.local.runtime.store
    thread_id = await store.find_thread(_key(root))
    assert thread_id is not None
    return await store.select_events(thread_id)


def _key(root: str) -> Any:
    from engine.store import ThreadKey

    return ThreadKey(LOCAL.team_id, OPS, root)


# --- a mention starts a thread ---------------------------------------------------------------


async def test_a_mention_reaches_the_app_signed_and_becomes_a_thread(start: Start) -> None:
    page = await start()
    message = await page.say(ALICE, "@opsloop file a ticket & <quickly>")
    assert message["text"] == f"<@{BOT}> file a ticket &amp; &lt;quickly&gt;"  # as Slack's client
    root = message["ts"]
    thread = await page.wait_thread(root, card_of)
    bot = [m for m in thread["replies"] if m.get("bot_id") == LOCAL.bot_id]
    # The status message, the run's plan message (its task waits for the card), the card.
    assert len(bot) == 3
    assert "Waiting for approval" in texts(thread)

    # The app heard it as Slack tells it: app_mention and message, each signed (the app
    # refuses unsigned requests), stored once.
    events = await events_of(page, root)
    [asked] = [e for e in events if e.type == "user_message"]
    # Slack's escaping is kept, as bot.payloads.mention_text keeps it with real Slack.
    assert (asked.actor, asked.text) == (ALICE, "file a ticket &amp; &lt;quickly&gt;")
    assert asked.source["event_type"] in ("app_mention", "message")
    delivered = [e["event"]["type"] for e in page.local.link.delivered]
    assert "app_mention" in delivered and "message" in delivered
    async with page.http.post(page.url + "slack/events", data=b"{}") as unsigned:
        assert unsigned.status == 401

    # The channel lists it as a thread root with its replies.
    status, channel = await page.get(f"/ui/channels/{OPS}/messages", user=BOB)
    assert status == 200
    [listed] = channel["messages"]
    assert listed["ts"] == root and listed["reply_count"] == 3


async def test_a_reply_in_the_bots_thread_needs_no_mention(start: Start) -> None:
    page = await start([call("request_clarification", question="Which title?"), say("Done.")])
    root = (await page.say(ALICE, "@opsloop file a ticket"))["ts"]
    await page.wait_thread(root, lambda t: "Which title?" in texts(t))
    await page.say(ALICE, "Flaky deploys", thread_ts=root)
    await page.wait_thread(root, lambda t: "Done." in texts(t))
    events = await events_of(page, root)
    answer = next(e for e in events if e.type == "clarification_answered")
    assert answer.text == "Flaky deploys"


async def test_the_bots_posts_and_updates_stream_to_the_page(start: Start) -> None:
    page = await start()
    async with stream(page, BOB) as live:
        root = (await page.say(ALICE, "@opsloop file a ticket"))["ts"]
        mine = await live.wait("message", lambda d: d["message"]["ts"] == root)
        assert mine["channel"] == OPS and mine["message"]["user"] == ALICE
        posted = await live.wait(
            "message", lambda d: APPROVE_ACTION in json.dumps(d["message"].get("blocks"))
        )
        card = posted["message"]
        assert card["thread_ts"] == root and card["bot_id"] == LOCAL.bot_id
        assert (await page.click(BOB, card, APPROVE_ACTION))["ok"] is True
        updated = await live.wait(
            "message_changed",
            lambda d: d["message"]["ts"] == card["ts"] and "Approved by" in json.dumps(d),
        )
        assert f"<@{BOB}>" in json.dumps(updated["message"]["blocks"])


# --- the approval card ------------------------------------------------------------------------


async def test_approve_sends_a_signed_click_and_the_card_updates(start: Start) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop file a ticket"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    answer = await page.click(BOB, card, APPROVE_ACTION)
    assert answer == {"ok": True, "status": 200}
    thread = await page.wait_thread(root, lambda t: "Filed the ticket." in texts(t))
    decided = next(m for m in thread["replies"] if m["ts"] == card["ts"])
    shown = json.dumps(decided["blocks"])
    assert f"Approved by <@{BOB}>" in shown and APPROVE_ACTION not in shown
    assert decided["edited"]["user"] == BOT
    events = await events_of(page, root)
    granted = next(e for e in events if e.type == "approval_granted")
    assert granted.actor == BOB
    assert granted.dedupe_key.startswith("click:")  # the click's action_ts, as Slack sends it


async def test_the_reject_modal_round_trip_carries_the_reason(start: Start) -> None:
    page = await start([*FILE_A_TICKET[:1], say("Understood, no ticket.")])
    root = (await page.say(ALICE, "@opsloop file a ticket"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    async with stream(page, BOB) as bobs, stream(page, ALICE) as alices:
        assert (await page.click(BOB, card, REJECT_ACTION))["ok"] is True
        opened = (await bobs.wait("view_opened"))["view"]
        assert opened["callback_id"] == REJECT_CALLBACK
        status, views = await page.get("/ui/views", user=BOB)
        assert status == 200 and [v["id"] for v in views["views"]] == [opened["id"]]
        assert (await page.get("/ui/views", user=ALICE))[1]["views"] == []

        values = {REASON_BLOCK: {REASON_ACTION: "not during the freeze"}}
        status, answer = await page.post(
            f"/ui/views/{opened['id']}/submit", {"user": BOB, "values": values}
        )
        assert (status, answer) == (200, {"ok": True, "closed": True})
        await bobs.wait("view_closed", lambda d: d["id"] == opened["id"])
        await alices.wait("message_changed", lambda d: "Rejected by" in json.dumps(d))
        assert "view_opened" not in alices.kinds()  # a modal is its user's only
    thread = await page.wait_thread(root, lambda t: "Understood, no ticket." in texts(t))
    decided = next(m for m in thread["replies"] if m["ts"] == card["ts"])
    assert "not during the freeze" in json.dumps(decided["blocks"])
    events = await events_of(page, root)
    rejected = next(e for e in events if e.type == "approval_rejected")
    assert (rejected.actor, rejected.reason) == (BOB, "not during the freeze")
    assert (await page.get("/ui/views", user=BOB))[1]["views"] == []


async def test_the_edit_modal_round_trip_saves_approves_and_runs_the_edited_call(
    start: Start,
) -> None:
    """Issue 17 §2 in local mode: the page opens the Edit modal (a text input, a select,
    a checkbox) and submits it as Slack's client would; the ticket is filed as edited."""
    page = await start([*FILE_A_TICKET[:1], say("Filed it.")])
    root = (await page.say(ALICE, "@opsloop file a ticket"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    async with stream(page, BOB) as bobs:
        assert (await page.click(BOB, card, EDIT_ACTION))["ok"] is True
        opened = (await bobs.wait("view_opened"))["view"]
        assert opened["callback_id"] == EDIT_CALLBACK
        values = {
            "arg:title": {VALUE_ACTION: "Flaky deploys on Fridays"},
            "arg:priority": {VALUE_ACTION: '"high"'},
            APPROVE_BLOCK: {VALUE_ACTION: ["approve"]},
        }
        bad = {**values, "arg:priority": {VALUE_ACTION: '"whenever"'}}
        status, refused = await page.post(
            f"/ui/views/{opened['id']}/submit", {"user": BOB, "values": bad}
        )
        assert status == 400 and "no option" in refused["error"]  # the page offers none such
        status, answer = await page.post(
            f"/ui/views/{opened['id']}/submit", {"user": BOB, "values": values}
        )
        assert (status, answer) == (200, {"ok": True, "closed": True})
    thread = await page.wait_thread(root, lambda t: "Filed it." in texts(t))
    decided = next(m for m in thread["replies"] if m["ts"] == card["ts"])
    shown = json.dumps(decided["blocks"], ensure_ascii=False)
    assert "title: Flaky deploys → Flaky deploys on Fridays" in shown
    assert f"Approved by <@{BOB}>" in shown
    events = await events_of(page, root)
    edited = next(e for e in events if e.type == "approval_edited")
    assert edited.arguments == {"title": "Flaky deploys on Fridays", "priority": "high"}
    [result] = [e for e in events if e.type == "tool_result"]
    assert result.ok


async def test_a_modal_submitted_too_late_shows_the_apps_errors_and_stays_open(
    start: Start,
) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop file a ticket"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    async with stream(page, BOB) as bobs:
        await page.click(BOB, card, REJECT_ACTION)
        opened = (await bobs.wait("view_opened"))["view"]
        assert (await page.click(CAROL, card, APPROVE_ACTION))["ok"] is True  # carol was first
        await page.wait_thread(root, lambda t: "Approved by" in texts(t))
        status, answer = await page.post(
            f"/ui/views/{opened['id']}/submit", {"user": BOB, "values": {}}
        )
    assert status == 200 and answer["ok"] is False
    assert "Nothing changed" in answer["errors"][REASON_BLOCK]  # response_action: errors
    assert [v["id"] for v in (await page.get("/ui/views", user=BOB))[1]["views"]] == [opened["id"]]
    status, closed = await page.post(f"/ui/views/{opened['id']}/close", {"user": BOB})
    assert (status, closed) == (200, {"ok": True, "closed": True})
    assert (await page.get("/ui/views", user=BOB))[1]["views"] == []


async def test_an_ephemeral_note_is_shown_to_its_user_only(start: Start) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop file a ticket"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    async with stream(page, ALICE) as alices, stream(page, BOB) as bobs:
        assert (await page.click(ALICE, card, APPROVE_ACTION))["ok"] is True  # her own call
        note = await alices.wait("ephemeral")
        assert note["channel"] == OPS and note["message"]["thread_ts"] == root
        assert "Nothing changed" in note["message"]["text"]
        marker = await page.say(CAROL, "anyone?", thread_ts=root)
        await bobs.wait("message", lambda d: d["message"]["ts"] == marker["ts"])
        assert "ephemeral" not in bobs.kinds()
    assert [e["text"] for e in (await page.thread(root, ALICE))["ephemerals"]] == [
        note["message"]["text"]
    ]
    assert (await page.thread(root, BOB))["ephemerals"] == []
    events = await events_of(page, root)
    assert [e.type for e in events].count("approval_refused") == 1


# --- restarts ----------------------------------------------------------------------------------


async def test_the_workspace_survives_a_restart_and_the_card_still_works(
    start: Start, tmp_path: Path
) -> None:
    first = await start()
    root = (await first.say(ALICE, "@opsloop file a ticket"))["ts"]
    card = card_of(await first.wait_thread(root, card_of))
    assert card is not None
    await first.say(CAROL, "top-level chatter", channel="C0GENERAL")
    await stop(first.local, first.http)
    saved = json.loads((tmp_path / "workspace.json").read_text())
    assert root in json.dumps(saved["messages"][OPS])

    second = await start()
    status, channel = await second.get(f"/ui/channels/{OPS}/messages", user=BOB)
    assert status == 200 and [m["ts"] for m in channel["messages"]] == [root]
    _, general = await second.get("/ui/channels/C0GENERAL/messages", user=BOB)
    assert [m["text"] for m in general["messages"]] == ["top-level chatter"]
    thread = await second.thread(root, BOB)
    assert card_of(thread) == card
    assert (await second.click(BOB, card, APPROVE_ACTION))["ok"] is True
    done = await second.wait_thread(root, lambda t: "Filed the ticket." in texts(t))
    assert "Approved by" in texts(done)
    new = await second.say(ALICE, "@opsloop again?", channel="C0GENERAL")
    assert float(new["ts"]) > float(done["replies"][-1]["ts"])  # ts keep increasing


async def test_events_the_app_had_not_taken_are_delivered_after_a_restart(
    start: Start, tmp_path: Path
) -> None:
    first = await start()
    await first.local.link.close()  # the app hears nothing from now on
    root = (await first.say(ALICE, "@opsloop file a ticket"))["ts"]
    assert first.local.workspace.outbox  # kept, saved with the message
    await stop(first.local, first.http)

    second = await start()
    thread = await second.wait_thread(root, card_of)
    assert card_of(thread) is not None
    events = await events_of(second, root)
    assert [e.type for e in events].count("user_message") == 1


# --- the trace ----------------------------------------------------------------------------------


async def test_trace_and_replay_show_the_threads_log(start: Start) -> None:
    page = await start()
    root = (await page.say(ALICE, "@opsloop file a ticket"))["ts"]
    card = card_of(await page.wait_thread(root, card_of))
    assert card is not None
    await page.click(BOB, card, APPROVE_ACTION)
    await page.wait_thread(root, lambda t: "Filed the ticket." in texts(t))

    status, trace = await page.get("/ui/trace", channel=OPS, ts=root)
    assert status == 200
    # Delivery receipts may still be appended: what was read is a prefix of the log.
    events = (await events_of(page, root))[: len(trace["events"])]
    assert trace["events"] == [json.loads(json.dumps(trace_record(e))) for e in events]
    assert "final_answer" in [e["type"] for e in trace["events"]]
    assert len(trace["summaries"]) == len(events)
    assert trace["thread"]["status"] == "idle" and trace["thread"]["requester"] == ALICE
    assert trace["usage"]["model_decisions"] == 2

    decision = next(e for e in events if e.type == "model_decision")
    status, replayed = await page.get("/ui/replay", channel=OPS, ts=root, seq=str(decision.seq))
    assert status == 200
    assert replayed["seq"] == decision.seq and replayed["matches"] is True
    expected = replay(events, list(REGISTRY), decision.seq).prompt.body()
    assert replayed["request"] == json.loads(json.dumps(expected))

    status, error = await page.get("/ui/replay", channel=OPS, ts=root, seq="1")
    assert status == 404 and "no model decision at seq 1" in error["error"]
    status, error = await page.get("/ui/trace", channel=OPS, ts="1.000001")
    assert status == 404 and "no agent thread" in error["error"]


# --- more of Slack ------------------------------------------------------------------------------


async def test_a_direct_message_needs_no_mention_and_stays_private(start: Start) -> None:
    page = await start([say("Hello in private.")])
    im = "D0ALICE"
    root = (await page.say(ALICE, "hi there", channel=im))["ts"]
    await page.wait_thread(root, lambda t: "Hello in private." in texts(t), channel=im)
    delivered = [e["event"] for e in page.local.link.delivered]
    assert {"type": "message", "channel_type": "im"}.items() <= next(
        e for e in delivered if e.get("channel") == im and e.get("user") == ALICE
    ).items()
    assert not any(e["type"] == "app_mention" for e in delivered)
    status, error = await page.get(f"/ui/channels/{im}/messages", user=BOB)
    assert status == 404 and error == {"error": f"no channel '{im}' for {BOB}"}


async def test_the_slash_command_answers_its_user_only(start: Start) -> None:
    page = await start()
    status, answer = await page.post(
        "/ui/messages", {"user": BOB, "channel": OPS, "text": "/opsloop help"}
    )
    assert (status, answer) == (200, {"ok": True, "command": "/opsloop"})
    _, channel = await page.get(f"/ui/channels/{OPS}/messages", user=BOB)
    [note] = channel["ephemerals"]
    assert "/opsloop" in note["text"] and channel["messages"] == []
    assert (await page.get(f"/ui/channels/{OPS}/messages", user=ALICE))[1]["ephemerals"] == []
    status, error = await page.post(
        "/ui/messages", {"user": BOB, "channel": OPS, "text": "/deploy now"}
    )
    assert status == 400 and "not a command here" in error["error"]


async def test_the_home_tab_is_published_for_its_user(start: Start) -> None:
    page = await start()
    async with stream(page, BOB) as bobs:
        status, _ = await page.post("/ui/home", {"user": BOB})
        assert status == 202
        home = (await bobs.wait("home"))["view"]
    assert home["type"] == "home" and home["blocks"]
    assert (await page.get("/ui/home", user=BOB))[1]["view"] == home
    assert (await page.get("/ui/home", user=ALICE))[1]["view"] is None


async def test_the_page_and_its_files(start: Start) -> None:
    page = await start()
    async with page.http.get(page.url) as resp:
        assert resp.status == 200 and resp.content_type == "text/html"
        assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
        html = await resp.text()
    for name in ("app.js", "style.css", "mrkdwn.js", "blocks.js"):
        async with page.http.get(page.url + f"static/{name}") as resp:
            assert resp.status == 200, name
    async with page.http.get(page.url + "static/..%2Fserver.py") as resp:
        assert resp.status == 404 and "error" in await resp.json()
    status, info = await page.get("/ui/workspace", user=ALICE)
    assert status == 200
    assert info["model"] == {
        "kind": "offline",
        "name": "scripted",
        "suggestions": [{"phrase": "file a ticket", "does": "files a ticket after approval"}],
    }
    assert [c["id"] for c in info["channels"] if c["is_im"]] == ["D0ALICE"]
    assert {u["id"] for u in info["users"]} == {ALICE, BOB, CAROL}
    assert "data-testid" in html


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/ui/messages", {"user": "U0NOBODY", "channel": OPS, "text": "hi"}, 400, "unknown user"),
        ("/ui/messages", {"user": ALICE, "channel": "C0NOPE", "text": "hi"}, 404, "no channel"),
        ("/ui/messages", {"user": ALICE, "channel": OPS}, 400, "text"),
        ("/ui/messages", {"user": ALICE, "channel": OPS, "text": "  "}, 400, "write something"),
        ("/ui/messages", {"user": ALICE, "channel": OPS, "text": 5}, 400, "text"),
        ("/ui/messages", {"user": ALICE, "channel": OPS, "text": "x", "evil": 1}, 400, "evil"),
        (
            "/ui/messages",
            {"user": ALICE, "channel": OPS, "text": "x", "thread_ts": "1.000001"},
            404,
            "no thread",
        ),
        ("/ui/messages", "{not json", 400, "JSON"),
        ("/ui/messages", "[]", 400, ""),
        (
            "/ui/actions",
            {"user": BOB, "channel": OPS, "message_ts": "1.000001", "action_id": "x"},
            404,
            "no message",
        ),
        ("/ui/views/V0NOPE/submit", {"user": BOB, "values": {}}, 404, "no open modal"),
        ("/ui/home", {}, 400, "user"),
    ],
)
async def test_bad_input_is_a_4xx_with_a_one_line_error(
    start: Start, path: str, body: Any, status: int, needle: str
) -> None:
    page = await start()
    got, answer = await page.post(path, body)
    assert got == status, answer
    assert list(answer) == ["error"] and "\n" not in answer["error"]
    assert needle in answer["error"]


async def test_unknown_pages_and_methods_are_one_line_json(start: Start) -> None:
    page = await start()
    assert await page.get("/ui/nowhere") == (404, {"error": "Not Found"})
    async with page.http.get(page.url + "ui/messages") as resp:
        assert (resp.status, await resp.json()) == (405, {"error": "Method Not Allowed"})


async def test_requests_from_elsewhere_are_refused(start: Start) -> None:
    page = await start()
    message = {"user": ALICE, "channel": OPS, "text": "hi"}
    status, answer = await page.post("/ui/messages", message, Origin="https://evil.example")
    assert (status, answer) == (403, {"error": "cross-origin requests are refused"})
    status, answer = await page.post("/ui/messages", message, **{"Content-Type": "text/plain"})
    assert status == 415 and "JSON" in answer["error"]
    status, answer = await page.post("/ui/messages", message, Host="rebound.example:3000")
    assert status == 421 and "unexpected Host" in answer["error"]
    async with page.http.get(
        page.url + "ui/workspace", headers={"Host": "rebound.example"}
    ) as resp:
        assert resp.status == 421
    assert (await page.get(f"/ui/channels/{OPS}/messages", user=ALICE))[1]["messages"] == []


async def test_the_web_api_answers_like_slack(start: Start) -> None:
    page = await start()
    api = page.url + "api/"
    async with page.http.post(api + "auth.test") as resp:
        assert (resp.status, await resp.json()) == (200, {"ok": False, "error": "not_authed"})
    async with page.http.post(
        api + "chat.postMessage",
        data="{oops",
        headers={"Content-Type": "application/json", "Authorization": "Bearer x"},
    ) as resp:
        assert (resp.status, (await resp.json())["error"]) == (200, "invalid_json")
    async with page.http.post(
        api + "auth.test", headers={"Authorization": "Bearer xoxb-not-it"}
    ) as resp:
        assert (await resp.json())["error"] == "invalid_auth"
