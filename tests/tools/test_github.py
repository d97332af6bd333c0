"""The GitHub tools (``integrations.github``) against a fake GitHub at the wire."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bot.configured import tool_sources
from engine.config_file import ConfigFile
from tests.fakes.github import LOGIN, REPO, TOKEN, App, FakeGitHub
from tools import RetryableToolError, ToolContext, ToolError
from tools.errors import OutcomeUnknown
from tools.integrations.config import GitHubConfig
from tools.integrations.github import (
    CommentArgs,
    DispatchArgs,
    GitHubLoadError,
    GitHubSource,
    IssueArgs,
    JobLogArgs,
    ListRunsArgs,
    RunArgs,
    marker,
)
from tools.integrations.github_client import TOKEN_MARGIN_S, GitHubClient
from tools.wait import WaitFor

KEY = "thr_0123456789abcdef0123:toolu_01"


def config(url: str, **more: Any) -> GitHubConfig:
    raw: dict[str, Any] = {"token": TOKEN, "api_url": url, "repos": [REPO], "poll_every": "1s"}
    raw.update(more)
    return GitHubConfig.model_validate(raw)


def ctx(attempt: int = 1, key: str = KEY, first: datetime | None = None) -> ToolContext:
    return ToolContext(
        thread_id=key.split(":")[0],
        tool_call_id=key.split(":")[1],
        idempotency_key=key,
        attempt=attempt,
        first_started_at=first or datetime.now(UTC) - timedelta(seconds=30),
    )


async def _no_sleep(seconds: float) -> None:
    return None


@pytest.fixture
async def gh() -> AsyncIterator[FakeGitHub]:
    async with FakeGitHub() as fake:
        yield fake


@pytest.fixture
async def source(gh: FakeGitHub) -> AsyncIterator[GitHubSource]:
    src = GitHubSource(config(gh.url), sleep=_no_sleep)
    await src.open()
    try:
        yield src
    finally:
        await src.close()


def deploy(workflow: str = "deploy.yml", ref: str = "main", **inputs: str) -> DispatchArgs:
    return DispatchArgs(
        repo=REPO, workflow=workflow, ref=ref, inputs=inputs or {"environment": "prod"}
    )


def run_of(wait: WaitFor) -> int:
    return int(wait.data["github_run"]["run_id"])


# --- the source ------------------------------------------------------------------------


async def test_the_source_offers_the_contract_tools_with_their_default_policies(
    gh: FakeGitHub,
) -> None:
    file = ConfigFile.model_validate(
        {"integrations": {"github": {"token": TOKEN, "api_url": gh.url, "repos": [REPO]}}}
    )
    [src] = [s for s in tool_sources(file) if isinstance(s, GitHubSource)]
    assert src.key == "integrations.github"
    tools = {t.name: t for t in await src.open()}
    await src.close()
    assert {n: t.policy for n, t in tools.items()} == {
        "github_dispatch_workflow": "approve_before_run",
        "github_run_status": "run_now",
        "github_list_runs": "run_now",
        "github_get_job_log": "run_now",
        "github_create_issue": "approve_before_run",
        "github_comment": "approve_before_run",
    }
    assert all(t.idempotent for t in tools.values())  # the writes look before repeating
    assert tools["github_dispatch_workflow"].poll is not None
    assert gh.calls == []  # opening asks GitHub nothing


def _ec_key() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@pytest.mark.parametrize(
    ("pem", "why"),
    [("not a key", "not a PEM private key"), (_ec_key(), "not an RSA private key")],
)
async def test_a_private_key_that_cannot_sign_is_refused_when_the_source_opens(
    gh: FakeGitHub, pem: str, why: str
) -> None:
    bad = GitHubConfig.model_validate(
        {"app_id": 1, "private_key": pem, "installation_id": 2, "api_url": gh.url, "repos": [REPO]}
    )
    with pytest.raises(GitHubLoadError, match=rf"^integrations\.github\.private_key: {why}"):
        await GitHubSource(bad).open()


async def test_a_repository_not_listed_is_refused_before_github_is_asked(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    with pytest.raises(ToolError, match=r"'acme/secret' is not a repository.*acme/api"):
        await source.dispatch(
            DispatchArgs(repo="acme/secret", workflow="deploy.yml", ref="main"), ctx()
        )
    assert gh.calls == []
    # GitHub's names are case-insensitive: the configured spelling is used.
    assert source.allowed("ACME/Api") == REPO


# --- dispatch and wait ---------------------------------------------------------------


async def test_a_dispatch_takes_the_run_id_github_returns_and_waits_on_it(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    wait = await source.dispatch(deploy(), ctx())
    assert isinstance(wait, WaitFor)
    [run] = gh.runs_of()
    assert wait.data["github_run"] == {"repo": REPO, "run_id": run.id}
    assert wait.data["found"] == "returned by the dispatch"
    assert wait.poll_every_s == 1.0 and wait.timeout_s == 3600.0
    # deploy.yml has no opsloop_key input: refused with 422 (nothing ran), sent without.
    keyed, plain = gh.dispatches()
    assert keyed.body["inputs"] == {"environment": "prod", "opsloop_key": KEY}
    assert plain.body == {
        "ref": "main",
        "inputs": {"environment": "prod"},
        "return_run_details": True,
    }
    # ... and remembered: the next dispatch of that workflow is one request.
    await source.dispatch(deploy(), ctx(key="thr_0123456789abcdef0123:toolu_02"))
    assert len(gh.dispatches()) == 3 and len(gh.runs_of()) == 2


async def test_a_204_dispatch_finds_its_run_by_correlation(gh: FakeGitHub) -> None:
    gh.run_details = False  # a server from before return_run_details
    async with _source(gh) as source:
        wait = await source.dispatch(deploy(), ctx())
    [run] = gh.runs_of()
    assert run_of(wait) == run.id
    assert wait.data["found"].startswith(
        f"correlated: the workflow_dispatch run of deploy.yml on main by {LOGIN}"
    )


async def test_a_server_that_refuses_return_run_details_is_asked_without_it(
    gh: FakeGitHub,
) -> None:
    gh.run_details = None  # an older GitHub Enterprise Server, say
    gh.add_workflow(REPO, "any.yml")
    async with _source(gh) as source:
        wait = await source.dispatch(deploy("any.yml"), ctx())
        await source.dispatch(deploy("any.yml"), ctx(key="thr_0123456789abcdef0123:toolu_02"))
    first, second, third = gh.dispatches()
    assert "return_run_details" in first.body  # refused: 422, nothing ran
    assert "return_run_details" not in second.body and "return_run_details" not in third.body
    assert run_of(wait) == gh.runs_of()[0].id and wait.data["found"].startswith("correlated")
    assert len(gh.runs_of()) == 2


async def test_a_workflow_that_shows_the_key_in_its_run_name_is_found_by_it(
    gh: FakeGitHub,
) -> None:
    gh.run_details = False
    gh.add_workflow(
        REPO, "keyed.yml", inputs={"environment", "opsloop_key"}, run_name="Deploy {opsloop_key}"
    )
    async with _source(gh) as source:
        wait = await source.dispatch(deploy("keyed.yml"), ctx())
    [run] = gh.runs_of()
    assert run.display_title == f"Deploy {KEY}"
    assert run_of(wait) == run.id and wait.data["found"] == "by its key in the run's name"
    assert len(gh.dispatches()) == 1  # the input was accepted at once


@pytest.mark.parametrize("workflow", ["deploy.yml", "keyed.yml"])
async def test_a_retry_finds_the_run_an_interrupted_attempt_dispatched(
    gh: FakeGitHub, workflow: str
) -> None:
    gh.add_workflow(
        REPO, "keyed.yml", inputs={"environment", "opsloop_key"}, run_name="Deploy {opsloop_key}"
    )
    first = datetime.now(UTC) - timedelta(seconds=1)
    async with _source(gh) as source:
        await source.dispatch(deploy(workflow), ctx(first=first))  # its answer "lost"
    async with _source(gh) as restarted:  # a new process: nothing remembered
        wait = await restarted.dispatch(deploy(workflow), ctx(attempt=2, first=first))
    [run] = gh.runs_of()  # never dispatched twice
    assert run_of(wait) == run.id
    expected = "by its key" if workflow == "keyed.yml" else "correlated"
    assert wait.data["found"].startswith(expected)


async def test_a_retry_whose_first_attempt_never_dispatched_dispatches(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    wait = await source.dispatch(deploy(), ctx(attempt=2))
    [run] = gh.runs_of()
    assert run_of(wait) == run.id
    # It looked twice (a just-dispatched run may be listed late), then dispatched.
    listed = [c for c in gh.calls if c.method == "GET" and c.path.endswith("/runs")]
    assert len(listed) == 2
    assert listed[0].query["event"] == "workflow_dispatch"
    assert listed[0].query["created"].startswith(">=")


async def test_correlation_passes_over_runs_that_are_not_this_calls(gh: FakeGitHub) -> None:
    """Another call's keyed run, a run on another branch, another person's run and a run
    from before the call's first attempt are none of them taken for this call's run."""
    first = datetime.now(UTC)
    async with _source(gh) as source:
        await source.dispatch(deploy(ref="main"), ctx(key="thr_00000000000000000000:toolu_9"))
    [older] = gh.runs_of()
    older.created_at -= timedelta(minutes=5)  # before this call started
    async with _source(gh) as source:
        await source.dispatch(deploy(ref="release"), ctx(key="thr_11111111111111111111:toolu_1"))
    gh.login, login = "someone-else", gh.login
    gh.token, token = "ghp_someone_else", gh.token
    async with _source(gh, token="ghp_someone_else") as theirs:
        await theirs.dispatch(deploy(ref="main"), ctx(key="thr_22222222222222222222:toolu_1"))
    gh.login, gh.token = login, token
    before = {r.id for r in gh.runs_of()}
    async with _source(gh) as source:
        wait = await source.dispatch(deploy(ref="main"), ctx(attempt=2, first=first))
    new = {r.id for r in gh.runs_of()} - before
    assert len(new) == 1 and run_of(wait) in new  # none of those: it dispatched its own


async def test_the_poll_reports_the_conclusion_duration_url_and_failed_jobs(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    wait = await source.dispatch(deploy(), ctx())
    run_id = run_of(wait)
    assert await source.poll(wait.data, ctx()) is None  # queued
    gh.start(run_id)
    assert await source.poll(wait.data, ctx()) is None  # in progress
    gh.complete(run_id, "failure", failed=("deploy",))
    result = await source.poll(wait.data, ctx())
    assert result is not None
    assert result["conclusion"] == "failure"
    assert result["failed_jobs"] == ["deploy"]
    assert result["html_url"] == f"{gh.web}/{REPO}/actions/runs/{run_id}"
    assert isinstance(result["duration_s"], float)
    assert result["found"] == "returned by the dispatch"


async def test_a_successful_run_is_reported_without_asking_for_its_jobs(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    wait = await source.dispatch(deploy(), ctx())
    gh.complete(run_of(wait))
    result = await source.poll(wait.data, ctx())
    assert result is not None and result["conclusion"] == "success"
    assert result["failed_jobs"] == []
    assert not [c for c in gh.calls if c.path.endswith("/jobs")]


async def test_the_poll_waits_on_when_github_is_away_and_ends_when_the_run_is_gone(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    wait = await source.dispatch(deploy(), ctx())
    run_id = run_of(wait)
    gh.fail("GET", f"/actions/runs/{run_id}", 502)
    assert await source.poll(wait.data, ctx()) is None  # asked again at the next poll
    del gh.runs[run_id]
    gone = await source.poll(wait.data, ctx())
    assert gone is not None and gone["conclusion"] is None and "404" in gone["error"]


# --- failures ----------------------------------------------------------------------------


async def test_a_dispatch_that_may_have_happened_is_outcome_unknown(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    gh.add_workflow(REPO, "any.yml")  # accepts the key: one request
    gh.fail("POST", "/dispatches", 502, message="Bad gateway")
    with pytest.raises(OutcomeUnknown, match="502"):
        await source.dispatch(deploy("any.yml"), ctx())


async def test_a_rate_limited_request_is_retried_after_the_reset(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    reset = int(datetime.now(UTC).timestamp()) + 42
    gh.fail(
        "GET",
        "/actions/runs",
        403,
        headers={"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)},
        message="API rate limit exceeded",
    )
    with pytest.raises(RetryableToolError, match="rate limit") as caught:
        await source.list_runs(ListRunsArgs(repo=REPO), ctx())
    assert caught.value.retry_after is not None and 30 < caught.value.retry_after <= 42


async def test_a_workflow_github_does_not_know_is_a_plain_error(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    with pytest.raises(ToolError, match="404") as caught:
        await source.dispatch(deploy("nope.yml"), ctx())
    assert not isinstance(caught.value, RetryableToolError | OutcomeUnknown)


async def test_github_out_of_reach_is_retryable(gh: FakeGitHub) -> None:
    async with _source(gh, api_url="http://127.0.0.1:9") as source:  # nothing listens
        with pytest.raises(RetryableToolError, match="no answer from GitHub"):
            await source.dispatch(deploy(), ctx())


# --- reads ------------------------------------------------------------------------------


async def test_run_status_and_list_runs(gh: FakeGitHub, source: GitHubSource) -> None:
    wait = await source.dispatch(deploy(), ctx())
    run_id = run_of(wait)
    gh.complete(run_id, "failure", failed=("build",))
    status = await source.run_status(RunArgs(repo=REPO, run_id=run_id), ctx())
    assert status["status"] == "completed" and status["conclusion"] == "failure"
    assert [(j["name"], j["conclusion"]) for j in status["jobs"]] == [
        ("build", "failure"),
        ("deploy", "success"),
    ]
    listed = await source.list_runs(ListRunsArgs(repo=REPO, workflow="deploy.yml"), ctx())
    assert [r["run_id"] for r in listed["runs"]] == [run_id]
    assert listed["runs"][0]["actor"] == LOGIN
    none = await source.list_runs(ListRunsArgs(repo=REPO, status="success"), ctx())
    assert none["runs"] == []


@pytest.mark.parametrize("redirect", [True, False])
async def test_a_job_log_is_its_tail_with_the_rest_elided(gh: FakeGitHub, redirect: bool) -> None:
    """GitHub's 302 to the download is followed without our token (the storage host
    refuses a request carrying one, as the fake does)."""
    gh.logs_redirect = redirect
    async with _source(gh) as source:
        wait = await source.dispatch(deploy(), ctx())
        job = gh.runs[run_of(wait)].jobs[0]
        log = await source.job_log(JobLogArgs(repo=REPO, job_id=job.id, lines=5), ctx())
    assert log["lines"] == 300 and log["elided"] == 295
    text = log["log"].splitlines()
    assert text[0] == "… 295 earlier lines elided"
    assert text[1:] == [f"2026-01-01T00:00:{i % 60:02d}Z build: step {i}" for i in range(296, 301)]
    if redirect:
        [download] = [c for c in gh.calls if c.path.startswith("/_blob/")]
        assert "Authorization" not in download.headers


# --- issues and comments ---------------------------------------------------------------


async def test_an_issue_carries_its_key_and_a_retry_finds_it_instead_of_opening_another(
    gh: FakeGitHub, source: GitHubSource
) -> None:
    args = IssueArgs(repo=REPO, title="Deploy failed", body="The deploy job failed.")
    made = await source.create_issue(args, ctx())
    assert made["created"] is True and made["number"] == 1
    [issue] = gh.issues[REPO]
    assert issue["body"] == f"The deploy job failed.\n\n{marker(KEY)}"
    again = await source.create_issue(args, ctx(attempt=2))
    assert again == {**made, "created": False}
    assert len(gh.issues[REPO]) == 1
    listed = [c for c in gh.calls if c.method == "GET" and c.path.endswith("/issues")]
    assert listed[0].query["creator"] == LOGIN  # only ours are looked through
    # Another call's retry does not take this call's issue.
    other = await source.create_issue(args, ctx(attempt=2, key="thr_1:toolu_2"))
    assert other["created"] is True and len(gh.issues[REPO]) == 2


async def test_a_comment_is_made_once_for_one_call(gh: FakeGitHub, source: GitHubSource) -> None:
    await source.create_issue(IssueArgs(repo=REPO, title="t"), ctx(key="thr_9:toolu_9"))
    args = CommentArgs(repo=REPO, number=1, body="Rolled back.")
    made = await source.comment(args, ctx())
    again = await source.comment(args, ctx(attempt=3))
    assert made["created"] is True and again == {**made, "created": False}
    [comment] = gh.comments[(REPO, 1)]
    assert comment["body"] == f"Rolled back.\n\n{marker(KEY)}"


# --- a GitHub App --------------------------------------------------------------------------


def _app_keys() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


async def test_a_github_app_signs_a_jwt_for_an_installation_token_and_reuses_it() -> None:
    private, public = _app_keys()
    # Its installation tokens last half a minute past our renewal margin.
    ttl = timedelta(seconds=TOKEN_MARGIN_S + 30)
    app = App(app_id=77, public_key=public, installation_id=5, token_ttl=ttl)
    async with FakeGitHub(app=app) as gh:
        cfg = GitHubConfig.model_validate(
            {
                "app_id": 77,
                "private_key": private,
                "installation_id": 5,
                "api_url": gh.url,
                "repos": [REPO],
            }
        )
        clock = [datetime.now(UTC).timestamp()]
        client = GitHubClient(cfg, clock=lambda: clock[0])
        try:
            await client.workflow_runs(REPO)
            await client.workflow_runs(REPO)
            minted = [c for c in gh.calls if c.path.endswith("/access_tokens")]
            assert len(minted) == 1  # cached
            assert await client.login() == "opsloop-app[bot]"
            # Within the margin of its expiry, it is renewed.
            clock[0] += 31
            await client.workflow_runs(REPO)
            minted = [c for c in gh.calls if c.path.endswith("/access_tokens")]
            assert len(minted) == 2
        finally:
            await client.close()
        runs = [c for c in gh.calls if c.path.endswith("/actions/runs")]
        assert all(c.headers["Authorization"].startswith("Bearer ghs_") for c in runs)


# --- helpers ----------------------------------------------------------------------------


class _source:
    """A source on ``gh`` for one block (as a process would open and close it)."""

    def __init__(self, gh: FakeGitHub, **more: Any) -> None:
        url = more.pop("api_url", gh.url)
        self.src = GitHubSource(config(url, **more), sleep=_no_sleep)

    async def __aenter__(self) -> GitHubSource:
        await self.src.open()
        return self.src

    async def __aexit__(self, *exc: object) -> None:
        await self.src.close()


async def test_a_run_of_a_fake_that_runs_by_itself_goes_queued_in_progress_completed() -> None:
    """``FakeGitHub(auto=…)`` (what ``opsloop local`` walks through) ends runs itself."""
    async with FakeGitHub(auto=0.2) as gh, _source(gh) as source:
        wait = await source.dispatch(deploy(), ctx())
        seen = [gh.runs[run_of(wait)].status]
        async with asyncio.timeout(10):
            while (result := await source.poll(wait.data, ctx())) is None:
                seen.append(gh.runs[run_of(wait)].status)
                await asyncio.sleep(0.02)
    assert seen[0] == "queued" and set(seen) <= {"queued", "in_progress"}
    assert result["conclusion"] == "success" and result["duration_s"] is not None
