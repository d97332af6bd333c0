"""GitHub as a tool source (``integrations.github``): Actions deploys that wait for their
run, and issues and comments, each behind the same policy rules as every tool.

Tools (DESIGN, "Integrations and alerts"; a rule may change any policy):

- ``github_dispatch_workflow`` (approve_before_run): dispatches a ``workflow_dispatch``
  run and waits for it (``WaitFor``); the wait ends by ``POST /hooks/github``
  (``bot/github_hooks.py``) or by polling the run every ``poll_every``. Its result is
  the conclusion, the duration, the run's URL and the failed jobs' names.
- ``github_run_status``, ``github_list_runs``, ``github_get_job_log`` (run_now).
- ``github_create_issue``, ``github_comment`` (approve_before_run).

Each repository argument must be one of ``repos`` (any other is refused).

The writes are made idempotent, so a call interrupted by a crash runs again without a
second effect. Attempt 1 of a call acts at once: nothing before it can have acted. A
later attempt first looks for what an earlier one did, no further back than the call's
first attempt (``ToolContext.first_started_at``):

- an issue or a comment carries ``<!-- opsloop:KEY -->`` (the idempotency key) in its
  body, found in the issues (or comments) we created since;
- a dispatched run is found by the key when the workflow takes it: opsloop sends the
  input ``opsloop_key`` (dropped, and remembered, when the workflow answers it has no
  such input) and a workflow whose ``run-name`` shows it is found exactly. Otherwise by
  correlation: a ``workflow_dispatch`` run of that workflow on that ref, by our login,
  created since the first attempt (the earliest, and the result says how many matched).

On a dispatch GitHub returns the run id when asked (``return_run_details``); a server
that answers 204 instead gets its run found the same ways, for up to ``_FIND_S``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from tools.context import ToolContext
from tools.errors import OutcomeUnknown, RetryableToolError, ToolError, ToolLoadError
from tools.integrations.config import GitHubConfig
from tools.integrations.github_client import (
    GitHubClient,
    GitHubError,
    check_private_key,
    iso,
    parse_time,
)
from tools.registry import Policy, Tool
from tools.wait import WaitFor

log = logging.getLogger("opsloop.github")

SOURCE = "integrations:github"
KEY_INPUT = "opsloop_key"  # the workflow input that carries the idempotency key
# Another call's key in a run's title: that run is not ours, whatever else matches.
_A_KEY = re.compile(r"thr_[0-9a-f]+:[A-Za-z0-9_-]+")
_SKEW = timedelta(seconds=2)  # GitHub's times are to the second; its clock against ours
_FIND_S = (0.5, 1, 1, 2, 2, 3, 3, 3)  # looking for a 204's run: ~15 s in all
_SETTLE_S = 3.0  # a retry that finds no run looks once more before dispatching
_LOOKBACK = timedelta(hours=1)  # a call started before first_started_at was recorded
_FAILED = frozenset({"failure", "timed_out", "cancelled", "startup_failure", "action_required"})
_MARKER = "<!-- opsloop:{key} -->"


def marker(key: str) -> str:
    """The hidden line an issue or comment carries: its call's idempotency key."""
    return _MARKER.format(key=key)


class GitHubLoadError(ToolLoadError):
    """``integrations.github`` cannot be loaded; str() is one line naming the key."""

    def __init__(self, key: str, problem: str) -> None:
        ToolError.__init__(self, f"{key}: {problem}")  # not ToolLoadError's module wording
        self.module = key
        self.cause = ValueError(problem)


# --- arguments ---------------------------------------------------------------------------


def _one_segment(value: str) -> str:
    if value in ("", ".", "..") or "/" in value:
        raise ValueError("give the workflow's file name (deploy.yml) or its id")
    return value


Workflow = Annotated[str, Field(max_length=255), AfterValidator(_one_segment)]
RunStatus = Literal[
    "queued",
    "in_progress",
    "completed",
    "waiting",
    "requested",
    "pending",
    "action_required",
    "success",
    "failure",
    "cancelled",
    "timed_out",
    "skipped",
    "neutral",
    "stale",
]


class _RepoArgs(BaseModel):
    repo: str = Field(description="The repository, owner/name (one of those configured).")


class DispatchArgs(_RepoArgs):
    workflow: Workflow = Field(description="The workflow's file name (deploy.yml) or numeric id.")
    ref: str = Field(
        description="The branch or tag to run the workflow from.", min_length=1, max_length=255
    )
    inputs: dict[str, str] = Field(
        default_factory=dict, description="The workflow's inputs, as its file declares them."
    )
    timeout_minutes: int = Field(
        60, ge=1, le=720, description="Stop waiting for the run after this long."
    )


