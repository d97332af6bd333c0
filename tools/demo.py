"""Demo tools with real local effects, one per policy path of the engine.

Load them with ``OPSLOOP_TOOLS=tools.builtin,tools.demo``. ``deploy`` needs approval and
writes a ``deployments`` row; ``run_job`` starts a job and makes the thread wait for it;
``check_health`` fails on its first attempt so the engine retries it (or, asked to
simulate a crash, kills this very process there: a run cut off mid-way, which the
restarted process resumes, since a health check may simply run again). Their state lives
in the database at OPSLOOP_DEMO_URL, else DATABASE_URL, else ``sqlite:///opsloop.db``,
so a restarted process finds the deployments and the running jobs where it left them.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from tools.builtin._engines import EngineCache
from tools.context import ToolContext
from tools.errors import RetryableToolError, ToolError
from tools.registry import tool
from tools.wait import WaitFor

if TYPE_CHECKING:  # imported lazily: sqlalchemy.ext.asyncio needs greenlet
    from sqlalchemy.ext.asyncio import AsyncConnection

DEFAULT_URL = "sqlite:///opsloop.db"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

metadata = sa.MetaData()
deployments = sa.Table(
    "deployments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("idempotency_key", sa.String(255), nullable=False, unique=True),
    sa.Column("thread_id", sa.String(255), nullable=False),
    sa.Column("service", sa.String(64), nullable=False),
    sa.Column("version", sa.String(64), nullable=False),
    sa.Column("environment", sa.String(16), nullable=False),
    sa.Column("requested_by", sa.String(255), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("idempotency_key", sa.String(255), nullable=False, unique=True),
    sa.Column("thread_id", sa.String(255), nullable=False),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("seconds", sa.Integer, nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
)


_url = DEFAULT_URL


def configure(settings: Any) -> None:
    """Take the demo database from the tool settings (``OPSLOOP_DEMO_URL``, which the
    settings default to ``DATABASE_URL``)."""
    global _url
    _url = settings.demo_url or DEFAULT_URL


def demo_url() -> str:
    """The configured demo database, else a local SQLite file."""
    return _url


def _now() -> datetime:
    """The clock of the demo jobs (a seam: tests replace it with a fake clock)."""
    return datetime.now(UTC)


# --- engines: one per URL and event loop (as tools.builtin.tickets keeps its own) -------


_ENGINES = EngineCache(metadata, "the demo tools")
_engine_for = _ENGINES.get


async def dispose_demo_engines() -> None:
    """Close every cached engine (for tests and shutdown)."""
    await _ENGINES.dispose()


close = dispose_demo_engines  # the loader's shutdown hook


def _unavailable(exc: BaseException) -> RetryableToolError:
    return RetryableToolError(
        f"demo database unavailable: {type(exc).__name__}: {exc}".splitlines()[0]
    )


_Values = Callable[["AsyncConnection"], Awaitable[dict[str, Any]]]


async def _insert_once(table: sa.Table, key: str, values: _Values) -> sa.Row:
    """The row for ``key``: inserted now, or the one an earlier attempt inserted.

    ``values`` is called in the inserting transaction, so a value that depends on other
    rows (the next version) is computed where it is written.
    """
    select = sa.select(table).where(table.c.idempotency_key == key)
    try:
        engine = await _engine_for(demo_url())
        async with engine.connect() as conn:
            row = (await conn.execute(select)).first()
        if row is not None:
            return row  # a retry after a crash: the effect already happened
        try:
            async with engine.begin() as conn:
                row_values = await values(conn)
                await conn.execute(sa.insert(table).values(idempotency_key=key, **row_values))
        except IntegrityError:
            pass  # lost a race with a concurrent attempt holding the same key
        async with engine.connect() as conn:
            row = (await conn.execute(select)).first()
    except (OperationalError, InterfaceError, OSError) as exc:
        raise _unavailable(exc) from exc
    if row is None:
        raise ToolError(f"no {table.name} row for {key!r} after inserting it")
    return row


# --- deploy -----------------------------------------------------------------------------


class DeployArgs(BaseModel):
    """Arguments for deploy."""

    model_config = ConfigDict(str_strip_whitespace=True)

    service: str = Field(
        min_length=1, max_length=64, pattern=NAME_PATTERN, description="The service, e.g. api."
    )
    version: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="The version to deploy, e.g. 1.4.2; omit it to deploy the next version.",
    )
    environment: Literal["staging", "production"] = "staging"


_DOTTED = re.compile(r"^\d+(?:\.\d+)*$")


def next_version(previous: str | None) -> str:
    """1.4.2 -> 1.4.3; the first deployment of a service (or an odd version) -> 1.0.0."""
    if previous is None or not _DOTTED.match(previous):
        return "1.0.0"
    parts = previous.split(".")
    return ".".join([*parts[:-1], str(int(parts[-1]) + 1)])


@tool(policy="approve_before_run")
async def deploy(args: DeployArgs, ctx: ToolContext) -> dict:
    """Deploy a service to staging or production (a reviewer must approve it first).

    Give the service name, the environment (staging by default) and optionally a
    version; without one, the version after the service's last deployment is used.
    Returns the deployment number, service, version and environment.
    """

    async def values(conn: AsyncConnection) -> dict[str, Any]:
        version = args.version
        if version is None:
            last = await conn.execute(
                sa.select(deployments.c.version)
                .where(deployments.c.service == args.service)
                .order_by(deployments.c.id.desc())
                .limit(1)
            )
            version = next_version(last.scalar())
        return {
            "thread_id": ctx.thread_id,
            "service": args.service,
            "version": version,
            "environment": args.environment,
            "requested_by": ctx.requester,
            "created_at": _now(),
        }

    row = await _insert_once(deployments, ctx.idempotency_key, values)
    return {
        "deployment": row.id,
        "service": row.service,
        "version": row.version,
        "environment": row.environment,
    }


# --- run_job ----------------------------------------------------------------------------


class RunJobArgs(BaseModel):
    """Arguments for run_job."""

    model_config = ConfigDict(str_strip_whitespace=True)

    name: str = Field(
        min_length=1, max_length=64, pattern=NAME_PATTERN, description="The job, e.g. backfill."
    )
    seconds: int = Field(ge=1, le=600, description="How long the job runs, in seconds.")


def _aware(when: datetime) -> datetime:
    # SQLite hands back naive datetimes; we only ever store UTC.
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@tool(policy="wait_for_external_event")
async def run_job(args: RunJobArgs, ctx: ToolContext) -> WaitFor:
    """Start a batch job that runs for the given number of seconds, and wait for it.

    The thread sleeps until the job is done (or gives up after three times its
    duration plus 30 s). Returns the job name, its status (succeeded) and how long
    it ran.
    """

    async def values(conn: AsyncConnection) -> dict[str, Any]:
        return {
            "thread_id": ctx.thread_id,
            "name": args.name,
            "seconds": args.seconds,
            "started_at": _now(),
        }

    row = await _insert_once(jobs, ctx.idempotency_key, values)
    return WaitFor(
        # Read after "Waiting for" on the thread's status and wait lines.
        description=f"the {row.name} job to run for {row.seconds} s",
        data={"job_id": row.id},
        timeout_s=row.seconds * 3 + 30,
        poll_every_s=min(2.0, float(row.seconds)),
    )


@run_job.poller
async def job_done(data: dict, ctx: ToolContext) -> dict | None:
    """The job's result once its time is up, else None; read from the table, so a
    restarted process polls a job started by another one."""
    engine = await _engine_for(demo_url())
    async with engine.connect() as conn:
        result = await conn.execute(sa.select(jobs).where(jobs.c.id == data["job_id"]))
        row = result.first()
    if row is None:
        return {"job_id": data["job_id"], "status": "lost", "error": "no such job in the table"}
    if _now() < _aware(row.started_at) + timedelta(seconds=row.seconds):
        return None
    return {"job": row.name, "status": "succeeded", "ran_for_s": row.seconds}


# --- check_health -----------------------------------------------------------------------


class CheckHealthArgs(BaseModel):
    """Arguments for check_health."""

    model_config = ConfigDict(str_strip_whitespace=True)

    service: str = Field(
        min_length=1, max_length=64, pattern=NAME_PATTERN, description="The service, e.g. api."
    )
    simulate_crash: bool = Field(
        default=False,
        description="Demo only: kill opsloop itself during the first attempt. Leave it out.",
    )


@tool(policy="run_now")
async def check_health(args: CheckHealthArgs, ctx: ToolContext) -> dict:
    """Check a service's health endpoint.

    The endpoint is slow to wake: the first attempt times out and is retried by the
    engine. Returns the service, its status (healthy) and the attempt that answered.
    """
    if ctx.attempt == 1 and args.simulate_crash:
        # A crash, not an exit: no cleanup, no goodbye. The attempt is in the log as
        # started, so the restarted process runs attempt 2, which answers.
        _kill_this_process()
    if ctx.attempt == 1:
        raise RetryableToolError("health endpoint timed out")
    return {
        "service": args.service,
        "status": "healthy",
        "attempt": ctx.attempt,
        "checked_at": _now().isoformat(timespec="seconds"),
    }


def _kill_this_process() -> None:
    """SIGKILL this process (a seam: tests replace it)."""
    os.kill(os.getpid(), signal.SIGKILL)
