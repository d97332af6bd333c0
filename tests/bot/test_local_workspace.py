"""The local workspace's parts without a server: state, saving, what Slack's client and
Slack itself would do with what people type and click, and the page's files."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from slack_sdk.signature import SignatureVerifier

from bot.payloads import mention_text, message_kind
from bot.render.approval import APPROVAL_BLOCK_PREFIX, APPROVE_ACTION, REJECT_ACTION, approval_card
from bot.render.edit import APPROVE_BLOCK, edit_modal, read_edit
from bot.render.modals import REASON_ACTION, REASON_BLOCK, REASON_MAX_LENGTH, reject_modal
from localslack import slack_requests as sr
from localslack.app_link import events_for
from localslack.identity import LOCAL, PEOPLE
from localslack.page_input import BadRequest, find_element, person_text, view_state
from localslack.server import allowed_hosts, local_workspace, page_url
from localslack.state_file import StateFile, StateFileError, state_path, write_atomically
from localslack.workspace import Change, TriggerError, Workspace, ts_key

STATIC = Path(__file__).resolve().parents[2] / "localslack" / "static"
OPS = "C0OPS"


def person_message(ws: Workspace, text: str, **extra: str) -> dict:
    message = {"type": "message", "user": "U0ALICE", "text": text, "ts": ws.next_ts(), **extra}
    return ws.add_message(extra.pop("channel", OPS), message)


# --- the state -----------------------------------------------------------------------------


def test_ts_are_increasing_even_when_the_clock_stands_still() -> None:
    ws = Workspace(LOCAL, clock=lambda: 1_700_000_000.0)
    first, second = ws.next_ts(), ws.next_ts()
    assert (first, second) == ("1700000000.000000", "1700000000.000001")
    ws.add_message(OPS, {"type": "message", "text": "x", "ts": "1800000000.000100"})
    assert ts_key(ws.next_ts()) > ts_key("1800000000.000100")


def test_listeners_hear_every_change_and_a_failing_one_stops_nobody() -> None:
    ws = local_workspace()
    heard: list[Change] = []

    def broken(_change: Change) -> None:
        raise RuntimeError("boom")

    ws.listen(broken)
    stop = ws.listen(heard.append)
    person_message(ws, "hi")
    ws.add_ephemeral({"channel": OPS, "user": "U0BOB", "text": "psst", "message_ts": "1.000001"})
    stop()
    person_message(ws, "unheard")
    assert [(c.kind, c.user) for c in heard] == [("message", None), ("ephemeral", "U0BOB")]


def test_only_an_ims_person_sees_it() -> None:
    ws = local_workspace()
    assert ws.can_see("U0ALICE", "D0ALICE") and not ws.can_see("U0BOB", "D0ALICE")
    assert ws.can_see("U0BOB", OPS) and not ws.can_see("U0BOB", "C0NOWHERE")
    assert ws.user("U0NOBODY") is None and ws.user(LOCAL.bot_user_id)["is_bot"] is True


def test_a_trigger_opens_one_modal_for_its_user_within_three_seconds(monkeypatch) -> None:
    ws = local_workspace()
    trigger = ws.issue_trigger("U0BOB")
    assert ws.exchange_trigger(trigger) == "U0BOB"
    with pytest.raises(TriggerError, match="exchanged_trigger_id"):
        ws.exchange_trigger(trigger)
    with pytest.raises(TriggerError, match="invalid_trigger_id"):
        ws.exchange_trigger("123.456.made-up")
    late = ws.issue_trigger("U0BOB")
    now = __import__("time").monotonic()
    monkeypatch.setattr("localslack.workspace.time.monotonic", lambda: now + 3.5)
    with pytest.raises(TriggerError, match="expired_trigger_id"):
        ws.exchange_trigger(late)


def test_a_snapshot_restores_messages_home_tabs_and_the_outbox() -> None:
    ws = local_workspace()
    root = person_message(ws, "hello")
    ws.publish_home("U0BOB", {"type": "home", "blocks": []})
    ws.outbox["Ev1"] = {"envelopes": [{"event_id": "Ev1"}], "at": 1.0}
    again = local_workspace()
    again.restore(json.loads(json.dumps(ws.snapshot())))
    assert again.messages == ws.messages and again.home_views == ws.home_views
    assert again.outbox == ws.outbox
    assert ts_key(again.next_ts()) > ts_key(root["ts"])
    for bad in ({}, {"version": 99}, {"version": 1, "messages": {"C1": [{"no": "ts"}]}}):
        with pytest.raises(ValueError):
            local_workspace().restore(bad)


# --- saving ----------------------------------------------------------------------------------


async def test_saves_are_atomic_and_coalesced(tmp_path: Path) -> None:
    path = tmp_path / "ws.json"
    ws = local_workspace()
    state = StateFile(path, ws)
    await state.save()
    assert json.loads(path.read_text())["messages"] == {}
    person_message(ws, "one")
    assert state.dirty
    mtime = path.stat().st_mtime_ns
    await state.save()
    await state.save()  # nothing new: not written again
    assert not state.dirty
    assert path.stat().st_mtime_ns >= mtime
    assert [m["text"] for m in json.loads(path.read_text())["messages"][OPS]] == ["one"]
    assert files_in(tmp_path) == ["ws.json"]  # no temporary file left
    restored = StateFile(path, local_workspace())
    assert restored.load() and restored.workspace.messages == ws.messages


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "ws.json"
    write_atomically(path, '{"old": true}')

    def no_rename(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, '{"new": true}')
    assert json.loads(path.read_text()) == {"old": True}
    assert files_in(tmp_path) == ["ws.json"]


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_broken_state_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ws.json"
    path.write_text("{half")
    with pytest.raises(StateFileError) as info:
        StateFile(path, local_workspace()).load()
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert not StateFile(tmp_path / "none.json", local_workspace()).load()


def test_the_state_file_lives_beside_a_sqlite_database() -> None:
    assert state_path("sqlite:///data/opsloop.db", {}) == Path("data/opsloop.local.json")
    assert state_path("postgresql://u@h/db", {}) == Path("opsloop.local.json")
    assert state_path("sqlite:///x.db", {"OPSLOOP_LOCAL_STATE": "/tmp/w.json"}) == Path(
        "/tmp/w.json"
    )


# --- what people type and click ------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "sent"),
    [
        ("@opsloop deploy api", f"<@{LOCAL.bot_user_id}> deploy api"),
        ("hey @bob, look at #ops", "hey <@U0BOB>, look at <#C0OPS|ops>"),
        ("@Alice. and @nobody and a@b.c", "<@U0ALICE>. and @nobody and a@b.c"),
        ("@reviewers @here", "<!subteam^S0REVIEWERS> <!here>"),
        ("<@U0BOB> & <b>", "&lt;@U0BOB&gt; &amp; &lt;b&gt;"),  # typed, not a mention
        ("#nowhere #deploys", "#nowhere <#C0DEPLOYS|deploys>"),
    ],
)
def test_typed_text_is_sent_as_slacks_client_sends_it(typed: str, sent: str) -> None:
    assert person_text(typed, local_workspace(), PEOPLE) == sent


def test_the_mention_is_what_the_bot_strips() -> None:
    text = person_text("@opsloop deploy api", local_workspace(), PEOPLE)
    assert mention_text(text, LOCAL.bot_user_id) == "deploy api"


def test_a_click_finds_buttons_in_actions_and_accessories() -> None:
    card = approval_card(
        thread_id="thr_1",
        requester="U0ALICE",
        call=type(
            "C", (), {"tool_call_id": "t1", "intent": "deploy", "arguments": {}, "reviewers": None}
        )(),
        reason="why",
        expires_at=__import__("datetime").datetime(2030, 1, 1),
        arguments_hash="h",
    )
    block_id, approve = find_element(card, APPROVE_ACTION)
    assert block_id.startswith(APPROVAL_BLOCK_PREFIX) and approve["style"] == "primary"
    assert find_element(card, REJECT_ACTION, block_id)[1]["style"] == "danger"
    assert find_element(card, REJECT_ACTION, "other-block") is None
    status = [{"type": "section", "text": {"type": "mrkdwn", "text": "x"}, "accessory": approve}]
    assert find_element(status, APPROVE_ACTION) == ("b0", approve)


def test_a_modals_inputs_are_checked_like_slacks_client_does() -> None:
    modal = reject_modal(thread_id="t", tool_call_id="c", arguments_hash="h", tool_name="x")
    values, errors = view_state(modal, {REASON_BLOCK: {REASON_ACTION: "too risky"}})
    assert errors == {}
    assert values == sr.text_input_values(REASON_BLOCK, REASON_ACTION, "too risky")
    values, errors = view_state(modal, {})
    assert values[REASON_BLOCK][REASON_ACTION]["value"] is None and errors == {}  # optional
    required = {**modal, "blocks": [{**modal["blocks"][1], "optional": False}]}
    assert view_state(required, {})[1] == {REASON_BLOCK: "Please complete this required field."}
    too_long = {REASON_BLOCK: {REASON_ACTION: "x" * (REASON_MAX_LENGTH + 1)}}
    assert "at most" in view_state(modal, too_long)[1][REASON_BLOCK]
    with pytest.raises(BadRequest, match="no input 'nope'"):
        view_state(modal, {"nope": {"x": "y"}})


def test_a_modals_selects_and_checkboxes_come_back_as_slack_sends_them() -> None:
    schema = {
        "type": "object",
        "properties": {"env": {"enum": ["staging", "production"]}},
        "required": ["env"],
    }
    modal = edit_modal(
        thread_id="t",
        tool_call_id="c",
        arguments_hash="h",
        tool_name="x",
        schema=schema,
        arguments={"env": "staging"},
    )
    assert modal is not None
    given = {"arg:env": {"value": '"production"'}, APPROVE_BLOCK: {"value": ["approve"]}}
    values, errors = view_state(modal, given)
    assert errors == {}
    assert values["arg:env"]["value"]["selected_option"]["value"] == '"production"'
    assert values[APPROVE_BLOCK]["value"]["selected_options"][0]["value"] == "approve"
    assert read_edit(schema, values).arguments == {"env": "production"}
    values, errors = view_state(modal, {})
    assert errors == {"arg:env": "Please complete this required field."}
    assert values[APPROVE_BLOCK]["value"] == {"type": "checkboxes", "selected_options": []}
    with pytest.raises(BadRequest, match="no option"):
        view_state(modal, {"arg:env": {"value": '"moon"'}})


# --- what Slack sends the app ----------------------------------------------------------------


def test_a_mention_is_a_message_and_an_app_mention_a_dm_only_a_message() -> None:
    ws = local_workspace()
    root = person_message(ws, f"<@{LOCAL.bot_user_id}> deploy", client_msg_id="m1")
    events = events_for(ws, Change("message", root, channel=OPS))
    assert [e["event"]["type"] for e in events] == ["app_mention", "message"]
    message = events[1]["event"]
    assert message["client_msg_id"] == "m1" and message_kind(message, LOCAL.bot_user_id) == "ignore"
    reply = person_message(ws, "yes", thread_ts=root["ts"], parent_user_id="U0ALICE")
    [event] = [e["event"] for e in events_for(ws, Change("message", reply, channel=OPS))]
    assert (event["thread_ts"], event["parent_user_id"]) == (root["ts"], "U0ALICE")
    assert message_kind(event, LOCAL.bot_user_id) == "reply"
    dm = {"type": "message", "user": "U0ALICE", "text": "hi", "ts": ws.next_ts()}
    [event] = [e["event"] for e in events_for(ws, Change("message", dm, channel="D0ALICE"))]
    assert message_kind(event, LOCAL.bot_user_id) == "dm"


def test_the_bots_own_posts_and_edits_come_back_as_events_it_ignores() -> None:
    ws = local_workspace()
    ours = {"type": "message", "user": LOCAL.bot_user_id, "bot_id": LOCAL.bot_id, "text": "x"}
    ours["ts"] = ws.next_ts()
    [posted] = events_for(ws, Change("message", ours, channel=OPS))
    assert posted["event"]["bot_profile"]["id"] == LOCAL.bot_id
    assert message_kind(posted["event"], LOCAL.bot_user_id) == "ignore"
    change = Change("message_changed", {"message": ours, "previous": ours}, channel=OPS)
    [edited] = events_for(ws, change)
    assert edited["event"]["subtype"] == "message_changed"
    assert events_for(ws, Change("ephemeral", {"user": "U0BOB"}, channel=OPS)) == []


def test_every_request_is_signed_as_slack_signs() -> None:
    payload = sr.block_actions_payload(
        LOCAL, user="U0BOB", action_id="a", value="v", channel=OPS, message_ts="1.000001"
    )
    body, headers = sr.signed(payload, "s3cret")
    assert SignatureVerifier("s3cret").is_valid_request(body, headers)
    assert payload["team"]["id"] == LOCAL.team_id and payload["user"]["team_id"] == LOCAL.team_id


# --- the address and the page --------------------------------------------------------------


def test_addresses() -> None:
    assert page_url("0.0.0.0", 3000) == "http://127.0.0.1:3000/"
    assert page_url("::1", 8080) == "http://[::1]:8080/"
    assert allowed_hosts("0.0.0.0", 3000) is None
    hosts = allowed_hosts("127.0.0.1", 3000)
    assert hosts is not None and {"127.0.0.1:3000", "localhost:3000"} <= hosts
    assert "evil.example:3000" not in hosts


def test_the_page_loads_nothing_from_elsewhere_and_documents_its_selectors() -> None:
    html = (STATIC / "index.html").read_text()
    scripts = {p.name: p.read_text() for p in STATIC.glob("*.js")}
    assert not re.search(r"""(src|href)=["'](https?:)?//""", html)
    for name, source in scripts.items():
        assert not re.search(r"""(import|from)\s+["'](https?:)?//""", source), name
        assert "innerHTML" not in source and "insertAdjacentHTML" not in source, name
        assert "document.write" not in source and "eval(" not in source, name
    documented = scripts["app.js"].split("import ", 1)[0]
    used = set(re.findall(r'data-testid="([a-z-]+)"', html))
    used |= set(re.findall(r'dataset\.testid = "([a-z-]+)"', "".join(scripts.values())))
    missing = sorted(t for t in used if t not in documented)
    assert missing == [], f"document these at the top of app.js: {missing}"
