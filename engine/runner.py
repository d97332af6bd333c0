"""The durable control loop of one thread.

lease the thread (or leave: another worker has it)
loop: state = reduce(events); do what ``next_action`` says; persist; repeat
release the lease

Every boundary that may block, fail or cause a side effect is bracketed by events: the
intent is committed before (``tool_started`` in the same transaction as the decision
that asked for it), the observation after. Nothing that matters after a restart is
kept in memory: the attempt number, the retry time and the pending approval are in
the log.

While it holds the lease the runner is the thread's only writer: the front door
(``FrontDoor``) shows the thread, from the log the runner hands it, before a tool runs
and hands back its receipts, which go into the runner's next batch; a conflict
therefore means someone else really acted.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from engine import events as ev
from engine import metrics
from engine.config import RunnerConfig
from engine.context import PROJECTION_VERSION, Projector, Prompt
from engine.errors import ConcurrencyConflict, IllegalTransition
from engine.grants import channel_grants, covering_grant, thread_grants
from engine.leases import Lease
from engine.logs import bind
from engine.models.base import Decision, Model, ModelError, is_answer
from engine.policy import Verdict, arguments_hash, classify
from engine.retrying import retrying
from engine.rules import PolicySet, RuleDecision
from engine.state import (
    GRANT_PREFIX,
    WAITING_POLICIES,
    PendingCall,
    ThreadState,
    WaitAnswer,
    next_action,
    reduce,
)
from engine.store import Store
from engine.types import ThreadInfo
from tools import RetryableToolError, Tool, ToolContext, ToolRegistry, WaitFor
from tools.context import WaitAnswer as ToolWaitAnswer
from tools.errors import OutcomeUnknown, ToolError
from tools.output import clean, clean_text, jsonable, storable, storable_text

log = logging.getLogger("opsloop.runner")

Clock = Callable[[], datetime]
# What a front door records of what it showed: a post, a plan message (a stream) or its stop.
Receipt = ev.MessagePosted | ev.StreamStopped


class FrontDoor(Protocol):
    """Where people see a thread (Slack, a CLI). While the runner holds the thread's
    lease it alone appends: it hands over the log it holds and that log's state, and the
    front door shows them (reading nothing again) and returns its receipts, which the
    runner appends with its next batch.

    ``events`` start at seq 1, unless the thread was compacted: the runner then holds
    only what its prompt needs (after the summary), and the front door reads the rest.

    A front door may also show a final answer while the model writes it: see
    ``StreamsAnswers`` (optional; without it the answer is shown once recorded).
    """

    async def show(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> list[Receipt]: ...


class FollowsWork(Protocol):
    """The optional hook of a front door that shows that a thread works (Slack's loading
    status, its agent session): ``working(thread_id, events, state)`` before each model
    call, with what the runner holds, as ``show``. It returns no receipts and must be
    quick; a failure is logged and never stops the run."""

    async def working(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> None: ...


class StreamsAnswers(Protocol):
    """The optional hook of a front door that streams answers: ``answer_text`` receives
    the text of the model's reply as it is written, during the model call (before the
    decision is in the log).

    - ``answer_text(thread_id, delta)``: append ``delta``. The deltas since the last
      reset join to a prefix of the final answer's text; when the decision is recorded
      as ``final_answer``, to exactly its ``text`` (the log stays the truth: ``show``
      then sees the ``final_answer`` and may compare).
    - ``answer_text(thread_id, "", reset=True)``: everything appended since the last
      reset is void: the reply was words before a tool call, was cut off or refused,
      or the call failed and will be made again (its text starts over). Sent only
      after some text.

    Called in order, one at a time, from the runner's task while it holds the lease;
    the model's stream waits for each call, so it must return quickly (buffer and
    send in the background). A failure is logged and never stops the run; the deltas
    after it are dropped (a gap would garble the text), resets are still sent.
    """

    async def answer_text(self, thread_id: str, delta: str, *, reset: bool = False) -> None: ...


class _AnswerText:
    """The model's ``on_text`` for one call: relays to the front door's hook."""

    def __init__(self, hook: Callable[..., Awaitable[None]], thread_id: str) -> None:
        self.hook = hook
        self.thread_id = thread_id
        self.sent = False  # text went out since the last reset
        self.failed = False

    async def __call__(self, delta: str, /, *, reset: bool = False) -> None:
        if self.failed and not reset:
            return
        self.sent = not reset
        try:
            await self.hook(self.thread_id, delta, reset=reset)
        except Exception:  # showing progress never stops the work
            if not self.failed:
                log.warning("answer_text failed thread_id=%s", self.thread_id, exc_info=True)
            self.failed = True

    async def void(self) -> None:
        if self.sent:
            await self("", reset=True)


def _takes_on_text(model: Model) -> bool:
    """Whether ``model.next_step`` takes ``on_text`` (a model written before the hook,
    such as a test's double, is called without it and simply does not stream)."""
    try:
        params = inspect.signature(model.next_step).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "on_text" or p.kind is p.VAR_KEYWORD for p in params)


