"""``POST /hooks/github``: GitHub's ``workflow_run`` webhook ends a thread's wait on a run.

Set up in the repository (or organisation) settings: payload URL
``https://<opsloop>/hooks/github``, content type ``application/json``, the secret of
``integrations.github.webhook_secret``, the "Workflow runs" event. GitHub signs each
delivery with ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>``
(https://docs.github.com/webhooks/using-webhooks/validating-webhook-deliveries); a
missing, repeated or wrong signature is 401, a body over ``MAX_BODY`` 413, a signed
body that is not a ``workflow_run`` event's JSON 400, and nothing is stored for any.

A ``ping`` is 200; other events, and runs that are not ours to look at (not completed,
not ``workflow_dispatch``, another repository), are 200 and ignored, so GitHub does not
mark the hook as failing.

Which wait a run ends: a wait id is ``{thread_id}.{random}``, made by the engine after
the tool dispatched the run, so no run id leads to it. The route looks through the
threads awaiting a job (the ``status`` index finds them; a handful, in practice) for the
one whose wait data names this repository and run (``tools.integrations.github.wait_key``):
one read per waiting thread, and only for a completed ``workflow_dispatch`` run of a
listed repository, never for the CI runs of every push. The result is the one the poll
gives (``run_result``): the failed jobs' names are asked of GitHub when the run failed,
and if GitHub cannot say now the wait is left to the poll (202).

A delivery repeated, or one racing the poll, finishes the wait once: ``finish_wait``
refuses a wait that is no longer open, and dedupes on the run and its attempt.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bot import signing
from bot.hooks import BodyTooLarge, read_body
from engine.errors import ThreadNotFound
from engine.inputs import Accepted, finish_wait
from engine.state import WaitInfo
from engine.store import Store
from tools.integrations.config import GitHubConfig
from tools.integrations.github import finished_run, wait_key
from tools.integrations.github_client import GitHubClient, GitHubError

log = logging.getLogger("opsloop.hooks.github")

PATH = "/hooks/github"
MAX_BODY = 1_000_000  # a workflow_run delivery is some 20 KB
SIGNATURE_HEADER = "X-Hub-Signature-256"
EVENT_HEADER = "X-GitHub-Event"
ACTOR = "github"
_WAITING_SCAN = 1000  # threads awaiting a job looked through, newest first


def signature(secret: str, body: bytes) -> str:
    """``X-Hub-Signature-256`` of ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def check_signature(secret: str, headers: signing.Headers, body: bytes) -> str | None:
    """None if ``body`` is signed with ``secret``; otherwise why not."""
    try:
        given = signing.one_header(headers, SIGNATURE_HEADER)
    except ValueError as exc:
        return str(exc)
    if not given:
        return f"missing {SIGNATURE_HEADER}"
    if not given.startswith("sha256=") or len(given) != 71:
        return f"malformed {SIGNATURE_HEADER}"
    if not hmac.compare_digest(signature(secret, body), given):
        return "bad signature"
    return None


async def find_run_wait(store: Store, repo: str, run_id: int) -> tuple[str, WaitInfo] | None:
    """The thread waiting on ``repo``'s run ``run_id``, and its wait."""
    wanted = (repo.lower(), run_id)
    for info in await store.list_threads("awaiting_job", limit=_WAITING_SCAN):
        try:
            state = await store.load(info.id)
        except ThreadNotFound:
            continue  # deleted since it was listed
        call = state.pending
        if state.status != "awaiting_job" or call is None or call.wait is None:
            continue  # moved on since it was listed
        if wait_key(call.wait.data) == wanted:
            return info.id, call.wait
    return None


class _Malformed(ValueError):
    pass


