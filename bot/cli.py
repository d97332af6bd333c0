"""The ``opsloop`` command: serve the bot, list threads, read a thread's log.

    opsloop serve                    HTTP: POST /slack/events, GET /healthz
    opsloop socket                   Slack's Socket Mode
    opsloop local                    everything on this machine, Slack in the browser
    opsloop threads [--status S] [--json]
    opsloop trace THREAD [--json]    THREAD: a thread id or CHANNEL/THREAD_TS
    opsloop replay THREAD [--seq N | --all] [--json]   exit 1 MISMATCH, 3 tools not loaded
    opsloop tools [--json] [--from-server URL]   every tool, source, default policy, drift
    opsloop policy check [--config F] [THREAD …] [--since 7d]
    opsloop config check [FILE] [--strict] [--no-env]
    opsloop migrate [--check]        take the database to this release's schema
    opsloop archive --before 90d [--to FILE.jsonl] [--dry-run]
    opsloop trace --from FILE.jsonl THREAD [--json]
    opsloop doctor [--manifest FILE] [--local | --serve] [--strict]
                                     one line per check; exit 1 if any fails

Every command reads the settings once, here: the configuration file (``OPSLOOP_CONFIG``,
else ``./opsloop.yaml`` when present) with the environment laid over it, and passes
them down; nothing else reads the environment. A bad setting or file, a busy port or an
unreachable database is one line on stderr and exit status 2, never a traceback; so is
a schema older or newer than this release's (``serve``, ``socket`` and ``local``
refuse it, unless ``OPSLOOP_AUTO_MIGRATE=true`` migrates an older one at start). The
commands that only read (threads, trace, replay, policy check) never create a database:
run in the wrong directory, they say none was found.

Beside `opsloop local` (:func:`beside_local`: its workspace file next to the database),
the commands that look at what a process loads (replay, tools, policy check, config
check, doctor) load what local mode loads (:func:`load_loaded`), and say so on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from engine.config import Settings, load_settings
from engine.config_file import ConfigFile, load_config_file
from engine.db import DatabaseConfig, parse_database_url
from engine.errors import ConfigError, EngineError, ThreadNotFound
from engine.events import AnyEvent
from engine.logs import KeyValueFormatter as KeyValueFormatter  # re-exported (tests)
from engine.logs import configure_logging
from engine.state import Status
from engine.store import Store, ThreadInfo, open_store
from engine.trace import (
    format_usage,
    thread_record,
    trace_line,
    trace_record,
    usage_totals,
)
from tools import REGISTRY, ToolLoadError, load_tools

if TYPE_CHECKING:  # aiohttp and the engine's loop load only for `serve`: a quick CLI
    import socket

log = logging.getLogger("opsloop.cli")

PROG = "opsloop"
EXIT_USAGE = 2
DEFAULT_HOST = "0.0.0.0"
SHUTDOWN_TIMEOUT_S = 20.0
STATUSES: tuple[str, ...] = get_args(Status)


class CliError(Exception):
    """A one-line complaint about how the command was called or configured."""


def _say_error(message: str) -> None:
    print(" ".join(str(message).split()), file=sys.stderr)


# --- the settings -------------------------------------------------------------------


def _environment() -> dict[str, str]:
    """The process's environment: read here and nowhere else."""
    return dict(os.environ)


def load_configuration(
    env: dict[str, str] | None = None, path: str | None = None
) -> tuple[Settings, ConfigFile | None]:
    """The settings of this process and the configuration file they came with (None:
    no file). ``ConfigError`` (one line) for a bad file or variable."""
    env = _environment() if env is None else env
    config = load_config_file(path, env)
    return load_settings(env, file=config.env_values() if config else None), config


# --- beside `opsloop local` -----------------------------------------------------------

LOCAL_HOST = "127.0.0.1"  # only this machine: the page acts as anyone in the workspace
LOCAL_TOOLS = "tools.builtin,tools.demo"


@dataclass(frozen=True)
class Loaded:
    """What a command that looks at a process's tools and policy loads (``tools``,
    ``replay``, ``policy check``, ``config check``, ``doctor``). ``local``: the workspace
    file of the `opsloop local` run whose configuration this is (None: not beside one)."""

    settings: Settings
    config: ConfigFile | None
    local: Path | None = None
    bundled: Path | None = None  # the config is local mode's own (localslack/opsloop.yaml)


def beside_local(settings: Settings) -> Path | None:
    """The workspace file of an `opsloop local` run on this database, when one is there.

    Beside `opsloop local` means: the file local mode keeps its workspace in exists and
    is tied to this database: ``OPSLOOP_LOCAL_STATE`` names it, or it sits beside the
    SQLite file (``opsloop.db`` -> ``opsloop.local.json``), as local mode places it
    (``localslack.state_file.state_path``; a test keeps the two equal). With PostgreSQL
    and no ``OPSLOOP_LOCAL_STATE``, a ``./opsloop.local.json`` may belong to another
    database, so it is no sign. Decided without importing local mode (slow to import)."""
    explicit = (settings.local_state or "").strip()
    if explicit:
        path = Path(explicit)
    else:
        db = parse_database_url(settings.database_url)
        name = db.url.database
        if db.dialect != "sqlite" or not name or name == ":memory:":
            return None
        path = Path(name).with_name(f"{Path(name).stem}.local.json")
    return path if path.is_file() else None


