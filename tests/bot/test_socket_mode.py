"""`opsloop socket`: the same Bolt app, reached over Socket Mode (a fake WebSocket)."""

from __future__ import annotations

from bot.runtime import socket_mode_handler
from engine import metrics
from tests.fakes.slack import BOT_USER_ID, app_mention_event
from tests.fakes.socket_mode import FakeSocketMode

CHANNEL, ROOT_TS = "C0SOCKET1", "1700000500.000100"


async def test_a_mention_over_socket_mode_is_acknowledged_stored_and_answered(runtime, fakes):
    slack, claude = fakes
    claude.text("Hello over the socket.")
    slack.add_message(CHANNEL, f"<@{BOT_USER_ID}> hi", user="U_ALICE", ts=ROOT_TS)
    async with FakeSocketMode(app_token=slack.app_token) as socket:
        slack.socket_url = socket.ws_url
        # As `opsloop socket` wires it: the runtime's Bolt app and Web API client.
        handler = socket_mode_handler(runtime, slack.app_token)
        acks_before = _acks()
        await handler.connect_async()
        try:
            await socket.wait_connected()
            envelope = app_mention_event(
                user="U_ALICE", text=f"<@{BOT_USER_ID}> hi", channel=CHANNEL, ts=ROOT_TS
            )
            ack = await socket.send("events_api", envelope)
            assert ack["envelope_id"].startswith("env-")
            again = await socket.send("events_api", envelope)  # redelivered: stored once
            assert again["envelope_id"] != ack["envelope_id"]
            assert _acks() == acks_before + 2  # each envelope timed as an ack
            # The answer, streamed into the run's plan message, which then stops.
            await slack.wait_for("chat.stopStream", timeout=30)
            assert slack.showing("Hello over the socket.")
        finally:
            await handler.close_async()
    (info,) = await runtime.store.list_threads()
    assert (info.channel, info.root_ts) == (CHANNEL, ROOT_TS)
    types = [e.type for e in await runtime.store.select_events(info.id)]
    assert types.count("user_message") == 1
    assert types.count("final_answer") == 1


def _acks() -> float:
    value = metrics.REGISTRY.get_sample_value("opsloop_slack_ack_seconds_count")
    return value or 0.0
