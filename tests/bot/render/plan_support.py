"""Logs for the plan and agent-status tests: legal threads built event by event.

``Log`` stamps each event (thread, seq, a clock a second apart) and checks the log
against the reducer as it grows, so every run the tests cut is one a thread can have.
The issue-22 events the reducer does not know yet (a stop, a stream's stop, feedback)
are left out of that check only.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from engine import events as ev
from engine.state import APPLY, ThreadState, apply

THREAD = "thr_0123456789abcdef0123"
NOW = datetime(2026, 1, 2, 9, 30, tzinfo=UTC)
REQUESTER = "U0REQUEST1"
REVIEWER = "U0REVIEW01"
OTHER = "U0REVIEW02"
EVIL = "<!channel> <@U999> <https://evil.example|bank> & stuff [click](https://evil.example) @here"


class Log:
    """A thread's log, appended to with ``add``; ``state`` follows the reducer."""

    def __init__(self) -> None:
        self.events: list[ev.AnyEvent] = []
        self.state = ThreadState()

    def add(self, *events: ev.Event) -> Log:
        for e in events:
            seq = len(self.events) + 1
            stamped = e.model_copy(
                update={
                    "thread_id": THREAD,
                    "seq": seq,
                    "created_at": NOW + timedelta(seconds=seq),
                }
            )
            if type(stamped) in APPLY:  # the reducer knows it: it must be legal
                self.state = apply(self.state, stamped)
            self.events.append(ev.parse_event(stamped.model_dump(mode="json")))
        return self

    @property
    def last_seq(self) -> int:
        return len(self.events)

    # --- what happens in threads ------------------------------------------------------

    def ask(self, text: str = "check api's health", user: str = REQUESTER, **kw: Any) -> Log:
        return self.add(ev.UserMessage(actor=user, text=text, **kw))

    def call(
        self,
        call_id: str = "toolu_1",
        intent: str = "check_health",
        arguments: dict[str, Any] | None = None,
        policy: Any = "run_now",
        **kw: Any,
    ) -> Log:
        args = {"service": "api"} if arguments is None else arguments
        return self.add(
            ev.ModelDecision(tool_name=intent, tool_call_id=call_id, arguments=args),
            ev.ToolCallRequested(
                tool_call_id=call_id,
                intent=intent,
                arguments=args,
                policy=policy,
                idempotency_key=f"{THREAD}:{call_id}",
                **kw,
            ),
        )

    def start(self, call_id: str = "toolu_1", attempt: int = 1) -> Log:
        return self.add(ev.ToolStarted(tool_call_id=call_id, attempt=attempt))

    def result(self, call_id: str = "toolu_1", output: Any = "ok", attempt: int = 1) -> Log:
        return self.add(
            ev.ToolResult(tool_call_id=call_id, attempt=attempt, ok=True, output=output)
        )

    def failed(self, call_id: str = "toolu_1", error: str = "boom", attempt: int = 1) -> Log:
        return self.add(ev.ToolResult(tool_call_id=call_id, attempt=attempt, ok=False, error=error))

    def run_tool(self, call_id: str = "toolu_1", output: Any = "ok", **kw: Any) -> Log:
        return self.call(call_id, **kw).start(call_id).result(call_id, output)

    def card(self, call_id: str = "toolu_1", **kw: Any) -> Log:
        """A call that needs approval, and its card."""
        self.call(call_id, policy="approve_before_run", **kw)
        return self.add(
            ev.ApprovalRequested(
                tool_call_id=call_id, arguments_hash="h" * 8, expires_at=NOW + timedelta(hours=1)
            )
        )

    def approve(self, call_id: str = "toolu_1", by: str = REVIEWER) -> Log:
        return self.add(ev.ApprovalGranted(actor=by, tool_call_id=call_id))

    def answer(self, text: str = "All good.") -> Log:
        return self.add(ev.ModelDecision(text=text), ev.FinalAnswer(text=text))

    def stop(self, user: str = REQUESTER) -> Log:
        return self.add(ev.StopRequested(user=user))