def local_environment(env: dict[str, str], settings: Settings, workspace: Path) -> dict[str, str]:
    """``env`` as `opsloop local` completes it: its tool modules unless ``OPSLOOP_TOOLS``
    names others, and the ``${OPSLOOP_LOCAL_*}`` values a file may use, for the page this
    machine's ``OPSLOOP_HOST`` and ``PORT`` give (the environment wins over both)."""
    from bot.local_mode import local_values_for

    host, port = _listen_address(settings, LOCAL_HOST)
    env = {**local_values_for(host, port, workspace), **env}
    if not env.get("OPSLOOP_TOOLS", "").strip():
        env["OPSLOOP_TOOLS"] = LOCAL_TOOLS
    return env


def load_loaded(
    env: dict[str, str] | None = None, path: str | None = None, *, profile: str | None = None
) -> Loaded:
    """The settings and file as :func:`load_configuration` reads them, except beside
    `opsloop local` (:func:`beside_local`; ``profile="local"`` forces it, ``"serve"``
    never takes it): then what local mode loads, its tool modules and, when no file is
    named or found, its own ``localslack/opsloop.yaml`` for the page this machine's
    ``OPSLOOP_HOST`` and ``PORT`` give."""
    env = _environment() if env is None else env
    if profile != "serve":
        plain = load_settings(env)
        workspace = beside_local(plain)
        if workspace is None and profile == "local":
            from bot.local_mode import workspace_file

            workspace = workspace_file(plain)
        if workspace is not None:
            env = local_environment(env, plain, workspace)
            settings, config = load_configuration(env, path)
            if config is not None:
                return Loaded(settings, config, workspace)
            from bot.local_mode import bundled_config

            bundled, file = bundled_config(env["OPSLOOP_LOCAL_URL"], workspace)
            return Loaded(settings, bundled, workspace, bundled=file)
    settings, config = load_configuration(env, path)
    return Loaded(settings, config)


def _beside_note(command: str, loaded: Loaded) -> None:
    """One line on stderr: which configuration a command took beside `opsloop local`."""
    if loaded.local is None:
        return
    own = loaded.bundled is not None
    what = "its own localslack/opsloop.yaml" if own else "the configuration file"
    _say_error(
        f"{PROG} {command}: beside opsloop local ({_shown(loaded.local)}): its tool modules "
        f"and {what}"
    )


def _shown(path: Path | str) -> str:
    text = str(path)
    return text if os.path.dirname(text) else os.path.join(".", text)


def secrets_of(settings: Settings, config: ConfigFile | None) -> list[str]:
    """What the log must never show: tokens, keys and the file's header/env values."""
    found = [
        settings.slack.bot_token,
        settings.slack.signing_secret,
        settings.slack.app_token,
        settings.slack.webhook_secret,
        settings.model.api_key,
    ]
    if config is not None:
        for server in config.tools.mcp.values():
            found += server.secrets()  # its headers and what ${VAR} put in, not every env value
        for action in config.tools.http.values():
            found += action.plain_headers().values()
    return [s for s in found if s]


# --- the store ----------------------------------------------------------------------


def _no_database(where: str) -> CliError:
    return CliError(f"{PROG}: no opsloop database at {where} (set DATABASE_URL)")


SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite_file(config: DatabaseConfig) -> None:
    """A SQLite file must exist and be one: opening any other file would write to it."""
    path = config.url.database or ""
    if config.dialect != "sqlite" or path == ":memory:":
        return
    try:
        with open(path, "rb") as file:
            is_sqlite = file.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        is_sqlite = False
    if not is_sqlite:
        raise _no_database(path if os.path.dirname(path) else os.path.join(".", path))


async def _open_store(settings: Settings) -> Store:
    """The store of a command that only reads: an existing opsloop database, never a new
    one (open_store would create a missing SQLite file and its tables)."""
    url = settings.database_url
    config = parse_database_url(url)
    _check_sqlite_file(config)
    store = await open_store(url, create=False, pool_size=2)
    try:
        found = await store.has_schema()
    except BaseException:
        await store.close()
        raise
    if not found:
        await store.close()
        raise _no_database(config.display())
    return store


# --- the schema ---------------------------------------------------------------------


def _prepare_schema(settings: Settings) -> None:
    """Before serving: the database at this release's schema, or one line (exit 2).
    Alembic loads here, not for the quick read-only commands."""
    from engine.migrations import prepare

    before, after = asyncio.run(prepare(settings.database_url, auto_migrate=settings.auto_migrate))
    if before.revision is not None and before.revision != after.revision:
        log.warning("database schema migrated from %s to %s", before.revision, after.revision)


async def _migrate(args: argparse.Namespace) -> int:
    from engine.migrations import inspect_schema, known_revisions, migrate
    from engine.schema import HEAD

    settings, _ = load_configuration()
    config = parse_database_url(settings.database_url)
    where = config.display()
    if args.check:
        state = await inspect_schema(settings.database_url)
        verdict = state.verdict(known_revisions())
        found = state.revision or "none (no opsloop tables)"
        print(f"{where}: schema revision {found}, this release's {HEAD}: {verdict}")
        return 0 if verdict == "current" else 1
    before, after = await migrate(settings.database_url)
    if before.revision == after.revision and before.stamped:
        print(f"{where}: schema already at revision {after.revision}")
    else:
        was = before.revision or "an empty database"
        print(f"{where}: schema migrated from {was} to revision {after.revision}")
    return 0


