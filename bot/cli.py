"""The ``opsloop`` command: serve the bot, list threads, read a thread's log.

    opsloop serve                    HTTP: POST /slack/events, GET /healthz
    opsloop socket                   Slack's Socket Mode
    opsloop local                    everything on this machine, Slack in the browser
    opsloop threads [--status S] [--json]
    opsloop trace THREAD [--json]    THREAD: a thread id or CHANNEL/THREAD_TS
    opsloop replay THREAD [--seq N | --all] [--json]

A bad setting, a busy port or an unreachable database is one line on stderr and exit
status 2, never a traceback. The commands that only read (threads, trace, replay) never
create a database: run in the wrong directory, they say none was found.
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
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, get_args

import sqlalchemy as sa

from engine.config import Settings, load_settings
from engine.db import DatabaseConfig, database_url_from_env, parse_database_url
from engine.errors import ConfigError, EngineError, ThreadNotFound
from engine.state import Status
from engine.store import Store
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
DEFAULT_PORT = 3000
SHUTDOWN_TIMEOUT_S = 20.0
SECRET_VARS = (
    "SLACK_BOT_TOKEN",
    "SLACK_SIGNING_SECRET",
    "SLACK_APP_TOKEN",
    "ANTHROPIC_API_KEY",
)
STATUSES: tuple[str, ...] = get_args(Status)


class CliError(Exception):
    """A one-line complaint about how the command was called or configured."""


def _say_error(message: str) -> None:
    print(" ".join(str(message).split()), file=sys.stderr)


# --- logging ------------------------------------------------------------------------


def _logfmt_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\\\n\r\t'):
        return text
    return json.dumps(text, ensure_ascii=False)


class KeyValueFormatter(logging.Formatter):
    """``time=… level=… logger=… msg=…`` on one line; secrets from the env are masked."""

    def __init__(self, secrets: Sequence[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if len(s) >= 4]

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC)
        parts = {
            "time": when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            parts["exc"] = self.formatException(record.exc_info)
        line = " ".join(f"{k}={_logfmt_value(v)}" for k, v in parts.items())
        for secret in self.secrets:
            line = line.replace(secret, "***")
        return line


def configure_logging(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    secrets = [os.environ.get(name, "") for name in SECRET_VARS]
    handler.setFormatter(KeyValueFormatter(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # APScheduler logs every run of the one-second sweep at INFO: keep its warnings only.
    logging.getLogger("apscheduler").setLevel(max(level, logging.WARNING))


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


async def _open_store() -> Store:
    """The store of a command that only reads: an existing opsloop database, never a new
    one (Store.open would create a missing SQLite file and its tables)."""
    url = database_url_from_env()
    config = parse_database_url(url)
    _check_sqlite_file(config)
    store = await Store.open(url, create=False, pool_size=2)
    try:
        async with store.engine.connect() as conn:
            found = await conn.run_sync(lambda c: sa.inspect(c).has_table("threads"))
    except BaseException:
        await store.close()
        raise
    if not found:
        await store.close()
        raise _no_database(config.display())
    return store


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
    store = await _open_store()
    try:
        infos = await store.list_threads(status=args.status)
    finally:
        await store.close()
    if args.json:
        for info in infos:
            print(json.dumps(thread_record(info), ensure_ascii=False))
        return 0
    if not infos:
        print(f"no threads with status {args.status}" if args.status else "no threads yet")
        return 0
    rows = [["ID", "CHANNEL/THREAD_TS", "STATUS", "LAST_SEQ", "UPDATED"]]
    for info in infos:
        updated = info.updated_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        rows.append(
            [info.id, f"{info.channel}/{info.root_ts}", info.status, str(info.last_seq), updated]
        )
    for line in _table(rows, right=(3,)):
        print(line)
    return 0


# --- trace --------------------------------------------------------------------------


async def _trace(args: argparse.Namespace) -> int:
    store = await _open_store()
    try:
        try:
            info = await store.resolve_thread(args.thread)
        except ThreadNotFound:
            raise ThreadNotFound(f"no thread {args.thread!r}") from None
        events = await store.select_events(info.id)
    finally:
        await store.close()
    if args.json:
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


# --- serve --------------------------------------------------------------------------


def _listen_address(command: str = "serve", default_host: str = DEFAULT_HOST) -> tuple[str, int]:
    host = os.environ.get("OPSLOOP_HOST") or default_host
    raw = (os.environ.get("PORT") or str(DEFAULT_PORT)).strip()
    try:
        port = int(raw)
    except ValueError:
        raise CliError(f"{PROG} {command}: PORT must be a number, not {raw!r}") from None
    if not 0 <= port <= 65535:
        raise CliError(f"{PROG} {command}: PORT must be between 0 and 65535, not {port}")
    return host, port


REQUIRED_FOR_SERVE = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "ANTHROPIC_API_KEY")


def _missing_settings(names: Sequence[str]) -> list[str]:
    return [n for n in names if not os.environ.get(n, "").strip()]


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


def _bind(command: str, host: str, port: int) -> socket.socket:
    """The listening socket, before anything starts: a busy port is one line."""
    from bot.runtime import bind

    try:
        return bind(host, port)
    except OSError as exc:
        raise CliError(
            f"{PROG} {command}: cannot listen on {host}:{port}: {exc.strerror or exc} "
            "(set PORT to another port)"
        ) from None


@contextlib.asynccontextmanager
async def _http(settings: Settings, sock: socket.socket) -> AsyncIterator[None]:
    from aiohttp import web

    from bot.runtime import start_runtime, web_app

    runtime = await start_runtime(
        settings,
        token=os.environ["SLACK_BOT_TOKEN"],
        signing_secret=os.environ["SLACK_SIGNING_SECRET"],
    )
    web_runner = web.AppRunner(web_app(runtime), handle_signals=False, access_log=None)
    try:
        await web_runner.setup()
        await web.SockSite(web_runner, sock).start()
        runtime.start()
        host, port = sock.getsockname()[:2]
        log.info("serving on http://%s:%d (/healthz, /slack/events, /hooks/…)", host, port)
        yield
    finally:
        # Stop taking requests first, then let running threads reach a boundary.
        with contextlib.suppress(Exception):
            await web_runner.cleanup()
        await runtime.close(SHUTDOWN_TIMEOUT_S)


@contextlib.asynccontextmanager
async def _socket_mode(settings: Settings) -> AsyncIterator[None]:
    from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

    from bot.runtime import start_runtime

    runtime = await start_runtime(
        settings,
        token=os.environ["SLACK_BOT_TOKEN"],
        signing_secret=os.environ.get("SLACK_SIGNING_SECRET", ""),
    )
    handler = AsyncSocketModeHandler(
        runtime.bolt, os.environ["SLACK_APP_TOKEN"], web_client=runtime.client
    )
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
    missing = _missing_settings(("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "ANTHROPIC_API_KEY"))
    if missing:
        raise CliError(f"{PROG} socket: set {_and(missing)} (see README: Configuration)")
    settings = load_settings()
    configure_logging(logging.INFO)
    return asyncio.run(_run_until_signalled(lambda: _socket_mode(settings)))


def _cmd_serve(_args: argparse.Namespace) -> int:
    missing = _missing_settings(REQUIRED_FOR_SERVE)
    if missing:
        raise CliError(f"{PROG} serve: set {_and(missing)} (see README: Configuration)")
    settings = load_settings()  # every setting checked before anything starts
    host, port = _listen_address()
    sock = _bind("serve", host, port)
    configure_logging(logging.INFO)
    try:
        return asyncio.run(_run_until_signalled(lambda: _http(settings, sock)))
    finally:
        sock.close()


# --- local --------------------------------------------------------------------------

LOCAL_HOST = "127.0.0.1"  # only this machine: the page acts as anyone in the workspace
LOCAL_TOOLS = "tools.builtin,tools.demo"


@contextlib.asynccontextmanager
async def _local(settings: Settings, sock: socket.socket) -> AsyncIterator[None]:
    from bot.local.server import choose_model, start_local

    make_model, kind, suggestions = choose_model()
    local = await start_local(
        settings, sock, make_model=make_model, model_kind=kind, suggestions=suggestions
    )
    try:
        print(f"{PROG} local: open {local.url}", flush=True)
        yield
    finally:
        await local.close(SHUTDOWN_TIMEOUT_S)


def _cmd_local(_args: argparse.Namespace) -> int:
    """No Slack settings needed: the workspace is local, its token and secret made up."""
    env = dict(os.environ)
    if not env.get("OPSLOOP_TOOLS", "").strip():
        env["OPSLOOP_TOOLS"] = LOCAL_TOOLS
    settings = load_settings(env)
    host, port = _listen_address("local", LOCAL_HOST)
    sock = _bind("local", host, port)
    configure_logging(logging.INFO)
    try:
        return asyncio.run(_run_until_signalled(lambda: _local(settings, sock)))
    finally:
        sock.close()


def _cmd_threads(args: argparse.Namespace) -> int:
    return asyncio.run(_threads(args))


def _cmd_trace(args: argparse.Namespace) -> int:
    return asyncio.run(_trace(args))


async def _replay(args: argparse.Namespace) -> int:
    from engine.replay import replay, replay_all

    store = await _open_store()
    try:
        info = await store.resolve_thread(args.thread)
        events = await store.select_events(info.id)
    finally:
        await store.close()
    tools = _replay_tools(events)
    if args.all:
        results = replay_all(events, tools)
        for result in results:
            print(result.verdict())
        return 0 if all(r.matches for r in results) else 1
    result = replay(events, tools, args.seq)
    if args.json:
        print(json.dumps(result.prompt.body(), ensure_ascii=False, sort_keys=True))
    else:
        _print_prompt(result.prompt)
    print(result.verdict(), file=sys.stderr if args.json else sys.stdout)
    return 0 if result.matches else 1


def _replay_tools(events: Sequence[Any]) -> list[Any]:
    """The tools this process is configured with (OPSLOOP_TOOLS), and those `opsloop
    local` adds (tools.demo) when the thread's decisions saw tools these lack: a thread
    made by `opsloop local` replays with the tools it was made with. Each decision is
    replayed with the tools it was offered (engine.replay.tools_for)."""
    from engine.replay import tools_seen

    configured = os.environ.get("OPSLOOP_TOOLS")
    load_tools(configured)
    if tools_seen(events) - set(REGISTRY.names()):
        load_tools(",".join(filter(None, [configured, LOCAL_TOOLS])))
    return list(REGISTRY)


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
    trace.set_defaults(func=_cmd_trace)

    replay = sub.add_parser(
        "replay", help="print the request a model decision was made from, checked by hash"
    )
    replay.add_argument("thread", metavar="THREAD", help="a thread id or CHANNEL/THREAD_TS")
    replay.add_argument("--seq", type=int, help="the decision's seq (default: the latest)")
    replay.add_argument("--json", action="store_true", help="print the request body as JSON")
    replay.add_argument("--all", action="store_true", help="check every decision's hash")
    replay.set_defaults(func=_cmd_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command not in ("serve", "socket", "local"):
        configure_logging(logging.WARNING)
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