def _completed_run(payload: Any) -> tuple[str, str, dict[str, Any]]:
    """(action, repository, run) of a ``workflow_run`` delivery; ``_Malformed`` else."""
    if not isinstance(payload, dict):
        raise _Malformed("the body must be a JSON object")
    action, run, repository = (
        payload.get("action"),
        payload.get("workflow_run"),
        payload.get("repository"),
    )
    if not isinstance(action, str) or not isinstance(run, dict):
        raise _Malformed("a workflow_run event has an action and a workflow_run")
    if not isinstance(run.get("id"), int) or isinstance(run.get("id"), bool):
        raise _Malformed("workflow_run.id must be a number")
    name = repository.get("full_name") if isinstance(repository, dict) else None
    if not isinstance(name, str):
        raise _Malformed("repository.full_name is missing")
    return action, name, run


def add_github_hook_route(
    app: web.Application,
    store: Store,
    config: GitHubConfig,
    kick: Callable[[str], None],
    *,
    client: GitHubClient | None = None,
) -> None:
    """Serve ``POST /hooks/github``. Register it before ``/hooks/{wait_id}``: aiohttp
    matches routes in the order they were added."""
    secret = config.webhook_secret.get_secret_value() if config.webhook_secret else ""
    github = client or GitHubClient(config)
    repos = {r.lower(): r for r in config.repos}

    async def close(_app: web.Application) -> None:
        await github.close()

    app.on_cleanup.append(close)

    def answer(status: int = 200, **body: Any) -> web.Response:
        return web.json_response(body, status=status)

    async def hook(request: web.Request) -> web.Response:
        try:
            body = await read_body(request, MAX_BODY)
        except BodyTooLarge:
            log.info("github hook refused: body over %d bytes", MAX_BODY)
            return answer(413, error="body too large")
        why = "GitHub webhooks are disabled: integrations.github.webhook_secret is not set"
        if secret:
            why = check_signature(secret, request.headers, body) or ""
        if why:
            log.info("github hook refused: %s", why)
            return answer(401, error=why)
        event = request.headers.get(EVENT_HEADER, "")
        if event == "ping":
            return answer(ok=True, pong=True)
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            log.info("github hook refused: the body is not JSON")
            return answer(400, error="the body is not JSON")
        if event != "workflow_run":
            return answer(ok=True, ignored=f"{event or 'unnamed'} events are not used")
        try:
            action, repo_name, run = _completed_run(payload)
        except _Malformed as exc:
            log.info("github hook refused: %s", exc)
            return answer(400, error=str(exc))
        repo = repos.get(repo_name.lower())
        if action != "completed" or repo is None or run.get("event") != "workflow_dispatch":
            return answer(ok=True, ignored="not a finished dispatched run of a listed repository")
        return await _finish(repo, run)

    async def _finish(repo: str, run: dict[str, Any]) -> web.Response:
        run_id = int(run["id"])
        found = await find_run_wait(store, repo, run_id)
        if found is None:
            return answer(ok=True, matched=False)
        thread_id, wait = found
        try:
            result = await finished_run(github, repo, run, wait.data.get("found"))
        except GitHubError as exc:
            log.warning(
                "github hook: the failed jobs of run %s are unknown (%s); left to the poll "
                "thread_id=%s",
                run_id,
                exc,
                thread_id,
            )
            return answer(202, ok=True, matched=True, finished=False)
        attempt = run.get("run_attempt") if isinstance(run.get("run_attempt"), int) else 1
        try:
            done = await finish_wait(
                store,
                thread_id,
                wait_id=wait.wait_id,
                result=result,
                actor=ACTOR,
                dedupe_key=f"github:{repo.lower()}:{run_id}:{attempt}",
            )
        except ThreadNotFound:
            return answer(ok=True, matched=False)
        if not isinstance(done, Accepted):
            # The poll (or an earlier delivery) ended the wait first: nothing to do.
            return answer(ok=True, matched=True, finished=False, reason=done.reason)
        if not done.deduplicated:
            kick(thread_id)
        log.info("github hook: run %s finished thread_id=%s", run_id, thread_id)
        return answer(ok=True, matched=True, finished=True, thread_id=thread_id)

    app.router.add_post(PATH, hook)