def _cmd_migrate(args: argparse.Namespace) -> int:
    return asyncio.run(_migrate(args))


# --- threads ------------------------------------------------------------------------


def _table(rows: list[list[str]], right: Sequence[int] = ()) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        out.append("  ".join(cells).rstrip())
    return out


async def _threads(args: argparse.Namespace) -> int:
    settings, _ = load_configuration()
    store = await _open_store(settings)
    try:
        infos = await store.list_threads(status=args.status)
        # One grouped read for the listed threads: how much each holds in the hot tables.
        sizes = await store.select_thread_sizes([i.id for i in infos]) if infos else {}
    finally:
        await store.close()
    if args.json:
        for info in infos:
            events, size = sizes.get(info.id, (0, 0))
            record = {**thread_record(info), "events": events, "bytes": size}
            print(json.dumps(record, ensure_ascii=False))
        return 0
    if not infos:
        print(f"no threads with status {args.status}" if args.status else "no threads yet")
        return 0
    rows = [["ID", "CHANNEL/THREAD_TS", "STATUS", "LAST_SEQ", "EVENTS", "BYTES", "UPDATED"]]
    for info in infos:
        updated = info.updated_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        events, size = sizes.get(info.id, (0, 0))
        where = f"{info.channel}/{info.root_ts}"
        rows.append(
            [info.id, where, info.status, str(info.last_seq), str(events), str(size), updated]
        )
    for line in _table(rows, right=(3, 4, 5)):
        print(line)
    return 0


# --- trace --------------------------------------------------------------------------


async def _trace(args: argparse.Namespace) -> int:
    if args.source is not None:
        info, events = _archived_thread(args.source, args.thread)
        return _print_trace(info, events, as_json=args.json)
    settings, _ = load_configuration()
    store = await _open_store(settings)
    try:
        try:
            info = await store.resolve_thread(args.thread)
        except ThreadNotFound:
            raise ThreadNotFound(f"no thread {args.thread!r}") from None
        events = await store.select_events(info.id)
    finally:
        await store.close()
    return _print_trace(info, events, as_json=args.json)


def _archived_thread(path: str, ref: str) -> tuple[ThreadInfo, list[AnyEvent]]:
    """A thread read back from an archive file (``opsloop trace --from FILE``)."""
    from engine.archive import find_archived, read_archive

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CliError(f"{PROG} trace: cannot read the archive {path}: {why}") from None
    found = find_archived(read_archive(text, path), ref, path)
    if not found.complete:
        # Lines of an archive run that died before its delete: the thread is whole in
        # the database (see engine/archive.py).
        seqs = [e.seq for e in found.events]
        _say_error(
            f"{PROG} trace: {path} holds {len(seqs)} of the {found.info.last_seq} events of "
            f"thread {found.info.id} (an interrupted archive run); see `opsloop trace` for it"
        )
    return found.info, found.events


def _print_trace(info: ThreadInfo, events: Sequence[AnyEvent], *, as_json: bool) -> int:
    if as_json:
        for event in events:
            print(json.dumps(trace_record(event), ensure_ascii=False))
        return 0
    print(
        f"thread {info.id}  {info.channel}/{info.root_ts}  status={info.status}  "
        f"requester={info.requester or '-'}"
    )
    for event in events:
        print(trace_line(event))
    usage = format_usage(usage_totals(events))
    if usage:
        print(usage)
    return 0


# --- archive ------------------------------------------------------------------------


def archive_name(now: datetime) -> str:
    """The default archive file: one per UTC day, in the working directory."""
    return f"opsloop-archive-{now.astimezone(UTC):%Y-%m-%d}.jsonl"


def _byte_at(file: Any, offset: int) -> bytes:
    file.seek(offset)
    return bytes(file.read(1))


