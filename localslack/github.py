"""A fake GitHub: the REST endpoints opsloop uses, as an aiohttp app.

It serves on its own 127.0.0.1 port for tests (``async with FakeGitHub() as gh``) or
mounted on another app's port (:meth:`FakeGitHub.mount`: ``opsloop local`` serves it
under ``/github`` beside the page, and its opsloop.yaml points ``api_url`` there).

Shapes and statuses are GitHub's (https://docs.github.com/rest): ``workflow_dispatch``
answers 204, or 200 with ``workflow_run_id``/``run_url``/``html_url`` when asked for
``return_run_details`` (``run_details=False`` plays a server from before that, which
ignores it; ``None`` one that refuses the key with 422); a
workflow refuses inputs it does not declare with 422 ``Unexpected inputs provided``;
``display_title`` is the workflow's ``run-name`` when it has one, else its name; a job's
log is a 302 to a signed download URL that refuses an ``Authorization`` header (as
storage hosts refuse a second credential), or the text itself (``logs_redirect=False``);
errors are ``{"message": ...}``. Credentials: the token, a GitHub App's JWT (RS256,
checked with the app's public key) for ``/app`` and installation tokens, and the
installation tokens it issued.

Runs go ``queued`` → ``in_progress`` → ``completed`` when a test says (``start``,
``complete``) or on their own (``auto=seconds``). Every request is recorded in
``calls``; ``wait_for`` waits on them instead of sleeping. ``hold`` makes requests take
effect and keeps their answers until the test says: a client killed meanwhile never
learns that its dispatch happened, a poll can be made to lose a race.
``delivery`` builds a ``workflow_run`` webhook as GitHub signs it (``X-Hub-Signature-256``);
with ``hooks`` (URL and secret), the fake sends those itself as its runs are requested,
start and complete, once each, as GitHub does (no retry: the poll is what catches up).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web

from localslack.loopback import serve

log = logging.getLogger("opsloop.local.github")

TOKEN = "ghp_fake0000000000000000000000000000001"
LOGIN = "opsloop-bot"
REPO = "acme/api"
WEBHOOK_SECRET = "gh-webhook-secret-5e1f"


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def stamp(moment: datetime | None) -> str | None:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass
class App:
    """A GitHub App: its id, its public key (PEM), one installation."""

    app_id: int
    public_key: str
    installation_id: int
    slug: str = "opsloop-app"
    token_ttl: timedelta = timedelta(hours=1)


@dataclass
class Workflow:
    id: int
    file: str
    name: str
    inputs: frozenset[str] | None = None  # None: any input is accepted
    run_name: str | None = None  # "Deploy {environment} {opsloop_key}"


@dataclass
class Job:
    id: int
    name: str
    status: str = "queued"
    conclusion: str | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    log: str = ""

    def record(self, run: Run, base: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": run.id,
            "name": self.name,
            "status": self.status,
            "conclusion": self.conclusion,
            "started_at": stamp(self.started_at),
            "completed_at": stamp(self.completed_at),
            "html_url": f"{base}/{run.repo}/actions/runs/{run.id}/job/{self.id}",
        }


@dataclass
class Run:
    id: int
    repo: str
    workflow: Workflow
    head_branch: str
    head_sha: str
    display_title: str
    actor: str
    inputs: dict[str, Any]
    created_at: datetime
    status: str = "queued"
    conclusion: str | None = None
    run_started_at: datetime | None = None
    updated_at: datetime | None = None
    run_attempt: int = 1
    jobs: list[Job] = field(default_factory=list)

    def record(self, base: str, api: str) -> dict[str, Any]:
        html = f"{base}/{self.repo}/actions/runs/{self.id}"
        who = {"login": self.actor, "id": 1, "type": "Bot" if "[bot]" in self.actor else "User"}
        return {
            "id": self.id,
            "name": self.workflow.name,
            "display_title": self.display_title,
            "run_number": self.id % 1000,
            "run_attempt": self.run_attempt,
            "event": "workflow_dispatch",
            "status": self.status,
            "conclusion": self.conclusion,
            "workflow_id": self.workflow.id,
            "path": f".github/workflows/{self.workflow.file}",
            "head_branch": self.head_branch,
            "head_sha": self.head_sha,
            "html_url": html,
            "url": f"{api}/repos/{self.repo}/actions/runs/{self.id}",
            "jobs_url": f"{api}/repos/{self.repo}/actions/runs/{self.id}/jobs",
            "logs_url": f"{api}/repos/{self.repo}/actions/runs/{self.id}/logs",
            "created_at": stamp(self.created_at),
            "updated_at": stamp(self.updated_at or self.created_at),
            "run_started_at": stamp(self.run_started_at or self.created_at),
            "actor": who,
            "triggering_actor": who,
            "repository": {"full_name": self.repo, "name": self.repo.split("/")[1]},
        }


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]


class FakeGitHub:
    """GitHub's REST API for a few repositories, in memory, for tests."""

    def __init__(
        self,
        *,
        token: str = TOKEN,
        login: str = LOGIN,
        repos: tuple[str, ...] = (REPO,),
        run_details: bool | None = True,
        logs_redirect: bool = True,
        app: App | None = None,
        auto: float | None = None,
        jobs: tuple[str, ...] = ("build", "deploy"),
        hooks: Sequence[tuple[str, str]] = (),
        first_id: int = 9_000_001,
    ) -> None:
        self.token, self.login, self.app = token, login, app
        self.run_details = run_details
        self.logs_redirect = logs_redirect
        self.auto = auto  # seconds a dispatched run takes by itself (None: as tests say)
        self.job_names = jobs
        self.workflows: dict[str, list[Workflow]] = {r: [] for r in repos}
        self.runs: dict[int, Run] = {}
        self.issues: dict[str, list[dict[str, Any]]] = {r: [] for r in repos}
        self.comments: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.installation_tokens: dict[str, datetime] = {}
        self.calls: list[Call] = []
        self.hooks = list(hooks)  # (URL, secret): where workflow_run webhooks go
        self._holds: list[tuple[str, str, asyncio.Event]] = []
        self._failures: list[tuple[str, str, int, dict[str, str], dict[str, Any]]] = []
        self._ids = itertools.count(first_id)  # runs, jobs and workflows
        self._numbers = itertools.count(1)
        self._cond = asyncio.Condition()  # bound to the loop that first waits on it
        self._runner: web.AppRunner | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._deliveries: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self.url = ""  # the API's base URL (api_url)
        self.web = "https://github.example"
        for repo in repos:
            self.add_workflow(repo, "deploy.yml", name="Deploy", inputs={"environment"})

    # --- lifecycle --------------------------------------------------------------------

    def web_app(self) -> web.Application:
        """The API as an aiohttp app: its own server's, or mounted (:meth:`mount`)."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch_request)
        return app

    def mount(self, app: web.Application, prefix: str, url: str) -> None:
        """Serve the API under ``prefix`` of ``app``, which is reached at ``url``."""
        app.add_subapp(prefix, self.web_app())
        self.url = url.rstrip("/")

    async def __aenter__(self) -> FakeGitHub:
        self._runner, port = await serve(self.web_app(), shutdown_timeout=1.0)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def close(self) -> None:
        """Stop the runs' clocks, answer what is held, end the webhooks under way."""
        for timer in self._timers:
            timer.cancel()
        self.unhold()
        for task in list(self._deliveries):
            task.cancel()
        await asyncio.gather(*self._deliveries, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    # --- controls for tests -----------------------------------------------------------

    def add_workflow(
        self,
        repo: str,
        file: str,
        *,
        name: str | None = None,
        inputs: set[str] | None = None,
        run_name: str | None = None,
    ) -> Workflow:
        flow = Workflow(
            id=next(self._ids),
            file=file,
            name=name or file.rsplit(".", 1)[0],
            inputs=frozenset(inputs) if inputs is not None else None,
            run_name=run_name,
        )
        self.workflows.setdefault(repo, []).append(flow)
        return flow

    def start(self, run_id: int) -> Run:
        run = self.runs[run_id]
        run.status, run.run_started_at, run.updated_at = "in_progress", now(), now()
        for job in run.jobs:
            job.status, job.started_at = "in_progress", now()
        self._notify(run_id, "in_progress")
        return run

    def complete(
        self, run_id: int, conclusion: str = "success", *, failed: tuple[str, ...] = ()
    ) -> Run:
        """End the run: ``failed`` jobs fail, the others succeed."""
        run = self.runs[run_id]
        if run.status == "queued":
            self.start(run_id)
        run.status, run.conclusion, run.updated_at = "completed", conclusion, now()
        for job in run.jobs:
            job.status, job.completed_at = "completed", now()
            job.conclusion = "failure" if job.name in failed else "success"
        self._notify(run_id, "completed")
        return run

    def fail(
        self,
        method: str,
        path_part: str,
        status: int,
        *,
        headers: dict[str, str] | None = None,
        message: str = "Server Error",
    ) -> None:
        """Answer the next request of ``method`` whose path holds ``path_part`` with
        ``status`` (and ``headers``), doing nothing."""
        self._failures.append((method, path_part, status, headers or {}, {"message": message}))

    def hold(self, method: str, path_part: str) -> asyncio.Event:
        """Do what requests of ``method`` whose path holds ``path_part`` ask, but keep
        their answers until the event is set (at the latest when the fake stops)."""
        gate = asyncio.Event()
        self._holds.append((method, path_part, gate))
        return gate

    def unhold(self) -> None:
        """Answer what is held, and hold nothing more (on the fake's loop)."""
        for _, _, gate in self._holds:
            gate.set()
        self._holds.clear()

    def dispatches(self) -> list[Call]:
        return [c for c in self.calls if c.method == "POST" and c.path.endswith("/dispatches")]

    def runs_of(self, repo: str = REPO) -> list[Run]:
        return [r for r in self.runs.values() if r.repo == repo]

    async def wait_for(
        self,
        match: Any,
        count: int = 1,
        timeout: float = 10,  # noqa: ASYNC109 - a test helper's deadline, as asyncio.wait_for
    ) -> list[Call]:
        """The first ``count`` calls for which ``match(call)`` holds, once made."""
        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: len([c for c in self.calls if match(c)]) >= count),
                timeout,
            )
        return [c for c in self.calls if match(c)][:count]

    def workflow_run_event(self, run_id: int, action: str = "completed") -> dict[str, Any]:
        """The ``workflow_run`` webhook payload GitHub sends for the run now."""
        run = self.runs[run_id]
        record = run.record(self.web, self.url)
        return {
            "action": action,
            "workflow_run": record,
            "workflow": {"id": run.workflow.id, "name": run.workflow.name, "path": record["path"]},
            "repository": record["repository"],
            "sender": record["actor"],
        }

    # --- webhooks ---------------------------------------------------------------------

    def _notify(self, run_id: int, action: str) -> None:
        """Send the run's ``workflow_run`` event to each hook, in the background."""
        if not self.hooks:
            return
        payload = self.workflow_run_event(run_id, action)
        for url, secret in self.hooks:
            task = asyncio.get_running_loop().create_task(self._deliver(url, secret, payload))
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)

    async def _deliver(self, url: str, secret: str, payload: dict[str, Any]) -> None:
        body, headers = delivery(payload, secret=secret)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with self._session.post(url, data=body, headers=headers) as resp:
                if resp.status >= 300:
                    text = (await resp.text())[:200]
                    log.warning("workflow_run webhook answered %s: %s", resp.status, text)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("workflow_run webhook to %s failed: %s", url, exc)

    # --- the server -------------------------------------------------------------------

    async def _dispatch_request(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return _message(400, "Problems parsing JSON")
        path = "/" + request.match_info["tail"]  # the API's own path, wherever it is mounted
        call = Call(request.method, path, dict(request.query), body, dict(request.headers))
        self.calls.append(call)
        async with self._cond:
            self._cond.notify_all()
        for i, (method, part, status, headers, payload) in enumerate(self._failures):
            if method == request.method and part in path:
                del self._failures[i]
                return web.json_response(payload, status=status, headers=headers)
        if path.startswith("/_blob/"):
            return self._blob(request)
        answer = await self._api(request, path, body)
        for method, part, gate in self._holds:
            if method == request.method and part in path:
                await gate.wait()  # done; answered when the test says
        return answer

    async def _api(self, request: web.Request, path: str, body: Any) -> web.StreamResponse:
        parts = path.strip("/").split("/")
        method = request.method
        auth = request.headers.get("Authorization", "")
        if parts[0] == "app":
            if not self._app_jwt_ok(auth):
                return _message(401, "A JSON web token could not be decoded")
            if method == "GET" and parts == ["app"]:
                assert self.app is not None
                return web.json_response({"id": self.app.app_id, "slug": self.app.slug})
            if method == "POST" and len(parts) == 4 and parts[3] == "access_tokens":
                return self._access_token(parts[2])
            return _message(404, "Not Found")
        who = self._caller(auth)
        if who is None:
            return _message(401, "Bad credentials")
        if method == "GET" and parts == ["user"]:
            if who.endswith("[bot]"):
                return _message(403, "Resource not accessible by integration")
            return web.json_response({"login": who, "id": 1, "type": "User"})
        if len(parts) < 3 or parts[0] != "repos":
            return _message(404, "Not Found")
        repo, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        if repo not in self.workflows:
            return _message(404, "Not Found")
        return await self._repo(request, who, repo, rest, body)

    async def _repo(
        self, request: web.Request, who: str, repo: str, rest: list[str], body: Any
    ) -> web.StreamResponse:
        method, q = request.method, request.query
        match rest:
            case ["actions", "workflows", flow, "dispatches"] if method == "POST":
                return self._workflow_dispatch(repo, flow, who, body)
            case ["actions", "workflows", flow, "runs"] if method == "GET":
                found = self._workflow(repo, flow)
                if found is None:
                    return _message(404, "Not Found")
                return self._runs(repo, q, found)
            case ["actions", "runs"] if method == "GET":
                return self._runs(repo, q, None)
            case ["actions", "runs", run_id] if method == "GET":
                run = self._run(repo, run_id)
                return _json(run.record(self.web, self.url)) if run else _message(404, "Not Found")
            case ["actions", "runs", run_id, "jobs"] if method == "GET":
                run = self._run(repo, run_id)
                if run is None:
                    return _message(404, "Not Found")
                jobs = [j.record(run, self.web) for j in run.jobs]
                return _json({"total_count": len(jobs), "jobs": jobs})
            case ["actions", "jobs", job_id, "logs"] if method == "GET":
                return self._job_log(repo, job_id)
            case ["issues"] if method == "POST":
                return self._create_issue(repo, who, body)
            case ["issues"] if method == "GET":
                return self._list_issues(repo, q)
            case ["issues", number, "comments"] if method == "POST":
                return self._create_comment(repo, number, who, body)
            case ["issues", number, "comments"] if method == "GET":
                return self._list_comments(repo, number, q)
        return _message(404, "Not Found")

    # --- credentials ------------------------------------------------------------------

    def _caller(self, auth: str) -> str | None:
        scheme, _, credential = auth.partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            return None
        if credential == self.token:
            return self.login
        expires = self.installation_tokens.get(credential)
        if expires is not None and expires > now() and self.app is not None:
            return f"{self.app.slug}[bot]"
        return None

    def _app_jwt_ok(self, auth: str) -> bool:
        if self.app is None or not auth.startswith("Bearer "):
            return False
        import jwt  # only a GitHub App needs it; local mode starts without it

        try:
            claims = jwt.decode(auth[7:], self.app.public_key, algorithms=["RS256"])
        except jwt.PyJWTError:
            return False
        # GitHub: iss is the app, exp at most 10 minutes ahead.
        too_long = claims.get("exp", 0) - datetime.now(UTC).timestamp() > 600
        return str(claims.get("iss")) == str(self.app.app_id) and not too_long

    def _access_token(self, installation: str) -> web.Response:
        assert self.app is not None
        if installation != str(self.app.installation_id):
            return _message(404, "Not Found")
        token = f"ghs_{uuid.uuid4().hex}"
        expires = now() + self.app.token_ttl
        self.installation_tokens[token] = expires
        return web.json_response({"token": token, "expires_at": stamp(expires)}, status=201)

    # --- Actions ----------------------------------------------------------------------

    def _workflow(self, repo: str, ref: str) -> Workflow | None:
        for flow in self.workflows[repo]:
            if ref in (flow.file, str(flow.id)):
                return flow
        return None

    def _run(self, repo: str, run_id: str) -> Run | None:
        run = self.runs.get(int(run_id)) if run_id.isdigit() else None
        return run if run is not None and run.repo == repo else None

    def _workflow_dispatch(self, repo: str, flow_ref: str, who: str, body: Any) -> web.Response:
        flow = self._workflow(repo, flow_ref)
        if flow is None:
            return _message(404, "Not Found")
        if not isinstance(body, dict) or not isinstance(body.get("ref"), str):
            return _message(422, 'Invalid request.\n\n"ref" wasn\'t supplied.')
        inputs = body.get("inputs") or {}
        if flow.inputs is not None:
            unexpected = sorted(set(inputs) - flow.inputs)
            if unexpected:
                return _message(422, f"Unexpected inputs provided: {json.dumps(unexpected)}")
        if self.run_details is None and "return_run_details" in body:
            return _message(422, 'Invalid request.\n\n"return_run_details" is not a permitted key.')
        ref = body["ref"].removeprefix("refs/heads/").removeprefix("refs/tags/")
        title = flow.name
        if flow.run_name:
            title = flow.run_name.format_map(_Blank(inputs))
        run = Run(
            id=next(self._ids),
            repo=repo,
            workflow=flow,
            head_branch=ref,
            head_sha=hashlib.sha1(ref.encode()).hexdigest(),
            display_title=title,
            actor=who,
            inputs=dict(inputs),
            created_at=now(),
        )
        run.jobs = [Job(next(self._ids), n, log=_log_of(n)) for n in self.job_names]
        self.runs[run.id] = run
        self._notify(run.id, "requested")
        if self.auto is not None:
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(self.auto / 2, self.start, run.id))
            self._timers.append(loop.call_later(self.auto, self.complete, run.id))
        if body.get("return_run_details") and self.run_details:
            return web.json_response(
                {
                    "workflow_run_id": run.id,
                    "run_url": f"{self.url}/repos/{repo}/actions/runs/{run.id}",
                    "html_url": f"{self.web}/{repo}/actions/runs/{run.id}",
                }
            )
        return web.Response(status=204)

    def _runs(self, repo: str, q: Any, flow: Workflow | None) -> web.Response:
        runs = [r for r in self.runs.values() if r.repo == repo]
        if flow is not None:
            runs = [r for r in runs if r.workflow is flow]
        if (event := q.get("event")) and event != "workflow_dispatch":
            runs = []
        if branch := q.get("branch"):
            runs = [r for r in runs if r.head_branch == branch]
        if actor := q.get("actor"):
            runs = [r for r in runs if r.actor == actor]
        if status := q.get("status"):
            runs = [r for r in runs if status in (r.status, r.conclusion)]
        if created := q.get("created"):
            if not created.startswith(">="):
                return _message(422, "Validation Failed")
            since = _parse(created[2:])
            runs = [r for r in runs if r.created_at >= since]
        runs.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        page = runs[: int(q.get("per_page", "30"))]
        records = [r.record(self.web, self.url) for r in page]
        return _json({"total_count": len(runs), "workflow_runs": records})

    def _job_log(self, repo: str, job_id: str) -> web.Response:
        job = next(
            (
                j
                for r in self.runs.values()
                if r.repo == repo
                for j in r.jobs
                if str(j.id) == job_id
            ),
            None,
        )
        if job is None:
            return _message(404, "Not Found")
        if not self.logs_redirect:
            return web.Response(text=job.log, content_type="text/plain")
        location = f"{self.url}/_blob/logs/{job.id}?sig={uuid.uuid4().hex}"
        return web.Response(status=302, headers={"Location": location})

    def _blob(self, request: web.Request) -> web.Response:
        if "Authorization" in request.headers:
            return web.Response(status=400, text="Only one auth mechanism allowed")
        job_id = request.match_info["tail"].rsplit("/", 1)[-1]
        for run in self.runs.values():
            for job in run.jobs:
                if str(job.id) == job_id and request.query.get("sig"):
                    return web.Response(text=job.log, content_type="text/plain")
        return web.Response(status=404, text="BlobNotFound")

    # --- issues and comments ----------------------------------------------------------

    def _create_issue(self, repo: str, who: str, body: Any) -> web.Response:
        if not isinstance(body, dict) or not body.get("title"):
            return _message(422, "Validation Failed")
        number = next(self._numbers)
        issue = {
            "id": next(self._ids),
            "number": number,
            "title": body["title"],
            "body": body.get("body") or "",
            "labels": [{"name": n} for n in body.get("labels") or []],
            "state": "open",
            "user": {"login": who},
            "created_at": stamp(now()),
            "updated_at": stamp(now()),
            "html_url": f"{self.web}/{repo}/issues/{number}",
        }
        self.issues[repo].append(issue)
        return web.json_response(issue, status=201)

    def _list_issues(self, repo: str, q: Any) -> web.Response:
        issues = list(self.issues[repo])
        if creator := q.get("creator"):
            issues = [i for i in issues if i["user"]["login"] == creator]
        if since := q.get("since"):
            issues = [i for i in issues if _parse(i["updated_at"]) >= _parse(since)]
        issues.sort(key=lambda i: i["number"], reverse=q.get("direction", "desc") == "desc")
        return _json(issues[: int(q.get("per_page", "30"))])

    def _issue(self, repo: str, number: str) -> dict[str, Any] | None:
        return next((i for i in self.issues[repo] if str(i["number"]) == number), None)

    def _create_comment(self, repo: str, number: str, who: str, body: Any) -> web.Response:
        if self._issue(repo, number) is None:
            return _message(404, "Not Found")
        if not isinstance(body, dict) or not body.get("body"):
            return _message(422, "Validation Failed")
        comment_id = next(self._ids)
        comment = {
            "id": comment_id,
            "body": body["body"],
            "user": {"login": who},
            "created_at": stamp(now()),
            "updated_at": stamp(now()),
            "html_url": f"{self.web}/{repo}/issues/{number}#issuecomment-{comment_id}",
        }
        self.comments.setdefault((repo, int(number)), []).append(comment)
        return web.json_response(comment, status=201)

    def _list_comments(self, repo: str, number: str, q: Any) -> web.Response:
        if self._issue(repo, number) is None:
            return _message(404, "Not Found")
        comments = list(self.comments.get((repo, int(number)), []))
        if since := q.get("since"):
            comments = [c for c in comments if _parse(c["updated_at"]) >= _parse(since)]
        return _json(comments[: int(q.get("per_page", "30"))])


class _Blank(dict):
    """``run-name`` expressions: an input the dispatch left out is empty."""

    def __missing__(self, key: str) -> str:
        return ""


def _log_of(job: str, lines: int = 300) -> str:
    return "".join(f"2026-01-01T00:00:{i % 60:02d}Z {job}: step {i}\n" for i in range(1, lines + 1))


def _json(payload: Any) -> web.Response:
    return web.json_response(payload)


def _message(status: int, message: str) -> web.Response:
    return web.json_response(
        {"message": message, "documentation_url": "https://docs.github.com/rest"}, status=status
    )


def signature(secret: str, body: bytes) -> str:
    """``X-Hub-Signature-256`` as GitHub computes it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def delivery(
    payload: dict[str, Any], *, event: str = "workflow_run", secret: str = WEBHOOK_SECRET
) -> tuple[bytes, dict[str, str]]:
    """A webhook delivery as GitHub sends it: the body and its headers."""
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": signature(secret, body),
        "User-Agent": "GitHub-Hookshot/fake",
    }
    return body, headers
