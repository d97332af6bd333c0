"""The modals a card's buttons open: the reject reason, and the note for "It happened".

Pure: no I/O here.
"""

from __future__ import annotations

from typing import Any

from bot.limits import MAX_INPUT_LABEL, MAX_PLACEHOLDER, MAX_VIEW_TITLE
from bot.render.common import binding_value, plain, section, tool

REJECT_CALLBACK = "opsloop_reject_reason"
REASON_BLOCK = REASON_ACTION = "reason"
NOTE_CALLBACK = "opsloop_reconcile_note"
NOTE_BLOCK = NOTE_ACTION = "note"

REASON_MAX_LENGTH = 2000  # our limit on a reject reason
NOTE_MAX_LENGTH = 2000  # our limit on a reconcile note


def reject_modal(
    *, thread_id: str, tool_call_id: str, arguments_hash: str, tool_name: str
) -> dict[str, Any]:
    """The ``views.open`` modal asking for an optional reason to reject a call."""
    return {
        "type": "modal",
        "callback_id": REJECT_CALLBACK,
        "private_metadata": binding_value(thread_id, tool_call_id, arguments_hash),
        "title": plain("Reject tool call", MAX_VIEW_TITLE),
        "submit": plain("Reject", MAX_VIEW_TITLE),
        "close": plain("Cancel", MAX_VIEW_TITLE),
        "blocks": [
            section(f"Reject {tool(tool_name)}? The model sees your reason."),
            {
                "type": "input",
                "block_id": REASON_BLOCK,
                "optional": True,
                # Slack adds "(optional)" to an optional input's label itself.
                "label": plain("Reason", MAX_INPUT_LABEL),
                "element": {
                    "type": "plain_text_input",
                    "action_id": REASON_ACTION,
                    "multiline": True,
                    "max_length": REASON_MAX_LENGTH,
                    "placeholder": plain("What should it do instead?", MAX_PLACEHOLDER),
                },
            },
        ],
    }


def note_modal(
    *, thread_id: str, tool_call_id: str, arguments_hash: str, tool_name: str
) -> dict[str, Any]:
    """The ``views.open`` modal for **It happened**: an optional note, the result the
    model reads (without one, "a person confirmed it happened")."""
    return {
        "type": "modal",
        "callback_id": NOTE_CALLBACK,
        "private_metadata": binding_value(thread_id, tool_call_id, arguments_hash),
        "title": plain("It happened", MAX_VIEW_TITLE),
        "submit": plain("It happened", MAX_VIEW_TITLE),
        "close": plain("Cancel", MAX_VIEW_TITLE),
        "blocks": [
            section(f"{tool(tool_name)} took effect? The model reads your note as its result."),
            {
                "type": "input",
                "block_id": NOTE_BLOCK,
                "optional": True,
                "label": plain("What happened", MAX_INPUT_LABEL),
                "element": {
                    "type": "plain_text_input",
                    "action_id": NOTE_ACTION,
                    "multiline": True,
                    "max_length": NOTE_MAX_LENGTH,
                    "placeholder": plain("e.g. the service restarted at 10:02", MAX_PLACEHOLDER),
                },
            },
        ],
    }