class ArchiveFile:
    """An archive file opened for appending; ``write`` returns once the lines are on
    disk (flush, then fsync), so a thread is deleted only after that. Opened on the
    first write: a run that archives nothing leaves no file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: Any = None

    def _open(self) -> Any:
        new = not os.path.exists(self.path)
        file = open(self.path, "a+b")
        end = file.seek(0, os.SEEK_END)
        if end and _byte_at(file, end - 1) != b"\n":
            # A last line without its newline was cut short by a crash (its thread is
            # still in the database): cut it off, or the next line would join it.
            keep = 0
            for start in range(end - 1, -1, -65536):  # back to the last newline
                file.seek(max(0, start - 65535))
                chunk = file.read(start - max(0, start - 65535) + 1)
                if (at := chunk.rfind(b"\n")) >= 0:
                    keep = max(0, start - 65535) + at + 1
                    break
            file.truncate(keep)
            os.fsync(file.fileno())
        if new:  # the file's name, too, must survive a crash
            directory = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        return file

    def write(self, lines: list[str]) -> None:
        if self._file is None:
            self._file = self._open()
        self._file.write("".join(f"{line}\n" for line in lines).encode("utf-8"))
        self._file.flush()
        os.fsync(self._file.fileno())

    @property
    def written(self) -> bool:
        return self._file is not None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


# `archive --before`: how a zero cutoff may be written.
ZERO_DURATIONS = ("0s", "0m", "0h", "0d")


async def _archive(args: argparse.Namespace) -> int:
    from engine.archive import archive_threads
    from engine.config_file import parse_duration

    try:
        # Zero is a cutoff too (every thread that has ended, up to now); durations in
        # opsloop.yaml start at 1, so parse_duration refuses it.
        age = 0.0 if args.before in ZERO_DURATIONS else parse_duration(args.before)
    except ValueError as exc:
        raise CliError(f"{PROG} archive: --before {exc}") from None
    now = datetime.now(UTC)
    before = now - timedelta(seconds=age)
    settings, _ = load_configuration()
    store = await _open_store(settings)
    try:
        if args.dry_run:
            return await _archive_dry_run(store, before, now)
        path = args.to or archive_name(now)
        shown = path if os.path.dirname(path) else os.path.join(".", path)
        out = ArchiveFile(path)
        try:
            run = await archive_threads(store, before, out.write, now=now)
        except OSError as exc:
            raise CliError(f"{PROG} archive: cannot write {shown}: {exc.strerror or exc}") from None
        finally:
            out.close()
    finally:
        await store.close()
    when = before.strftime("%Y-%m-%dT%H:%M:%SZ")
    line = (
        f"archived {run.threads} thread{'s' if run.threads != 1 else ''} "
        f"({run.events} events) to {shown}"
        if out.written
        else f"archived 0 threads: none ended before {when}"
    )
    if run.moved:
        line += f"; {len(run.moved)} changed meanwhile and stay in the database"
    print(line)
    return 0


async def _archive_dry_run(store: Store, before: datetime, now: datetime) -> int:
    infos, after = [], ""
    while page := await store.select_ended_threads(before, after=after, now=now):
        infos += page
        after = page[-1].id
    sizes = await store.select_thread_sizes([i.id for i in infos]) if infos else {}
    for info in infos:
        updated = info.updated_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        events, size = sizes.get(info.id, (0, 0))
        print(
            f"{info.id}  {info.channel}/{info.root_ts}  {info.status}  "
            f"{events} events  {size} bytes  updated {updated}"
        )
    total = sum(sizes.get(i.id, (0, 0))[0] for i in infos)
    n = len(infos)
    print(f"would archive {n} thread{'s' if n != 1 else ''} ({total} events); nothing changed")
    return 0


def _cmd_archive(args: argparse.Namespace) -> int:
    return asyncio.run(_archive(args))


# --- doctor -------------------------------------------------------------------------


def _cmd_doctor(args: argparse.Namespace) -> int:
    from bot.doctor import run_doctor

    profile = "local" if args.local else "serve" if args.serve else None
    loaded = load_loaded(profile=profile)
    settings, config = loaded.settings, loaded.config
    secrets = secrets_of(settings, config)
    return asyncio.run(
        run_doctor(
            settings,
            config,
            manifest=args.manifest,
            secrets=secrets,
            local=loaded.local is not None,
            strict=args.strict,
        )
    )


# --- serve --------------------------------------------------------------------------


def _listen_address(settings: Settings, default_host: str = DEFAULT_HOST) -> tuple[str, int]:
    """``OPSLOOP_HOST`` (else the command's default) and ``PORT``, checked by the settings."""
    return settings.host or default_host, settings.port


def _missing(settings: Settings, names: Sequence[str]) -> list[str]:
    given = {
        "SLACK_BOT_TOKEN": settings.slack.bot_token,
        "SLACK_SIGNING_SECRET": settings.slack.signing_secret,
        "SLACK_APP_TOKEN": settings.slack.app_token,
        "ANTHROPIC_API_KEY": settings.model.api_key,
    }
    return [n for n in names if not given[n].strip()]


REQUIRED_FOR_SERVE = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "ANTHROPIC_API_KEY")
REQUIRED_FOR_SOCKET = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "ANTHROPIC_API_KEY")


def _and(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not on this platform / thread
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))


async def _run_until_signalled(serving: Callable[[], AbstractAsyncContextManager[object]]) -> int:
    """Start ``serving``, run until SIGINT or SIGTERM, stop it: every front door."""
    stop = asyncio.Event()
    _install_signal_handlers(stop)  # before starting: a Ctrl-C while starting stops cleanly
    async with serving():
        await stop.wait()
        log.info("stopping")
    log.info("stopped")
    return 0


def _bind(command: str, host: str, port: int, variable: str = "PORT") -> socket.socket:
    """The listening socket, before anything starts: a busy port is one line."""
    from bot.runtime import bind

    try:
        return bind(host, port)
    except OSError as exc:
        raise CliError(
            f"{PROG} {command}: cannot listen on {host}:{port}: {exc.strerror or exc} "
            f"(set {variable} to another port)"
        ) from None


