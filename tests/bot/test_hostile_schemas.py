"""A schema's catastrophic pattern, matched against a model-chosen argument, must not
freeze `opsloop serve`: other mentions are acked and answered while it is decided."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_cli import _free_port, fakes_in_a_thread
from tests.bot.test_serve_crash import _send, _wait_healthy, _wait_shown, serve
from tests.fakes.anthropic import Reply
from tests.fakes.slack import BOT_USER_ID, app_mention_event

pytestmark = pytest.mark.slow

# Python's re backtracks 2^n times on this: 5,000 characters never finish.
HOSTILE = "a" * 5000 + "!"
CONFIG = """
tools:
  modules: [tools.builtin]
policy:
  - tool: search_docs
    when: {properties: {query: {pattern: "^(a+)+$"}}, required: [query]}
    policy: reject
    reason: no all-a queries
"""


def _last_user_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else str(content)


def answer(body: dict[str, Any]) -> Reply:
    said = _last_user_text(body)
    if "tool_result" in said:
        return Reply.text("Searched for the odd query.")
    if "odd" in said:
        return Reply.tool_use("search_docs", {"query": HOSTILE})
    return Reply.text("Hello from the other thread.")


def test_a_catastrophic_pattern_does_not_freeze_the_process(tmp_path: Path) -> None:
    (tmp_path / "opsloop.yaml").write_text(CONFIG)
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    with fakes_in_a_thread() as (claude, slack):
        claude.responder = answer
        odd_text, hello_text = f"<@{BOT_USER_ID}> search odd", f"<@{BOT_USER_ID}> hello"
        slack.add_message("C1", odd_text, user="U_ALICE", ts="1.000100")
        slack.add_message("C2", hello_text, user="U_BOB", ts="2.000100")
        port = _free_port()
        proc = serve(
            db,
            claude.url,
            slack.url,
            None,
            port=port,
            OPSLOOP_CONFIG=str(tmp_path / "opsloop.yaml"),
        )
        try:
            _wait_healthy(proc, port)
            odd = app_mention_event(user="U_ALICE", text=odd_text, channel="C1", ts="1.000100")
            hello = app_mention_event(user="U_BOB", text=hello_text, channel="C2", ts="2.000100")
            assert _send(port, odd) == 200
            # Acked while the odd call is being decided (on Python's re: never).
            assert _send(port, hello) == 200
            _wait_shown(slack, proc, "Hello from the other thread.")
            # The pattern does not hold (the query ends in "!"): the call ran and was answered.
            _wait_shown(slack, proc, "Searched for the odd query.")
            _wait_healthy(proc, port)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert "Traceback" not in err