class RunArgs(_RepoArgs):
    run_id: int = Field(ge=1, description="The workflow run's id.")


class ListRunsArgs(_RepoArgs):
    workflow: Workflow | None = Field(
        None, description="Only this workflow's runs (file name or id)."
    )
    branch: str | None = Field(None, description="Only runs on this branch.", max_length=255)
    status: RunStatus | None = Field(None, description="Only runs in this state or conclusion.")
    limit: int = Field(10, ge=1, le=50, description="How many runs, newest first.")


class JobLogArgs(_RepoArgs):
    job_id: int = Field(ge=1, description="The job's id (github_run_status lists them).")
    lines: int = Field(100, ge=1, le=500, description="How many lines from the end.")


class IssueArgs(_RepoArgs):
    title: str = Field(min_length=1, max_length=256)
    body: str = Field("", max_length=60_000)
    labels: list[str] = Field(default_factory=list, max_length=20)


class CommentArgs(_RepoArgs):
    number: int = Field(ge=1, description="The issue or pull request number.")
    body: str = Field(min_length=1, max_length=60_000)


# --- results ---------------------------------------------------------------------------


def duration_s(run: dict[str, Any]) -> float | None:
    """How long the run took by GitHub's times (start of its latest attempt to its last
    update, which for a completed run is its end)."""
    start = parse_time(run.get("run_started_at")) or parse_time(run.get("created_at"))
    end = parse_time(run.get("updated_at"))
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def failed_job_names(jobs: list[dict[str, Any]]) -> list[str]:
    return [str(j.get("name")) for j in jobs if j.get("conclusion") in _FAILED]


def run_result(
    repo: str, run: dict[str, Any], failed_jobs: list[str], found: str | None = None
) -> dict[str, Any]:
    """What a finished run's wait ends with, whether a webhook or a poll saw it end."""
    result: dict[str, Any] = {
        "repo": repo,
        "run_id": run.get("id"),
        "workflow": run.get("name"),
        "conclusion": run.get("conclusion"),
        "duration_s": duration_s(run),
        "html_url": run.get("html_url"),
        "head_branch": run.get("head_branch"),
        "head_sha": run.get("head_sha"),
        "failed_jobs": failed_jobs,
    }
    if found:
        result["found"] = found
    return result


async def finished_run(
    client: GitHubClient, repo: str, run: dict[str, Any], found: str | None = None
) -> dict[str, Any]:
    """``run_result`` of a completed run, its failed jobs asked for only when it failed."""
    failed: list[str] = []
    if run.get("conclusion") not in ("success", "skipped", "neutral"):
        failed = failed_job_names(await client.run_jobs(repo, int(run["id"])))
    return run_result(repo, run, failed, found)


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    actor = run.get("triggering_actor") or run.get("actor") or {}
    return {
        "run_id": run.get("id"),
        "workflow": run.get("name"),
        "title": run.get("display_title"),
        "event": run.get("event"),
        "status": run.get("status"),
        "conclusion": run.get("conclusion"),
        "head_branch": run.get("head_branch"),
        "head_sha": run.get("head_sha"),
        "created_at": run.get("created_at"),
        "actor": actor.get("login") if isinstance(actor, dict) else None,
        "html_url": run.get("html_url"),
    }


def wait_key(data: dict[str, Any]) -> tuple[str, int] | None:
    """(repo lowercased, run id) of a wait on a run, from its ``WaitFor`` data: how
    ``POST /hooks/github`` recognises the wait a ``workflow_run`` event ends."""
    run = data.get("github_run")
    if not isinstance(run, dict):
        return None
    repo, run_id = run.get("repo"), run.get("run_id")
    if not isinstance(repo, str) or not isinstance(run_id, int):
        return None
    return repo.lower(), run_id


def tool_error(exc: GitHubError, *, effect: bool) -> ToolError:
    """A client failure as the engine's error: retryable when GitHub cannot have acted
    (refused before acting, a rate limit) or when repeating is harmless; a write that may
    have happened is ``OutcomeUnknown`` (our writes look before repeating, so the engine
    retries them unless a rule says they are not idempotent)."""
    if not exc.transient:
        return ToolError(str(exc))
    if effect and exc.sent and exc.retry_after is None and exc.status not in (429, 503):
        return OutcomeUnknown(f"{exc}; whether it took effect is unknown")
    return RetryableToolError(str(exc), retry_after=exc.retry_after)