@contextlib.asynccontextmanager
async def _http(
    settings: Settings,
    config: ConfigFile | None,
    sock: socket.socket,
    metrics_sock: socket.socket | None = None,
) -> AsyncIterator[None]:
    """Serve on ``sock``; ``/metrics`` on ``metrics_sock`` alone when there is one."""
    from aiohttp import web

    from bot.http_limits import limited_runner
    from bot.runtime import metrics_app, start_runtime, web_app

    runtime = await start_runtime(
        settings,
        token=settings.slack.bot_token,
        signing_secret=settings.slack.signing_secret,
        config=config,
    )
    sites = [(web_app(runtime, metrics=metrics_sock is None), sock)]
    if metrics_sock is not None:
        sites.append((metrics_app(runtime), metrics_sock))
    # Slow senders are closed, not held (settings.http; bot.http_limits).
    runners = [
        limited_runner(app, settings.http, handle_signals=False, access_log=None)
        for app, _ in sites
    ]
    try:
        for runner, (_, listening) in zip(runners, sites, strict=True):
            await runner.setup()
            await web.SockSite(runner, listening).start()
        runtime.start()
        host, port = sock.getsockname()[:2]
        log.info("serving on http://%s:%d (/healthz, /slack/events, /hooks/…)", host, port)
        if metrics_sock is not None:
            host, port = metrics_sock.getsockname()[:2]
            log.info("metrics on http://%s:%d/metrics (not on the main port)", host, port)
        yield
    finally:
        # Stop taking requests first, then let running threads reach a boundary.
        for runner in runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        await runtime.close(SHUTDOWN_TIMEOUT_S)


@contextlib.asynccontextmanager
async def _socket_mode(settings: Settings, config: ConfigFile | None) -> AsyncIterator[None]:
    from bot.runtime import socket_mode_handler, start_runtime

    runtime = await start_runtime(
        settings,
        token=settings.slack.bot_token,
        signing_secret=settings.slack.signing_secret,
        config=config,
    )
    handler = socket_mode_handler(runtime, settings.slack.app_token)
    try:
        await handler.connect_async()
        runtime.start()
        log.info("connected to Slack in Socket Mode")
        yield
    finally:
        with contextlib.suppress(Exception):
            await handler.close_async()
        await runtime.close(SHUTDOWN_TIMEOUT_S)


def _cmd_socket(_args: argparse.Namespace) -> int:
    settings, config = load_configuration()  # every setting checked before anything starts
    missing = _missing(settings, REQUIRED_FOR_SOCKET)
    if missing:
        raise CliError(f"{PROG} socket: set {_and(missing)} (see README: Configuration)")
    configure_logging(logging.INFO, secrets_of(settings, config), settings.log_format)
    _prepare_schema(settings)
    return asyncio.run(_run_until_signalled(lambda: _socket_mode(settings, config)))


def _cmd_serve(_args: argparse.Namespace) -> int:
    settings, config = load_configuration()  # every setting checked before anything starts
    missing = _missing(settings, REQUIRED_FOR_SERVE)
    if missing:
        raise CliError(f"{PROG} serve: set {_and(missing)} (see README: Configuration)")
    host, port = _listen_address(settings)
    sock = _bind("serve", host, port)
    metrics_sock = None
    try:
        if settings.metrics_port is not None:
            metrics_sock = _bind("serve", host, settings.metrics_port, "OPSLOOP_METRICS_PORT")
        configure_logging(logging.INFO, secrets_of(settings, config), settings.log_format)
        _prepare_schema(settings)
        return asyncio.run(
            _run_until_signalled(lambda: _http(settings, config, sock, metrics_sock))
        )
    finally:
        sock.close()
        if metrics_sock is not None:
            metrics_sock.close()


# --- local --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _local(
    settings: Settings, config: ConfigFile | None, sock: socket.socket
) -> AsyncIterator[None]:
    from bot.local_mode import choose_model, start_local

    make_model, kind, suggestions = choose_model(settings.model)
    local = await start_local(
        settings,
        sock,
        config=config,
        make_model=make_model,
        model_kind=kind,
        suggestions=suggestions,
    )
    try:
        print(f"{PROG} local: open {local.url}", flush=True)
        yield
    finally:
        await local.close(SHUTDOWN_TIMEOUT_S)


def _cmd_local(_args: argparse.Namespace) -> int:
    """No Slack settings needed: the workspace is local, its token and secret made up."""
    env = _environment()
    plain = load_settings(env)
    # Its tool modules, and the ${OPSLOOP_LOCAL_*} values for a file that uses them (a
    # copy of localslack/opsloop.yaml made one's own), as the CLI beside it sees them.
    from bot.local_mode import workspace_file

    env = local_environment(env, plain, workspace_file(plain))
    settings, config = load_configuration(env)
    host, port = _listen_address(settings, LOCAL_HOST)
    sock = _bind("local", host, port)
    configure_logging(logging.INFO, secrets_of(settings, config), settings.log_format)
    try:
        _prepare_schema(settings)
        return asyncio.run(_run_until_signalled(lambda: _local(settings, config, sock)))
    finally:
        sock.close()


def _cmd_threads(args: argparse.Namespace) -> int:
    return asyncio.run(_threads(args))


def _cmd_trace(args: argparse.Namespace) -> int:
    return asyncio.run(_trace(args))


EXIT_MISMATCH = 1
EXIT_NOT_LOADED = 3  # replay: a decision's tools are not loaded here; nothing to compare


