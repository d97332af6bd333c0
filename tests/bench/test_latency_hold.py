"""bench/latency.py's kill phase: a held model call must end before the model timeout."""

from __future__ import annotations

from bench._latency_fakes import HOLD_S, model_reply
from engine.config import ModelSettings


def test_a_held_model_call_is_answered_before_the_model_timeout():
    # A thread the surviving replica runs is answered "held" after the hold; a hold past
    # the serve processes' model timeout (the bench keeps its default) times the call out
    # instead, and the retry is answered "Resumed", so "held" never comes.
    held = model_reply("kpo7", stage=0, nth=1)
    assert held.content == [{"type": "text", "text": "held"}]
    assert held.delay == HOLD_S
    assert 0 < held.delay < ModelSettings().timeout_s
    assert model_reply("kpo7", stage=0, nth=2).content[0]["text"] == "Resumed after the crash."