def offered_tools(tools: ToolRegistry, policy: PolicySet | None) -> list[Tool]:
    """The tools shown to the model: all but those a rule rejects unconditionally."""
    return [t for t in tools.all() if policy is None or policy.offered(t.name)]


def projector_for(
    state: ThreadState,
    events: list[ev.AnyEvent],
    tools: ToolRegistry,
    policy: PolicySet | None = None,
) -> Projector:
    """A projector fed with what ``load_for_projection`` returned."""
    projector = Projector(offered_tools(tools, policy), PROJECTION_VERSION)
    compacted = [e for e in events if e.seq == (state.compaction or (0,))[0]]
    if compacted:
        assert isinstance(compacted[0], ev.ContextCompacted)
        projector.resume(compacted[0])
    return projector.feed(events)


async def project_thread(
    store: Store, thread_id: str, tools: ToolRegistry, policy: PolicySet | None = None
) -> Prompt:
    """The prompt the next model call of this thread would get (before any compaction)."""
    state, events = await store.load_for_projection(thread_id)
    return replace(projector_for(state, events, tools, policy).prompt(), turn=state.decisions)


def _definitions(tools: ToolRegistry) -> dict[str, str]:
    """Each tool's definition hash (cached on the Tool: cheap after the first time)."""
    return {t.name: t.definition_hash for t in tools.all()}


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Runner:
    def __init__(
        self,
        store: Store,
        model: Model,
        tools: ToolRegistry,
        config: RunnerConfig | None = None,
        *,
        clock: Clock = ev.utcnow,
        owner: str | None = None,
        front_door: FrontDoor | None = None,
        policy: PolicySet | None = None,
        pace: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        # Awaited before each step: lets the front door hold background work back while
        # it has answers to give (they have a deadline; steps do not).
        self.pace = pace
        self.model = model
        self.tools = tools
        self.config = config or RunnerConfig()
        self.clock = clock
        self.owner = owner or worker_id()
        # Asked to show the thread once a tool call is recorded as started and before
        # it runs: people see what is about to happen (an approved card, the call)
        # rather than after a long tool returns.
        self.front_door = front_door
        # Whether the model can stream its answer to the front door's ``answer_text``.
        self.model_streams = _takes_on_text(model)
        # None: each tool's own policy and the process's approvers, as before a policy
        # file; the calls then record no reviewer rule (approvers None).
        self.policy = policy

    async def run(self, thread_id: str) -> ThreadState | None:
        """Run the thread until it rests; None if another worker holds it."""
        ttl = self.config.lease_ttl_s
        with bind(thread_id=thread_id):  # every log line of this run names the thread
            lease = await Lease.take(self.store, thread_id, self.owner, ttl, clock=self.clock)
            if lease is None:
                return None
            async with lease:
                return await _Turn(self, thread_id, lease.lost).run()


class _Turn:
    """One leased run of one thread; caches the log it has read and written."""

    def __init__(self, runner: Runner, thread_id: str, lost: asyncio.Event) -> None:
        self.r = runner
        self.thread_id = thread_id
        self.lost = lost
        self.call_ids: set[str] = set()  # every tool_use id the model has used here
        # The registry's version the projector's tools were read at, and the definition
        # hash of each tool then: a call is pinned to the definition the model was shown,
        # even if the registry changed while it decided (the run then refuses it).
        self.tools_version = runner.tools.version
        self.shown: dict[str, str] = {}  # read with the log, at the start of the run
        self.projector = Projector(offered_tools(runner.tools, runner.policy), PROJECTION_VERSION)
        self.state = ThreadState()
        # The log as this turn read and wrote it (from the projection's start), for the
        # front door: it shows the thread from this instead of reading it again.
        self.events: list[ev.AnyEvent] = []
        self.place: ThreadInfo | None = None  # where the thread is, read when rules apply
        # The front door's receipts, appended ahead of this turn's next batch.
        self.receipts: list[Receipt] = []

    async def run(self) -> ThreadState:
        await self._start()
        await self._steps()
        if self.receipts and not self.lost.is_set():
            await retrying(lambda: self._append([]), reread=self._reload)
        return self.state

    async def _steps(self) -> None:
        while True:
            action = next_action(self.state, self.r.clock())
            if action == "none" or self.lost.is_set():
                return
            if self.r.pace is not None:
                await self.r.pace()
            metrics.STEPS.labels(action=action).inc()
            try:
                if action == "ask_model":
                    await self._ask_model()
                elif action == "execute_tool":
                    await self._execute(self._pending())
                elif action == "remind_approval":
                    call = self._pending()
                    await self._append([ev.ApprovalReminded(tool_call_id=call.tool_call_id)])
                elif action == "expire_approval":
                    call = self._pending()
                    await self._append([ev.ApprovalExpired(tool_call_id=call.tool_call_id)])
                elif action == "wait_timeout":
                    await self._wait_timeout(self._pending())
                elif action == "check_wait" and not await self._check_wait(self._pending()):
                    return
            except ConcurrencyConflict:
                # Someone appended (a reply, a click, a cancel): re-read and re-decide.
                await self._reload()

    def _pending(self) -> PendingCall:
        assert self.state.pending is not None
        return self.state.pending

    async def _start(self) -> None:
        self.state, events = await self.r.store.load_for_projection(self.thread_id)
        _observe_wake_lag(self.state, self.r.clock())
        self.tools_version, self.shown = self.r.tools.version, _definitions(self.r.tools)
        self.projector = projector_for(self.state, events, self.r.tools, self.r.policy)
        self.events = list(events)
        if self.r.policy is not None:
            self.place = await self.r.store.get_thread(self.thread_id)
        self._note_call_ids(events)

    async def _reload(self) -> None:
        """Catch up with the log. Ours is a prefix of it (the log only grows), so the
        events after our last seq bring the state and the projection up to date."""
        tail = await self.r.store.select_events(self.thread_id, after=self.state.last_seq)
        self._seen(tail)
        self.state = reduce(tail, self.state)

    def _seen(self, events: list[ev.AnyEvent]) -> None:
        self.events.extend(events)
        self.projector.feed(events)
        self._note_call_ids(events)

    def _note_call_ids(self, events: list[ev.AnyEvent]) -> None:
        self.call_ids.update(
            e.tool_call_id for e in events if e.type == "model_decision" and e.tool_call_id
        )

    async def _append(self, batch: Sequence[ev.Event]) -> list[ev.AnyEvent]:
        """Append ``batch``, after the front door's receipts not yet in the log."""
        appended = await self.r.store.append(
            self.thread_id,
            self.state.last_seq,
            [*self.receipts, *batch],
            state=self.state,
            now=self.r.clock(),
        )
        assert appended.state is not None
        self.receipts = []
        self._seen(appended.events)
        self.state = appended.state
        return appended.events

    async def _working(self) -> None:
        """Before a model call: a front door that follows the work (``FollowsWork``)
        shows that the thread is thinking."""
        hook = getattr(self.r.front_door, "working", None)
        if hook is None:
            return
        try:
            await hook(self.thread_id, self.events, self.state)
        except Exception:  # showing progress never stops the work
            log.warning("front door failed thread_id=%s", self.thread_id, exc_info=True)

    async def _show(self) -> None:
        if self.r.front_door is None:
            return
        try:
            self.receipts += await self.r.front_door.show(self.thread_id, self.events, self.state)
        except Exception:  # showing progress never stops the work
            log.warning("front door failed thread_id=%s", self.thread_id, exc_info=True)

    # --- the model ------------------------------------------------------------------

    async def _ask_model(self) -> None:
        cfg = self.r.config
        if self.state.decisions_since_input >= cfg.max_decisions_per_input:
            msg = f"stopped after {cfg.max_decisions_per_input} model steps without a human"
            await self._append([ev.ErrorRaised(message=msg, kind="step_budget")])
            return
        await self._working()
        if self.r.tools.version != self.tools_version:
            # A tool source changed its tools (an MCP server redefined, added or lost
            # one): this decision is offered them as they are now.
            self.tools_version, self.shown = self.r.tools.version, _definitions(self.r.tools)
            self.projector.offer(offered_tools(self.r.tools, self.r.policy))
        prompt = self.projector.prompt()
        if prompt.estimated_tokens > cfg.context_budget_tokens:
            prompt = await self._compact(prompt)
        prompt = replace(prompt, turn=self.state.decisions)
        model = self.r.model.name
        started = time.monotonic()
        # A front door with ``answer_text`` (``StreamsAnswers``) shows the answer while
        # it is written; without one the model is called as before.
        hook = getattr(self.r.front_door, "answer_text", None) if self.r.model_streams else None
        answer = _AnswerText(hook, self.thread_id) if hook is not None else None
        try:
            if answer is None:
                decision = await self.r.model.next_step(prompt)
            else:
                decision = await self.r.model.next_step(prompt, on_text=answer)
        except ModelError as exc:
            metrics.MODEL_SECONDS.labels(model=model).observe(time.monotonic() - started)
            metrics.MODEL_CALLS.labels(model=model, outcome="error").inc()
            if answer is not None:
                await answer.void()  # the retry's text starts over
            await self._model_failed(exc)
            return
        metrics.MODEL_SECONDS.labels(model=model).observe(time.monotonic() - started)
        metrics.MODEL_CALLS.labels(model=model, outcome="ok").inc()
        _count_tokens(model, decision)
        if answer is not None and not is_answer(decision):
            await answer.void()  # before a tool runs: the text was not the answer
        try:
            await self._decide(decision, prompt)
        except ConcurrencyConflict:
            # Someone acted meanwhile (a stop, a reply): the decision was not recorded,
            # so the answer it streamed is void; the run re-reads and decides again.
            if answer is not None:
                await answer.void()
            raise

    async def _compact(self, prompt: Prompt) -> Prompt:
        """Store a summary of the older turns; the prompt from now on starts with it."""
        upto = self.projector.compaction_point(self.r.config.context_budget_tokens // 2)
        if upto is None:
            return prompt  # one turn alone exceeds the budget: nothing older to fold
        summary = self.projector.digest.summary(upto)
        await self._append([ev.ContextCompacted(upto_seq=upto, summary=summary)])
        log.info(
            "context compacted thread_id=%s upto_seq=%d tokens_before=%d",
            self.thread_id,
            upto,
            prompt.estimated_tokens,
        )
        return self.projector.prompt()

    async def _model_failed(self, exc: ModelError) -> None:
        attempt = self.state.model_attempt + 1
        log.warning("model call failed thread_id=%s attempt=%d: %s", self.thread_id, attempt, exc)
        if exc.retryable and attempt < self.r.config.max_model_attempts:
            # The server's retry-after wins, within our own ceiling.
            delay = min(
                exc.retry_after or self.r.config.backoff(attempt), self.r.config.retry_max_s
            )
            wake = self.r.clock() + timedelta(seconds=delay)
            await self._append([ev.RetryScheduled(attempt=attempt, wake_at=wake, error=str(exc))])
        else:
            await self._append([ev.ErrorRaised(message=str(exc), kind="model")])

    async def _decide(self, decision: Decision, prompt: Prompt) -> None:
        use = decision.tool_use
        record = ev.ModelDecision(
            actor="model",
            text=decision.text,
            tool_name=use.name if use else None,
            tool_call_id=use.id if use else None,
            arguments=use.input if use else None,
            stop_reason=decision.stop_reason,
            model=decision.model or self.r.model.name,
            usage=decision.usage,
            prompt_hash=prompt.hash,
            projection_version=prompt.version,
            tool_names=prompt.tool_names,
            tools_hash=prompt.tools_hash,
        )
        verdict = classify(
            decision, self.r.tools, self.r.policy, self.place.channel if self.place else None
        )
        if use is not None and use.id in self.call_ids:
            # The id makes the idempotency key: a reused one could pass for a call that
            # already ran.
            verdict = Verdict("reject", f"tool_use id {use.id!r} was already used in this thread")
        batch: list[ev.Event] = [record]
        if verdict.kind == "final":
            batch.append(ev.FinalAnswer(actor="model", text=decision.text))
        elif verdict.kind == "reject":
            batch.append(
                ev.DecisionRejected(tool_call_id=record.tool_call_id, reason=verdict.reason)
            )
            if self.state.consecutive_rejections + 1 >= self.r.config.max_rejections:
                n = self.r.config.max_rejections
                msg = f"{n} invalid decisions in a row; last: {verdict.reason}"
                batch.append(ev.ErrorRaised(message=msg, kind="rejections"))
        elif verdict.kind == "clarify":
            assert use is not None
            batch.append(
                ev.ClarificationRequested(tool_call_id=use.id, question=use.input["question"])
            )
        else:
            assert use is not None
            requested = self._requested(use.id, use.name, use.input, verdict)
            batch.append(requested)
            if verdict.kind == "approve_before_run":
                batch.append(await self._approval_or_grant(requested, decision, verdict))
            elif verdict.kind != "refuse":
                # The intent commits with the decision: one transaction, not two.
                batch.append(ev.ToolStarted(tool_call_id=use.id, attempt=1))
        await self._append(batch)
        if self.state.pending is not None and self.state.pending.phase == "started":
            await self._invoke(self.state.pending)

    async def _approval_or_grant(
        self, requested: ev.ToolCallRequested, decision: Decision, verdict: Verdict
    ) -> ev.Event:
        """The card, or the approval of a live standing grant that covers the call: one
        of this thread's, or a channel-wide one made in another thread of its channel
        (read only for a call whose rule allows grants: other steps never look)."""
        grants = thread_grants(self.state)
        if requested.max_grant_s is not None and requested.quorum == 1 and self.place:
            logged = await self.r.store.grant_events(
                self.place.channel, team=self.place.team or None, now=self.r.clock()
            )
            grants += channel_grants(logged, besides=self.thread_id)
        found = covering_grant(
            grants, requested, requester=self.state.requester, now=self.r.clock()
        )
        if found is not None:
            return ev.ApprovalGranted(
                actor=f"{GRANT_PREFIX}{found.grant.grant_id}",
                tool_call_id=requested.tool_call_id,
                grant=found.use(),
            )
        return self._approval(
            requested.tool_call_id, requested.intent, requested.arguments, decision, verdict
        )

    def _approval(
        self,
        call_id: str,
        name: str,
        arguments: dict[str, Any],
        decision: Decision,
        verdict: Verdict,
    ) -> ev.ApprovalRequested:
        """The card, with its timers as the rule sets them now: recorded, so neither a
        restart nor a changed policy file moves a pending call's reminder or expiry."""
        rule = verdict.rule
        now = self.r.clock()
        ttl = rule.expires_in_s if rule else self.r.config.approval_ttl_s
        remind = rule.remind_after_s if rule else None
        return ev.ApprovalRequested(
            tool_call_id=call_id,
            arguments_hash=arguments_hash(name, arguments),
            expires_at=now + timedelta(seconds=ttl),
            reason=decision.text,
            # A reminder due at or after the expiry would never come.
            remind_at=now + timedelta(seconds=remind) if remind and remind < ttl else None,
        )

    def _requested(
        self, call_id: str, name: str, arguments: dict[str, Any], verdict: Verdict
    ) -> ev.ToolCallRequested:
        """The call with what the policy decided for it (the rule, its reviewers)."""
        tool = self.r.tools.get(name)
        # classify found it, or refused a tool a rule withholds (maybe not registered)
        assert tool is not None or verdict.kind == "refuse"
        rule: RuleDecision | None = verdict.rule
        idempotent = tool.idempotent if tool is not None else True
        reviewers: dict[str, Any] = {}
        if rule is not None:
            idempotent = idempotent if rule.idempotent is None else rule.idempotent
            reviewers = {
                "reviewers": rule.reviewers,
                "escalate_to": rule.escalate_to,
                "max_grant_s": rule.max_grant_s,
            }
        policy = "reject" if verdict.kind == "refuse" else verdict.kind
        if policy == "run_now" and tool is not None and tool.policy == "wait_for_external_event":
            policy = "wait_for_external_event"  # a rule lifting its approval lets it still wait
        return ev.ToolCallRequested(
            tool_call_id=call_id,
            intent=name,
            arguments=arguments,
            policy=policy,  # type: ignore[arg-type]
            idempotency_key=f"{self.thread_id}:{call_id}",
            reason=verdict.reason if verdict.kind == "refuse" else "",
            policy_hash=self.r.policy.policy_hash if self.r.policy else None,
            definition_hash=None if tool is None else self.shown.get(name, tool.definition_hash),
            idempotent=idempotent,
            **reviewers,
        )

    # --- tools ----------------------------------------------------------------------

    async def _execute(self, call: PendingCall) -> None:
        if call.phase == "started" and not call.idempotent:
            # Interrupted mid-call (a crash, a lost lease): its effect may have happened.
            # Never run it again without a person saying so.
            await self._append(
                [
                    ev.ToolOutcomeUnknown(
                        tool_call_id=call.tool_call_id,
                        attempt=call.attempt,
                        started_at=call.started_at,
                        error="opsloop stopped while the call was running",
                    )
                ]
            )
            return
        # A call resumed with a person's answer is not a failed attempt run again.
        if call.attempt >= self.r.config.max_tool_attempts and call.answer is None:
            # Crashed or failed that often: stop re-running it; the model hears why. Every
            # attempt up to call.attempt was started (and may have run); the one recorded
            # below only carries the result and never runs.
            ran = call.attempt
            if call.phase != "started":
                await self._append(
                    [ev.ToolStarted(tool_call_id=call.tool_call_id, attempt=call.attempt + 1)]
                )
                call = self._pending()
            msg = f"gave up after {ran} attempts"
            await self._record(
                call,
                ev.ToolResult(
                    tool_call_id=call.tool_call_id, attempt=call.attempt, ok=False, error=msg
                ),
            )
            return
        answer = call.answer  # for this attempt only: tool_started drops it from the state
        await self._append(
            [ev.ToolStarted(tool_call_id=call.tool_call_id, attempt=call.attempt + 1)]
        )
        await self._invoke(self._pending(), answer)

    async def _invoke(self, call: PendingCall, answer: WaitAnswer | None = None) -> None:
        """Run the tool once (attempt ``call.attempt``, already recorded) and record it;
        ``answer``: how the call's resuming wait ended, when this attempt follows one."""
        if self.lost.is_set():
            return  # the new owner re-runs this attempt's successor with the same key
        with bind(tool_call_id=call.tool_call_id):
            await self._invoke_bound(call, answer)

    async def _invoke_bound(self, call: PendingCall, answer: WaitAnswer | None = None) -> None:
        await self._show()
        tool = self.r.tools.get(call.intent)
        ctx = ToolContext(
            thread_id=self.thread_id,
            tool_call_id=call.tool_call_id,
            idempotency_key=call.idempotency_key,
            attempt=call.attempt,
            requester=self.state.requester,
            definition_hash=call.definition_hash,
            first_started_at=call.first_started_at,
            answer=None if answer is None else ToolWaitAnswer(**answer.model_dump()),
        )
        outcome: ev.Event
        try:
            if tool is None:
                raise LookupError(f"tool {call.intent!r} is no longer registered")
            if call.definition_hash is not None and tool.definition_hash != call.definition_hash:
                raise DefinitionMismatch(
                    f"the definition of {call.intent} changed since it was approved: "
                    "its description or arguments are not the ones the call was made for; "
                    "it was not run"
                )
            args = tool.parse_arguments(call.arguments)
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.r.config.tool_timeout_s):
                    output = await tool.run(args, ctx)
            except TimeoutError:
                # The effect may be under way: for a non-idempotent call, a person decides.
                raise OutcomeUnknown(
                    f"{call.intent} did not finish within {self.r.config.tool_timeout_s:g} s; "
                    "whether it took effect is unknown"
                ) from None
            finally:
                metrics.TOOL_SECONDS.labels(tool=call.intent).observe(time.monotonic() - started)
        except OutcomeUnknown as exc:
            outcome = self._unknown(call, exc)
        except RetryableToolError as exc:
            outcome = self._retry_or_fail(call, exc)
        except DefinitionMismatch as exc:
            outcome = ev.ToolResult(
                actor="tool",
                tool_call_id=call.tool_call_id,
                attempt=call.attempt,
                ok=False,
                error=str(exc),
            )
        except Exception as exc:
            if isinstance(exc, ToolError):  # the tool said no: expected, no traceback
                log.warning(
                    "tool failed thread_id=%s tool_call_id=%s error=%s",
                    self.thread_id,
                    call.tool_call_id,
                    type(exc).__name__,
                )
            else:  # a bug in the tool
                log.exception(
                    "tool failed thread_id=%s tool_call_id=%s", self.thread_id, call.tool_call_id
                )
            outcome = ev.ToolResult(
                actor="tool",
                tool_call_id=call.tool_call_id,
                attempt=call.attempt,
                ok=False,
                error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
            )
        else:
            outcome = self._observed(call, output)
        metrics.TOOL_CALLS.labels(tool=call.intent, outcome=_tool_outcome(outcome)).inc()
        await self._record(call, outcome)

    def _unknown(self, call: PendingCall, exc: OutcomeUnknown) -> ev.Event:
        """The tool cannot tell whether its effect happened: a person decides. For an
        idempotent call that is a transient failure: the same key runs it again."""
        if call.idempotent:
            return self._retry_or_fail(call, RetryableToolError(str(exc)))
        return ev.ToolOutcomeUnknown(
            actor="tool",
            tool_call_id=call.tool_call_id,
            attempt=call.attempt,
            started_at=call.started_at,
            error=str(exc) or type(exc).__name__,
        )

    def _retry_or_fail(self, call: PendingCall, exc: RetryableToolError) -> ev.Event:
        cfg = self.r.config
        if call.attempt >= cfg.max_tool_attempts:
            return ev.ToolResult(
                actor="tool",
                tool_call_id=call.tool_call_id,
                attempt=call.attempt,
                ok=False,
                error=f"{exc} (gave up after {call.attempt} attempts)",
            )
        delay = exc.retry_after if exc.retry_after is not None else cfg.backoff(call.attempt)
        return ev.RetryScheduled(
            tool_call_id=call.tool_call_id,
            attempt=call.attempt,
            wake_at=self.r.clock() + timedelta(seconds=delay),
            error=str(exc) or type(exc).__name__,
        )

    def _observed(self, call: PendingCall, output: Any) -> ev.Event:
        if isinstance(output, WaitFor):
            now = self.r.clock()
            timeout_at = now + timedelta(seconds=output.timeout_s)
            wake = (
                now + timedelta(seconds=output.poll_every_s) if output.poll_every_s else timeout_at
            )
            if call.policy not in WAITING_POLICIES and not output.resumes:
                return ev.ToolResult(
                    actor="tool",
                    tool_call_id=call.tool_call_id,
                    attempt=call.attempt,
                    ok=False,
                    error="the tool asked to wait but its policy is not wait_for_external_event",
                )
            return ev.WaitStarted(
                actor="tool",
                tool_call_id=call.tool_call_id,
                wait_id=f"{self.thread_id}.{secrets.token_hex(8)}",
                description=output.description,
                data=output.data,
                wake_at=min(wake, timeout_at),
                timeout_at=timeout_at,
                poll_every_s=output.poll_every_s,
                resumes=output.resumes,
            )
        return ev.ToolResult(
            actor="tool",
            tool_call_id=call.tool_call_id,
            attempt=call.attempt,
            ok=True,
            output=jsonable(output),  # made storable by _record, with every outcome
        )

    async def _record(self, call: PendingCall, outcome: ev.Event) -> None:
        """Append a tool's outcome, re-reading past any input that arrived meanwhile.

        Every tool's answer passes here, whatever its source: it is made storable first
        (no lone surrogates, cut past 1 MiB), or one that cannot be stored would crash
        the run after the call, as if the call had been interrupted.
        """
        outcome = _storable_outcome(outcome)

        async def once() -> None:
            if not _still_open(self.state, call):
                log.warning(
                    "dropping outcome of a call no longer pending thread_id=%s tool_call_id=%s",
                    self.thread_id,
                    call.tool_call_id,
                )
                return
            await self._append([_not_retried(outcome, self.state)])

        try:
            await retrying(once, reread=self._reload)
        except IllegalTransition:
            log.warning(
                "outcome refused thread_id=%s tool_call_id=%s",
                self.thread_id,
                call.tool_call_id,
                exc_info=True,
            )

    # --- waits ----------------------------------------------------------------------

    async def _wait_timeout(self, call: PendingCall) -> None:
        assert call.wait is not None
        await self._append(
            [
                ev.WaitTimedOut(
                    tool_call_id=call.tool_call_id,
                    wait_id=call.wait.wait_id,
                    resumes=call.wait.resumes,
                )
            ]
        )

    async def _check_wait(self, call: PendingCall) -> bool:
        """Poll the job once; True if the thread moved on, False to sleep until next poll."""
        assert call.wait is not None
        wait = call.wait
        tool = self.r.tools.get(call.intent)
        result: dict[str, Any] | None = None
        if tool is not None and tool.poll is not None:
            ctx = ToolContext(
                self.thread_id,
                call.tool_call_id,
                call.idempotency_key,
                call.attempt,
                self.state.requester,
                first_started_at=call.first_started_at,
            )
            try:
                result = await tool.poll(wait.data, ctx)
            except Exception:
                log.exception("poll failed thread_id=%s wait_id=%s", self.thread_id, wait.wait_id)
        if result is not None:
            await self._append(
                [
                    ev.WaitFinished(
                        actor="tool",
                        tool_call_id=call.tool_call_id,
                        wait_id=wait.wait_id,
                        result=storable(jsonable(result)),  # as _record does for results
                        resumes=wait.resumes,
                    )
                ]
            )
            return True
        every = wait.poll_every_s or (wait.timeout_at - self.r.clock()).total_seconds()
        wake = min(wait.timeout_at, self.r.clock() + timedelta(seconds=max(every, 0.05)))
        await self.r.store.set_wake_at(self.thread_id, self.state.last_seq, wake)
        return False


def _observe_wake_lag(state: ThreadState, now: datetime) -> None:
    """How late a run starts after the time it was due: a retry, an approval's expiry,
    a job's timeout (a job's polls move ``wake_at`` in the thread row only: not here)."""
    due = state.wake_at
    if due is None or due > now:
        return
    if state.status == "awaiting_job" and state.pending and state.pending.wait:
        if state.pending.wait.timeout_at > now:
            return
    metrics.WAKE_LAG.observe((now - due).total_seconds())


def _count_tokens(model: str, decision: Decision) -> None:
    usage = decision.usage
    for kind, n in (
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cache_read", usage.cache_read_input_tokens),
        ("cache_write", usage.cache_creation_input_tokens),
    ):
        if n:
            metrics.MODEL_TOKENS.labels(model=model, kind=kind).inc(n)


def _storable_outcome(outcome: ev.Event) -> ev.Event:
    """A tool's outcome with what the tool gave (its result, an error's text, a wait's
    data) made storable by ``tools.output``; the one boundary every tool source crosses."""
    update: dict[str, Any] = {}
    if isinstance(outcome, ev.ToolResult):
        update["output"] = storable(outcome.output)
        if outcome.error is not None:
            update["error"] = storable_text(outcome.error)
    elif isinstance(outcome, ev.ToolOutcomeUnknown | ev.RetryScheduled):
        update["error"] = storable_text(outcome.error)
    elif isinstance(outcome, ev.WaitStarted):
        # Cleaned, never cut: the tool's poll function reads this data back.
        update = {"description": clean_text(outcome.description), "data": clean(outcome.data)}
    return outcome.model_copy(update=update) if update else outcome


def _not_retried(outcome: ev.Event, state: ThreadState) -> ev.Event:
    """A failed attempt's retry, as its error result once someone pressed stop: a
    stopped run starts no new attempt (engine.state refuses the retry)."""
    if not isinstance(outcome, ev.RetryScheduled) or state.stop_by is None:
        return outcome
    return ev.ToolResult(
        actor="tool",
        tool_call_id=outcome.tool_call_id or "",
        attempt=outcome.attempt,
        ok=False,
        error=f"{outcome.error} (not retried: <@{state.stop_by}> stopped the run)",
    )


def _tool_outcome(outcome: ev.Event) -> str:
    """ok | error | retry | unknown | wait: how one attempt of a tool call ended."""
    if isinstance(outcome, ev.ToolResult):
        return "ok" if outcome.ok else "error"
    if isinstance(outcome, ev.RetryScheduled):
        return "retry"
    if isinstance(outcome, ev.ToolOutcomeUnknown):
        return "unknown"
    return "wait"


class DefinitionMismatch(Exception):
    """The registered tool is not the one the call was requested (and approved) for."""


def _still_open(state: ThreadState, call: PendingCall) -> bool:
    """Whether the outcome of ``call``'s current attempt may still be recorded."""
    for open_call in (state.pending, state.orphan):
        if (
            open_call is not None
            and open_call.tool_call_id == call.tool_call_id
            and open_call.attempt == call.attempt
        ):
            return True
    return False