async def _replay(args: argparse.Namespace) -> int:
    from engine.replay import replay, replay_all

    loaded = load_loaded()
    store = await _open_store(loaded.settings)
    try:
        info = await store.resolve_thread(args.thread)
        events = await store.select_events(info.id)
    finally:
        await store.close()
    _beside_note("replay", loaded)
    async with _replay_tools(events, loaded) as tools:
        if args.all:
            results = replay_all(events, tools)
            for result in results:
                print(result.verdict())
            return _replay_status(results)
        result = replay(events, tools, args.seq)
    if args.json:
        print(json.dumps(result.prompt.body(), ensure_ascii=False, sort_keys=True))
    else:
        _print_prompt(result.prompt)
    print(result.verdict(), file=sys.stderr if args.json else sys.stdout)
    return _replay_status([result])


def _replay_status(results: Sequence[Any]) -> int:
    """1 when a request recomputed with all its tools differs; else 3 when some could not
    be recomputed (their tools are not loaded here); else 0."""
    if any(r.mismatch for r in results):
        return EXIT_MISMATCH
    return EXIT_NOT_LOADED if any(r.missing for r in results) else 0


@contextlib.asynccontextmanager
async def _replay_tools(events: Sequence[Any], loaded: Loaded) -> AsyncIterator[list[Any]]:
    """The tools this process loads, as `serve` (or `opsloop local`, beside it) loads
    them: the modules, and the file's sources that may hold a tool the thread's decisions
    saw, opened for their definitions and closed again. A source that cannot open is one
    line on stderr; each decision offered its tools says "tools not loaded here"."""
    from bot.configured import close_sources, load_tools_of, may_provide, open_each
    from engine.replay import tools_seen
    from tools.loader import close_tools

    found = load_tools_of(loaded.settings, loaded.config)
    seen = tools_seen(events)
    wanted = [s for s in found.sources if may_provide(s, seen)]
    try:
        for problem in await open_each(wanted, found.tools):
            _say_error(f"{PROG} replay: {problem}")
        yield list(found.tools)
    finally:
        await close_sources(wanted)
        await close_tools(found.modules)


def _print_prompt(prompt: Any) -> None:
    system = (
        prompt.system
        if isinstance(prompt.system, str)
        else " ".join(b["text"] for b in prompt.system)
    )
    print(f"system: {system}")
    print(f"tools: {', '.join(t['name'] for t in prompt.tools)}")
    for message in prompt.messages:
        for block in message["content"]:
            kind = block["type"]
            if kind == "text":
                body = block["text"]
            elif kind == "tool_use":
                args = json.dumps(block["input"], ensure_ascii=False)
                body = f"{block['name']}({args}) id={block['id']}"
            else:
                error = " error" if block.get("is_error") else ""
                body = f"{block['tool_use_id']}{error}: {block['content']}"
            print(f"{message['role']:>9} {kind:<11} {body}")


def _cmd_replay(args: argparse.Namespace) -> int:
    return asyncio.run(_replay(args))


# --- tools, policy check, config check -------------------------------------------------


def _cmd_tools(args: argparse.Namespace) -> int:
    from bot.configured import unmatched_rules
    from bot.tool_list import list_tools

    if args.from_server:
        records = _served_tools(args.from_server)
    else:
        loaded = load_loaded()
        _beside_note("tools", loaded)
        records = asyncio.run(list_tools(loaded.settings, loaded.config))
        rules = loaded.config.policy if loaded.config is not None else []
        for unmatched in unmatched_rules(rules, [r.name for r in records]):
            _say_error(f"{PROG} tools: warning: {unmatched.line()}")
    if args.json:
        for record in records:
            print(json.dumps(record.as_json(), ensure_ascii=False))
        return 0
    rows = [["NAME", "SOURCE", "POLICY", "RULE", "IDEMPOTENT", "DRIFT"]]
    for r in records:
        rule = "-" if r.rule is None else str(r.rule + 1)
        idem, drift = ("yes" if r.idempotent else "no"), ("DRIFTED" if r.drift else "-")
        rows.append([r.name, r.shown_source, r.policy, rule, idem, drift])
    for line in _table(rows):
        print(line)
    return 0


def _served_tools(url: str) -> list[Any]:
    """``GET {url}/tools`` of a running ``opsloop serve``: the tools it offers now (each
    MCP server that is up asked first), a warning line for each server that is down."""
    import urllib.error
    import urllib.request

    from bot.tool_list import ToolRecord

    where = url.rstrip("/") + "/tools"
    try:
        with urllib.request.urlopen(where, timeout=60) as resp:
            answer = json.loads(resp.read())
        records = [ToolRecord.from_json(r) for r in answer["tools"]]
        servers = list(answer.get("servers", []))
    except urllib.error.HTTPError as exc:
        text = f"{PROG} tools: {where} answered {exc.code} (is it opsloop serve?)"
        raise CliError(text) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise CliError(f"{PROG} tools: cannot read {where}: {reason}") from None
    for server in servers:
        if not server.get("up"):
            _say_error(
                f"{PROG} tools: warning: MCP server {server.get('server')!r} is down "
                f"({server.get('reason')}); its tools are not offered"
            )
    return records


