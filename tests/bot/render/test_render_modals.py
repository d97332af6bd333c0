"""The reject-reason and reconcile-note modals."""

from __future__ import annotations

from bot import limits
from bot.render.common import Binding, parse_binding
from bot.render.modals import NOTE_ACTION, NOTE_BLOCK, NOTE_CALLBACK, note_modal, reject_modal
from tests.bot.render.support import CALL_ID, HASH, THREAD


def test_reject_modal() -> None:
    view = reject_modal(
        thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, tool_name="refund_customer"
    )
    assert view["type"] == "modal"
    assert view["callback_id"] == "opsloop_reject_reason"
    assert parse_binding(view["private_metadata"]) == Binding(THREAD, CALL_ID, HASH)
    assert view["title"]["text"] == "Reject tool call" and len(view["title"]["text"]) <= 24
    assert view["submit"]["text"] == "Reject" and view["close"]["text"] == "Cancel"
    [intro, reason] = view["blocks"]
    assert "*refund_customer*" in intro["text"]["text"]
    assert reason["type"] == "input" and reason["block_id"] == "reason"
    assert reason["optional"] is True
    assert reason["element"] | {"placeholder": None} == {
        "type": "plain_text_input",
        "action_id": "reason",
        "multiline": True,
        "max_length": 2000,
        "placeholder": None,
    }
    assert limits.check_limits(view) == []


def test_the_note_modal() -> None:
    view = note_modal(
        thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, tool_name="restart"
    )
    assert view["callback_id"] == NOTE_CALLBACK
    assert parse_binding(view["private_metadata"]) == Binding(THREAD, CALL_ID, HASH)
    [intro, note] = view["blocks"]
    assert "The model reads your note" in intro["text"]["text"]
    assert (note["block_id"], note["element"]["action_id"]) == (NOTE_BLOCK, NOTE_ACTION)
    assert note["optional"] is True
    assert limits.check_limits(view) == []