@dataclass(frozen=True)
class Found:
    run_id: int
    html_url: str | None
    how: str


# --- the source ------------------------------------------------------------------------


class GitHubSource:
    """``integrations.github`` as a :class:`~tools.sources.ToolSource`."""

    name = "github"
    key = "integrations.github"

    def __init__(
        self,
        config: GitHubConfig,
        *,
        client: GitHubClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.client = client or GitHubClient(config)
        self._sleep = sleep
        self._clock = clock
        self._repos = {r.lower(): r for r in config.repos}
        # (repo, workflow) whose workflow said it has no opsloop_key input: not sent again.
        self._unkeyed: set[tuple[str, str]] = set()
        self._run_details = True  # False once the server refused return_run_details

    def __repr__(self) -> str:
        return f"GitHubSource({list(self._repos.values())!r})"

    async def open(self) -> list[Tool]:
        """Build the tools; connects to nothing (GitHub is asked when a tool runs)."""
        if self.config.private_key is not None:
            try:
                check_private_key(self.config.private_key.get_secret_value())
            except ValueError as exc:
                raise GitHubLoadError("integrations.github.private_key", str(exc)) from None
        return self.tools()

    async def close(self) -> None:
        await self.client.close()

    def tools(self) -> list[Tool]:
        dispatch = _tool(
            "github_dispatch_workflow",
            "Run a GitHub Actions workflow (workflow_dispatch) on a branch or tag and wait "
            "for the run to finish; the result is its conclusion, how long it took, its "
            "URL and the names of the jobs that failed.",
            "approve_before_run",
            DispatchArgs,
            self.dispatch,
        )
        dispatch.poll = self.poll
        return [
            dispatch,
            _tool(
                "github_run_status",
                "The state of a GitHub Actions workflow run: status, conclusion, URL, and "
                "its jobs (with their ids, for github_get_job_log).",
                "run_now",
                RunArgs,
                self.run_status,
            ),
            _tool(
                "github_list_runs",
                "Recent GitHub Actions workflow runs of a repository, newest first; "
                "optionally of one workflow, branch or status.",
                "run_now",
                ListRunsArgs,
                self.list_runs,
            ),
            _tool(
                "github_get_job_log",
                "The last lines of a GitHub Actions job's log (earlier lines are elided).",
                "run_now",
                JobLogArgs,
                self.job_log,
            ),
            _tool(
                "github_create_issue",
                "Open an issue in a GitHub repository.",
                "approve_before_run",
                IssueArgs,
                self.create_issue,
            ),
            _tool(
                "github_comment",
                "Comment on a GitHub issue or pull request.",
                "approve_before_run",
                CommentArgs,
                self.comment,
            ),
        ]

    def allowed(self, repo: str) -> str:
        """The configured spelling of ``repo``; ``ToolError`` when it is not listed."""
        found = self._repos.get(repo.strip().lower())
        if found is None:
            listed = ", ".join(self._repos.values())
            raise ToolError(
                f"{repo!r} is not a repository opsloop may use "
                f"(integrations.github.repos: {listed})"
            )
        return found

    def _since(self, ctx: ToolContext) -> datetime:
        first = ctx.first_started_at or (self._clock() - _LOOKBACK)
        return first - _SKEW

    # --- dispatch and wait -------------------------------------------------------------

    async def dispatch(self, args: DispatchArgs, ctx: ToolContext) -> WaitFor:
        """Dispatch the workflow (unless an earlier attempt did) and wait for its run."""
        repo = self.allowed(args.repo)
        if KEY_INPUT in args.inputs:
            raise ToolError(f"the input {KEY_INPUT!r} is opsloop's own: leave it out")
        key = ctx.idempotency_key
        try:
            found = None
            if ctx.attempt > 1:
                found = await self._find_run(repo, args, key, self._since(ctx))
                if found is None:
                    # A run dispatched just before a crash may take a moment to be listed.
                    await self._sleep(_SETTLE_S)
                    found = await self._find_run(repo, args, key, self._since(ctx))
            if found is None:
                started = self._clock()
                details = await self._dispatch(repo, args, key) or {}
                run_id = details.get("workflow_run_id")
                if isinstance(run_id, int):
                    found = Found(run_id, details.get("html_url"), "returned by the dispatch")
                else:
                    found = await self._find_new_run(repo, args, key, started - _SKEW)
        except GitHubError as exc:
            raise tool_error(exc, effect=True) from None
        log.info(
            "github waiting on run repo=%s workflow=%s run_id=%s found=%r thread_id=%s "
            "tool_call_id=%s attempt=%s",
            repo,
            args.workflow,
            found.run_id,
            found.how,
            ctx.thread_id,
            ctx.tool_call_id,
            ctx.attempt,
        )
        return WaitFor(
            f"{args.workflow} on {repo} at {args.ref} (run {found.run_id})",
            data={
                "github_run": {"repo": repo, "run_id": found.run_id},
                "html_url": found.html_url,
                "found": found.how,
            },
            timeout_s=args.timeout_minutes * 60.0,
            poll_every_s=self.config.poll_every,
        )

    async def _dispatch(self, repo: str, args: DispatchArgs, key: str) -> dict[str, Any] | None:
        """Dispatch, with the key as an input when the workflow takes one and asking for
        the run's id when the server knows how. A 422 naming either is a refusal (nothing
        ran): the request goes again without it, and that is remembered."""
        which = (repo.lower(), args.workflow)
        while True:
            keyed = which not in self._unkeyed
            inputs = {**args.inputs, KEY_INPUT: key} if keyed else dict(args.inputs)
            try:
                return await self.client.dispatch_workflow(
                    repo, args.workflow, args.ref, inputs, run_details=self._run_details
                )
            except GitHubError as exc:
                # "Unexpected inputs provided: ["opsloop_key"]"; a server from before
                # return_run_details (GitHub Enterprise Server) may refuse that key.
                if exc.status == 422 and keyed and KEY_INPUT in str(exc):
                    self._unkeyed.add(which)
                elif exc.status == 422 and self._run_details and "return_run_details" in str(exc):
                    self._run_details = False
                else:
                    raise

    async def _find_new_run(
        self, repo: str, args: DispatchArgs, key: str, since: datetime
    ) -> Found:
        """The run a dispatch answered 204 to: listed within seconds, usually."""
        for delay in (0.0, *_FIND_S):
            if delay:
                await self._sleep(delay)
            if (found := await self._find_run(repo, args, key, since)) is not None:
                return found
        # Dispatched, but not listed yet: the retry looks for it before dispatching.
        raise RetryableToolError(
            f"{args.workflow} was dispatched but its run is not listed yet", retry_after=5
        )

    async def _find_run(
        self, repo: str, args: DispatchArgs, key: str, since: datetime
    ) -> Found | None:
        """The run of this call: by its key in the run's title, else by correlation."""
        runs = await self.client.workflow_runs(
            repo, args.workflow, event="workflow_dispatch", created_since=since, per_page=100
        )
        for run in runs:
            if key in str(run.get("display_title") or ""):
                return Found(int(run["id"]), run.get("html_url"), "by its key in the run's name")
        me = await self.client.login()
        ref = _short_ref(args.ref)
        matching = [
            run
            for run in runs
            if run.get("event") == "workflow_dispatch"
            and run.get("head_branch") == ref
            and (created := parse_time(run.get("created_at"))) is not None
            and created >= since
            and (me is None or _actor(run) == me)
            and not _A_KEY.search(str(run.get("display_title") or ""))
        ]
        if not matching:
            return None
        first = min(matching, key=lambda r: (str(r.get("created_at")), int(r["id"])))
        who = f"by {me}" if me else "by anyone (our login is unknown)"
        how = (
            f"correlated: the workflow_dispatch run of {args.workflow} on {ref} {who} "
            f"created since {iso(since)}"
        )
        if len(matching) > 1:
            how += f" ({len(matching)} matched; the earliest taken)"
        return Found(int(first["id"]), first.get("html_url"), how)

    async def poll(self, data: dict[str, Any], ctx: ToolContext) -> dict[str, Any] | None:
        """The run's result once it completed; None while it runs or GitHub is away."""
        found = wait_key(data)
        if found is None:
            return {"error": "the wait does not name a GitHub run"}
        repo, run_id = (data["github_run"]["repo"], found[1])
        try:
            run = await self.client.run(repo, run_id)
            if run.get("status") != "completed":
                return None
            return await finished_run(self.client, repo, run, data.get("found"))
        except GitHubError as exc:
            if exc.status == 404:
                return {"repo": repo, "run_id": run_id, "conclusion": None, "error": str(exc)}
            log.warning(
                "github poll failed repo=%s run_id=%s thread_id=%s error=%s",
                repo,
                run_id,
                ctx.thread_id,
                exc,
            )
            return None

    # --- reads -------------------------------------------------------------------------

    async def run_status(self, args: RunArgs, ctx: ToolContext) -> dict[str, Any]:
        """A run's state and its jobs."""
        repo = self.allowed(args.repo)
        try:
            run = await self.client.run(repo, args.run_id)
            jobs = await self.client.run_jobs(repo, args.run_id)
        except GitHubError as exc:
            raise tool_error(exc, effect=False) from None
        return {
            **run_summary(run),
            "duration_s": duration_s(run) if run.get("status") == "completed" else None,
            "jobs": [
                {
                    "job_id": j.get("id"),
                    "name": j.get("name"),
                    "status": j.get("status"),
                    "conclusion": j.get("conclusion"),
                }
                for j in jobs
            ],
        }

    async def list_runs(self, args: ListRunsArgs, ctx: ToolContext) -> dict[str, Any]:
        """Recent runs, newest first."""
        repo = self.allowed(args.repo)
        try:
            runs = await self.client.workflow_runs(
                repo, args.workflow, branch=args.branch, status=args.status, per_page=args.limit
            )
        except GitHubError as exc:
            raise tool_error(exc, effect=False) from None
        return {"repo": repo, "runs": [run_summary(r) for r in runs[: args.limit]]}

    async def job_log(self, args: JobLogArgs, ctx: ToolContext) -> dict[str, Any]:
        """The end of a job's log."""
        repo = self.allowed(args.repo)
        try:
            tail, total = await self.client.job_log_tail(repo, args.job_id, args.lines)
        except GitHubError as exc:
            raise tool_error(exc, effect=False) from None
        elided = max(0, total - len(tail))
        text = "\n".join(tail)
        if elided:
            text = f"… {elided} earlier lines elided\n{text}"
        return {"job_id": args.job_id, "lines": total, "elided": elided, "log": text}

    # --- writes ------------------------------------------------------------------------

    async def create_issue(self, args: IssueArgs, ctx: ToolContext) -> dict[str, Any]:
        """Open an issue, unless an earlier attempt of this call did."""
        repo = self.allowed(args.repo)
        mark = marker(ctx.idempotency_key)
        try:
            if ctx.attempt > 1:
                me = await self.client.login()
                for issue in await self.client.issues_since(repo, me, self._since(ctx)):
                    if mark in str(issue.get("body") or ""):
                        return _issue(issue, created=False)
            body = f"{args.body}\n\n{mark}" if args.body else mark
            issue = await self.client.create_issue(repo, args.title, body, args.labels)
        except GitHubError as exc:
            raise tool_error(exc, effect=True) from None
        return _issue(issue, created=True)

    async def comment(self, args: CommentArgs, ctx: ToolContext) -> dict[str, Any]:
        """Comment, unless an earlier attempt of this call did."""
        repo = self.allowed(args.repo)
        mark = marker(ctx.idempotency_key)
        try:
            if ctx.attempt > 1:
                since = self._since(ctx)
                for comment in await self.client.comments_since(repo, args.number, since):
                    if mark in str(comment.get("body") or ""):
                        return _comment(comment, created=False)
            made = await self.client.create_comment(repo, args.number, f"{args.body}\n\n{mark}")
        except GitHubError as exc:
            raise tool_error(exc, effect=True) from None
        return _comment(made, created=True)


def _tool(
    name: str,
    description: str,
    policy: Policy,
    args_model: type[BaseModel],
    func: Callable[..., Awaitable[Any]],
) -> Tool:
    # Every tool here is idempotent: the reads by nature, the writes by looking first.
    return Tool(
        name=name,
        description=description,
        policy=policy,
        args_model=args_model,
        func=func,
        source=SOURCE,
        idempotent=True,
    )


def _short_ref(ref: str) -> str:
    """A run's ``head_branch`` for a dispatch ``ref`` (a branch or tag, maybe spelt out)."""
    for prefix in ("refs/heads/", "refs/tags/"):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return ref


def _actor(run: dict[str, Any]) -> str | None:
    for field in ("triggering_actor", "actor"):
        who = run.get(field)
        if isinstance(who, dict) and isinstance(who.get("login"), str):
            return str(who["login"])
    return None


def _issue(issue: dict[str, Any], *, created: bool) -> dict[str, Any]:
    return {
        "number": issue.get("number"),
        "html_url": issue.get("html_url"),
        "created": created,  # False: an earlier attempt of this call had opened it
    }


def _comment(comment: dict[str, Any], *, created: bool) -> dict[str, Any]:
    return {
        "comment_id": comment.get("id"),
        "html_url": comment.get("html_url"),
        "created": created,
    }