async def _policy_check(args: argparse.Namespace) -> int:
    from bot.configured import policy_set
    from bot.policy_check import NOT_JUDGED, check_threads
    from engine.config_file import parse_duration

    since = None
    if args.since is not None:
        try:
            since = datetime.now(UTC) - timedelta(seconds=parse_duration(args.since))
        except ValueError as exc:
            raise CliError(f"{PROG} policy check: --since {exc}") from None
    loaded = load_loaded(path=args.config)
    settings, config = loaded.settings, loaded.config
    load_tools(settings.tool.modules, settings=settings.tool)
    store = await _open_store(settings)
    try:
        checked, findings = await check_threads(
            store,
            policy_set(settings, config),
            REGISTRY,
            config,
            threads=args.threads,
            since=since,
        )
    finally:
        await store.close()
    _beside_note("policy check", loaded)
    for finding in findings:
        print(finding.line())
    failing = sum(f.fails for f in findings)
    summary = (
        f"{checked} recorded calls checked: {sum(f.changed for f in findings)} would be "
        f"decided differently, {failing} looser or mixed"
    )
    if same := sum(f.comparison == "same" for f in findings):
        summary += f"; {same} by another rule to the same effect"
    unknown = sorted({f.call.intent for f in findings if f.comparison == NOT_JUDGED})
    if unknown:
        judged = sum(f.comparison == NOT_JUDGED for f in findings)
        summary += f"; {judged} not judged (not loaded here: {', '.join(unknown)})"
    print(summary)
    if failing:
        return 1
    return EXIT_NOT_LOADED if unknown else 0


def _cmd_policy_check(args: argparse.Namespace) -> int:
    return asyncio.run(_policy_check(args))


def _cmd_config_check(args: argparse.Namespace) -> int:
    """Load what ``serve`` loads, by the same code, short of connecting to MCP servers:
    the settings and the file, the tool modules it names, its HTTP actions; then the
    rules that match none of those tools (a warning, an error with ``--strict``)."""
    from bot.configured import check_loading

    env = _environment()
    if args.no_env:
        return _config_shape(args, env)
    loaded = load_loaded(env, path=args.file)
    settings, config = loaded.settings, loaded.config
    found = asyncio.run(check_loading(settings, config))
    if config is None:
        print("no configuration file (OPSLOOP_CONFIG, ./opsloop.yaml): the environment alone")
        return 0
    _beside_note("config check", loaded)
    if loaded.bundled is not None:
        file = loaded.bundled
        name = os.path.relpath(file) if _inside_cwd(file) else str(file)
    else:
        name = args.file or env.get("OPSLOOP_CONFIG", "").strip() or "opsloop.yaml"
    if not _rules_match(name, config, found.tools.names(), strict=args.strict):
        return EXIT_USAGE
    tools = config.tools
    print(
        f"{name}: valid ({len(tools.modules)} modules, {len(tools.mcp)} MCP servers, "
        f"{len(tools.http)} HTTP actions, {len(config.policy)} rules; "
        f"policy hash {config.policy_hash[:12]})"
    )
    return 0


def _inside_cwd(path: Path) -> bool:
    return path.resolve().is_relative_to(Path.cwd().resolve())


def _rules_match(name: str, config: ConfigFile, loaded: Sequence[str], *, strict: bool) -> bool:
    """Say which rules match no tool the file's process loads (its modules, its HTTP
    actions, the allowlists of its MCP servers; a server without one is not asked, so a
    rule that may match its tools is not counted): a warning each on stderr, or, with
    ``strict``, an error each and False."""
    from bot.configured import known_without_connecting, unmatched_rules

    allowlisted, unknown = known_without_connecting(config)
    problems = unmatched_rules(config.policy, [*loaded, *allowlisted], unknown)
    for problem in problems:
        _say_error(f"{PROG}: {'' if strict else 'warning: '}{problem.line(name)}")
    return not (strict and problems)


def _config_shape(args: argparse.Namespace, env: dict[str, str]) -> int:
    """``config check --no-env``: the file alone (the environment only says where it is):
    every ``${VAR}`` a placeholder, the variables it needs named."""
    from bot.configured import check_loading
    from engine.config_file import read_shape

    read = read_shape(args.file, env)
    if read is None:
        print("no configuration file (OPSLOOP_CONFIG, ./opsloop.yaml): nothing to check")
        return 0
    name, shape = read
    needs = f"; it needs {', '.join(shape.needs)} set" if shape.needs else ""
    if shape.config is None:
        print(
            f"{name}: valid in shape, but only the variables' values can tell for "
            f"{', '.join(shape.unchecked)}{needs}"
        )
        return 0
    config = shape.config
    settings = load_settings({}, file=config.env_values())  # the file's settings alone
    found = asyncio.run(check_loading(settings, config))
    if not _rules_match(name, config, found.tools.names(), strict=args.strict):
        return EXIT_USAGE
    tools = config.tools
    print(
        f"{name}: valid in shape ({len(tools.modules)} modules, {len(tools.mcp)} MCP "
        f"servers, {len(tools.http)} HTTP actions, {len(config.policy)} rules){needs}"
    )
    return 0


