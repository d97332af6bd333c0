"""An MCP server's question in a Slack thread (issue 16, "elicitation as a durable
question"): the question is posted with its buttons; Answer opens the modal built from
the requested schema; a submission that does not fit it is refused under its inputs and
stores nothing; a good one is stored once (Slack resends it) and the call goes on with
it, the server receiving the content; Decline reaches the server as a decline; only the
requester may answer. The run's plan message comes first, its task card saying to look
at the question below it (a stream cannot hold the question's buttons). Real SDK
servers over stdio (2026-07-28: ``InputRequiredResult``) and streamable HTTP (handshake
era: ``elicitation/create`` in the session); signed requests through the Bolt app;
SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.delivery import Delivery
from bot.limits import check_limits
from bot.outbox import shown_event
from bot.render.elicitation import ANSWER_ACTION, DECLINE_ACTION, FORM_CALLBACK
from bot.render.tasks import WAITING_FOR_ANSWER
from engine import events as ev
from engine.config_file import PolicyRule
from engine.events import utcnow
from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.rules import PolicySet
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.bot.test_app import ANN, CHANNEL, EVE, Served, button, served
from tests.fakes import slack as fake
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.support.fakes import FakeClock
from tests.tools.test_mcp import HttpServer, stdio
from tools import ToolRegistry
from tools.mcp import McpServerConfig, McpSource

pytestmark = pytest.mark.slow

RUN_NOW = PolicySet((PolicyRule.model_validate({"tool": "mcp__*", "policy": "run_now"}),))


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture(params=["stdio-input", "http-classic"])
async def source(request: pytest.FixtureRequest) -> AsyncIterator[McpSource]:
    transport, kind = request.param.split("-")
    flags = ("--ask",) if kind == "input" else ("--ask", "--legacy")
    http = None
    if transport == "stdio":
        server = stdio(*flags)
    else:
        http = HttpServer(port=0, flags=flags)
        http.start()
        server = McpServerConfig(url=http.url)
    src = McpSource("demo", server)
    await src.open()
    yield src
    await src.close()
    if http is not None:
        http.stop()


class Thread:
    """A thread whose call of ``mcp__demo__ask`` asks the requester, run and shown."""

    def __init__(self, store: Store, slack: FakeSlack, source: McpSource) -> None:
        self.store, self.slack = store, slack
        self.clock = FakeClock(utcnow())
        registry = ToolRegistry()
        for tool in source.offered:
            registry.register(tool)
        model = ScriptedModel([call("mcp__demo__ask"), say("Deployed.")])
        self.runner = Runner(store, model, registry, policy=RUN_NOW, clock=self.clock)
        self.delivery = Delivery(
            store,
            AsyncWebClient(token=TOKEN, base_url=slack.url),
            owner="proc",
            retry_base=None,
            clock=self.clock,
        )
        self.tid = ""

    async def ask(self) -> dict[str, Any]:
        """The requester's message, run until the server asks; the question's post."""
        root = self.slack.add_message(CHANNEL, "deploy api", user=ANN)["ts"]
        key = ThreadKey(TEAM_ID, CHANNEL, root)
        self.tid = (await post_user_message(self.store, key, text="deploy api", user=ANN)).thread_id
        state = await self.runner.run(self.tid)
        assert state is not None and state.status == "awaiting_job", state
        await self.delivery.deliver(self.tid)
        types = {e.event_id: e.type for e in await self.events()}
        posts = [m for m in self.slack.posted(CHANNEL) if shown_event(m, self.tid)]
        [asked] = [m for m in posts if types.get(shown_event(m, self.tid) or "") == "wait_started"]
        # The run's plan message, above the question, says to look there.
        [plan] = [m for m in self.slack.posted(CHANNEL) if self.slack.stream(CHANNEL, m["ts"])]
        stream = self.slack.stream(CHANNEL, plan["ts"])
        assert stream is not None and stream["state"] == "stopped"
        [card] = stream["tasks"].values()
        assert card["title"].endswith(WAITING_FOR_ANSWER) and card["status"] == "in_progress"
        assert float(plan["ts"]) < float(asked["ts"])
        assert "Which deploy?" not in json.dumps(plan["blocks"])  # asked once, below
        return asked

    async def go_on(self) -> ev.ToolResult:
        state = await self.runner.run(self.tid)
        assert state is not None and state.status == "idle", state
        [done] = [e for e in await self.events() if isinstance(e, ev.ToolResult)]
        return done

    async def events(self) -> list[ev.AnyEvent]:
        return list(await self.store.select_events(self.tid))


def buttons(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        e["action_id"]: e
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
    }


async def open_form(s: Served, value: str, user: str = ANN) -> dict[str, Any]:
    before = len(s.slack.calls_to("views.open"))
    click = button(user, ANSWER_ACTION, value)
    assert (await s.send(click))[0] == 200
    opened = await s.slack.wait_for("views.open", before + 1)
    assert opened[-1].params["trigger_id"] == click["trigger_id"]
    view = opened[-1].params["view"]
    return json.loads(view) if isinstance(view, str) else view


def by_label(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["label"]["text"]: b for b in view["blocks"] if b["type"] == "input"}


def form(view: dict[str, Any], name: str, env_option: str) -> dict[str, Any]:
    """The submission of ``view`` with Name and env set, the rest left as it opened."""
    values: dict[str, Any] = {}
    for label, block in by_label(view).items():
        element = block["element"]
        if element["type"] == "plain_text_input":
            text = name if label == "Name" else element.get("initial_value")
            state: dict[str, Any] = {"type": "plain_text_input", "value": text}
        else:
            chosen = element.get("initial_option")
            if label == "env":
                chosen = next(o for o in element["options"] if o["value"] == env_option)
            state = {"type": "static_select", "selected_option": chosen}
        values[block["block_id"]] = {"value": state}
    return fake.view_submission_payload(
        user=ANN,
        callback_id=view["callback_id"],
        private_metadata=view["private_metadata"],
        values=values,
        view_id="V0ASK00001",
        blocks=view["blocks"],
        title="Answer",
    )


async def test_the_question_is_answered_in_a_modal_and_the_server_gets_the_content(
    store: Store, slack: FakeSlack, source: McpSource
) -> None:
    t = Thread(store, slack, source)
    asked = await t.ask()
    assert check_limits(asked["blocks"]) == []
    text = json.dumps(asked["blocks"])
    assert f"<@{ANN}>" in text and "Which deploy?" in text
    found = buttons(asked)
    assert set(found) >= {ANSWER_ACTION, DECLINE_ACTION}
    async with served(store, slack) as s:
        before = await t.events()
        # Someone else may not answer: told privately, no modal, nothing stored.
        assert (await s.send(button(EVE, ANSWER_ACTION, found[ANSWER_ACTION]["value"])))[0] == 200
        await s.settle()
        assert slack.calls_to("views.open") == []
        view = await open_form(s, found[ANSWER_ACTION]["value"])
        assert await t.events() == before  # opening the modal stores nothing
        assert view["callback_id"] == FORM_CALLBACK and check_limits(view) == []
        assert set(by_label(view)) == {"Name", "count", "Proceed?", "env"}

        status, body = await s.send(form(view, "b", "1"))  # a name too short
        name_block = by_label(view)["Name"]["block_id"]
        assert status == 200 and json.loads(body)["response_action"] == "errors"
        assert set(json.loads(body)["errors"]) == {name_block}
        assert await t.events() == before

        assert (await s.send(form(view, "bob", "1")))[0] == 200
        assert (await s.send(form(view, "bob", "1"), retry=1))[0] == 200  # Slack resends
        finished = [e for e in await t.events() if isinstance(e, ev.WaitFinished)]
        assert len(finished) == 1 and finished[0].actor == ANN and finished[0].resumes
        content = {"name": "bob", "env": "prd", "count": 2, "ok": True}  # defaults filled
        assert finished[0].result == {"action": "accept", "content": content}
        assert finished[0].dedupe_key == "view:V0ASK00001"
        assert s.kicks and s.kicks[0] == t.tid
    assert any("only" in e["text"] and "can answer" in e["text"] for e in slack.ephemerals)
    done = await t.go_on()
    assert done.ok and done.output["structured"] == {
        "form": {"action": "accept", "content": content}
    }
    await t.delivery.deliver(t.tid)
    assert "answered the question" in json.dumps(slack.posted(CHANNEL))
    await t.delivery.close()


async def test_decline_reaches_the_server_and_a_second_click_changes_nothing(
    store: Store, slack: FakeSlack, source: McpSource
) -> None:
    t = Thread(store, slack, source)
    found = buttons(await t.ask())
    async with served(store, slack) as s:
        assert (await s.send(button(ANN, DECLINE_ACTION, found[DECLINE_ACTION]["value"])))[0] == 200
        assert (await s.send(button(ANN, DECLINE_ACTION, found[DECLINE_ACTION]["value"])))[0] == 200
        await s.settle()
    finished = [e for e in await t.events() if isinstance(e, ev.WaitFinished)]
    assert [e.result for e in finished] == [{"action": "decline"}]
    assert any("no longer open" in e["text"] for e in slack.ephemerals)
    done = await t.go_on()
    assert done.output["structured"] == {"form": {"action": "decline"}}
    await t.delivery.close()