# --- main ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="opsloop: a durable chat-ops agent for Slack."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="serve Slack events over HTTP (and /healthz)")
    serve.set_defaults(func=_cmd_serve)
    sub.add_parser("socket", help="connect to Slack in Socket Mode").set_defaults(func=_cmd_socket)
    sub.add_parser(
        "local", help="run everything on this machine, with Slack in the browser (no account)"
    ).set_defaults(func=_cmd_local)

    threads = sub.add_parser("threads", help="list threads, most recently updated first")
    threads.add_argument("--status", choices=STATUSES, help="only threads in this status")
    threads.add_argument("--json", action="store_true", help="one JSON object per line")
    threads.set_defaults(func=_cmd_threads)

    trace = sub.add_parser("trace", help="show a thread's event log")
    trace.add_argument("thread", metavar="THREAD", help="a thread id or CHANNEL/THREAD_TS")
    trace.add_argument("--json", action="store_true", help="one JSON object per event")
    trace.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="read the thread from an archive file (opsloop archive) instead of the database",
    )
    trace.set_defaults(func=_cmd_trace)

    replay = sub.add_parser(
        "replay", help="print the request a model decision was made from, checked by hash"
    )
    replay.add_argument("thread", metavar="THREAD", help="a thread id or CHANNEL/THREAD_TS")
    replay.add_argument("--seq", type=int, help="the decision's seq (default: the latest)")
    replay.add_argument("--json", action="store_true", help="print the request body as JSON")
    replay.add_argument("--all", action="store_true", help="check every decision's hash")
    replay.set_defaults(func=_cmd_replay)

    tools = sub.add_parser("tools", help="list every tool: source, default policy, drift")
    tools.add_argument("--json", action="store_true", help="one JSON object per line")
    tools.add_argument(
        "--from-server",
        metavar="URL",
        help="what a running `opsloop serve` offers (its GET /tools; drift: redefined "
        "while it ran), e.g. http://127.0.0.1:3000",
    )
    tools.set_defaults(func=_cmd_tools)

    policy = sub.add_parser("policy", help="check a policy file against recorded calls")
    policy_sub = policy.add_subparsers(dest="policy_command", metavar="COMMAND")
    check = policy_sub.add_parser(
        "check", help="replay recorded tool calls against the file; exit 1 if any is looser"
    )
    check.add_argument("--config", metavar="FILE", help="the file (default: as serve reads it)")
    check.add_argument("threads", metavar="THREAD", nargs="*", help="default: every thread")
    check.add_argument("--since", metavar="DURATION", help="only calls since, e.g. 7d or 12h")
    check.set_defaults(func=_cmd_policy_check)

    config = sub.add_parser("config", help="check the configuration file")
    config_sub = config.add_subparsers(dest="config_command", metavar="COMMAND")
    config_check = config_sub.add_parser(
        "check", help="exit 0 when valid, 2 with one line naming the key when not"
    )
    config_check.add_argument("file", metavar="FILE", nargs="?", help="default: opsloop.yaml")
    config_check.add_argument(
        "--strict", action="store_true", help="a rule that matches no tool is an error (exit 2)"
    )
    config_check.add_argument(
        "--no-env",
        action="store_true",
        help="check the file's shape without its ${VARIABLES} set; name the ones it needs",
    )
    config_check.set_defaults(func=_cmd_config_check)

    migrate = sub.add_parser("migrate", help="take the database to this release's schema")
    migrate.add_argument(
        "--check", action="store_true", help="only say where it is; exit 1 unless current"
    )
    migrate.set_defaults(func=_cmd_migrate)

    archive = sub.add_parser(
        "archive", help="move threads that ended before a cutoff into a JSON Lines file"
    )
    archive.add_argument(
        "--before",
        metavar="DURATION",
        required=True,
        help="ended this long ago, e.g. 90d; 0s: every thread that has ended",
    )
    archive.add_argument(
        "--to", metavar="FILE", help="append to this file (default ./opsloop-archive-DATE.jsonl)"
    )
    archive.add_argument(
        "--dry-run", action="store_true", help="list what would be archived; change nothing"
    )
    archive.set_defaults(func=_cmd_archive)

    doctor = sub.add_parser("doctor", help="check the database, Slack, the model and MCP servers")
    doctor.add_argument(
        "--manifest", metavar="FILE", help="the Slack app manifest (default ./manifest.yml)"
    )
    which = doctor.add_mutually_exclusive_group()
    which.add_argument(
        "--local",
        action="store_true",
        help="check what opsloop local needs (the default beside its workspace file)",
    )
    which.add_argument(
        "--serve", action="store_true", help="check what opsloop serve needs, even beside it"
    )
    doctor.add_argument(
        "--strict", action="store_true", help="a warning (a rule matching no tool) fails too"
    )
    doctor.set_defaults(func=_cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command not in ("serve", "socket", "local"):
        # `tools` opens MCP servers: a server that fails is its one line, not a log too.
        configure_logging(logging.ERROR if args.command == "tools" else logging.WARNING)
    try:
        return args.func(args)
    except CliError as exc:
        _say_error(str(exc))
        return EXIT_USAGE
    except (ConfigError, ToolLoadError, EngineError) as exc:
        # ConfigError, StoreUnavailable, ThreadNotFound, an event that no longer parses…
        _say_error(f"{PROG}: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `opsloop trace X | head`: the reader left; say nothing more.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
