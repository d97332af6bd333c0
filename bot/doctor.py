"""``opsloop doctor``: is this process's setup one that ``opsloop serve`` can run on?

One line per check, ``ok``, ``warn`` or ``FAIL``, its name and a detail; exit status 1 when any
fails. The checks, each given ``CHECK_TIMEOUT_S`` (they run together):

* ``database``: reachable, and at this release's schema revision (engine.migrations);
* ``clock``: the database's ``now()`` against this machine's (PostgreSQL; a SQLite file
  shares this machine's clock): leases and timers compare the two;
* ``slack token``: ``auth.test`` through ``SLACK_API_URL``; ``slack scopes``: the
  ``x-oauth-scopes`` it answers with, against the bot scopes of the app manifest;
* ``signing secret``: set (its value is never shown);
* ``model``: the key accepted and the model known, by one cheap call (``models.retrieve``
  through ``ANTHROPIC_BASE_URL``: no tokens spent);
* ``mcp <server>``, one per server of the configuration file: it starts, lists its
  tools (its ``tools`` allowlist present), and lists them again to the same definition
  hashes (``opsloop tools``' drift check: what a call is pinned to at approval); a tool
  left out because the model API would refuse it (its schema, its name) is a ``warn``. A
  server gets the connect time ``opsloop serve`` gives it, not ``CHECK_TIMEOUT_S``: a
  stdio server that starts an interpreter (npx, uvx, python) on a busy host can take
  seconds, and a doctor stricter than serve would fail a setup that runs;
* ``policy rules``: each rule of the file matches a tool the process loads (its
  modules, imported here, its HTTP actions and what the MCP checks found); one that
  matches none decides nothing and is a ``warn`` line (``--strict``: FAIL), checked last.

No detail shows a secret: every line is scrubbed of the process's tokens and keys.

The local profile (``opsloop doctor --local``, or run beside `opsloop local`: see
``bot.cli.beside_local``) checks what local mode needs: it makes its own Slack
workspace, so the Slack checks say "not needed by opsloop local", and the model is
checked only when ``ANTHROPIC_API_KEY`` is set (without one it runs offline).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

# Imported here, not in the checks: an import takes seconds on a loaded machine, and
# inside a check it ran on the clock of every check (each "no answer within 5 s").
import anthropic
import asyncpg
import yaml
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.configured import check_loading, unmatched_rules
from bot.mcp_oauth import authorization_link, stored_oauth
from engine.config import DEFAULT_MODEL, Settings
from engine.config_file import ConfigFile
from engine.db import DatabaseConfig, parse_database_url
from engine.migrations import inspect_schema, known_revisions
from engine.schema import HEAD
from tools.errors import ToolError
from tools.mcp import McpSource
from tools.mcp.config import CONNECT_TIMEOUT_S, McpServerConfig

CHECK_TIMEOUT_S = 5.0
MAX_SKEW_S = 5.0
MANIFEST = "manifest.yml"
# The bot scopes of the repository's manifest.yml, for a process run where there is no
# manifest file (an installed package, the image): tests keep the two equal.
BOT_SCOPES = (
    "app_mentions:read",
    "chat:write",
    "channels:history",
    "groups:history",
    "im:history",
    "usergroups:read",
    "users:read",
    "commands",
)


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # ok, but worth a look (``--strict`` makes it a FAIL)

    def line(self, width: int) -> str:
        status = "FAIL" if not self.ok else "warn" if self.warn else "ok"
        return f"{status:<4}  {self.name:<{width}}  {self.detail}"


class CheckFailed(Exception):
    """A check's one-line reason to fail."""


class CheckWarning(Exception):
    """A check's one-line warning: the setup runs, but something in it does nothing."""


Check = tuple[str, Callable[[], Awaitable[str]], float]
"""A check's name, the check and how long it may take."""


def one_line(text: object) -> str:
    return " ".join(str(text).split())


# --- the database -------------------------------------------------------------------


def _sqlite_file_exists(config: DatabaseConfig) -> None:
    """Inspecting a missing SQLite file would create it: a doctor changes nothing."""
    path = config.url.database or ""
    if config.dialect == "sqlite" and path != ":memory:" and not os.path.exists(path):
        raise CheckFailed(f"no database file at {path} (set DATABASE_URL)")


async def check_database(settings: Settings) -> str:
    config = parse_database_url(settings.database_url)
    where = config.display()
    _sqlite_file_exists(config)
    state = await inspect_schema(settings.database_url)
    verdict = state.verdict(known_revisions())
    if verdict == "current":
        return f"{where} reachable; schema revision {state.revision} (this release's head)"
    if verdict == "empty":
        raise CheckFailed(f"{where} reachable but has no opsloop tables: run `opsloop migrate`")
    refusal = state.refusal(known_revisions(), where)
    raise CheckFailed(str(refusal) if refusal else f"schema {state.revision}, head {HEAD}")


def skew_verdict(skew_s: float, limit_s: float = MAX_SKEW_S) -> tuple[bool, str]:
    """Whether a measured skew (database minus local, seconds) is acceptable."""
    ahead = "ahead of" if skew_s > 0 else "behind"
    detail = f"the database clock is {abs(skew_s):.3f} s {ahead} this machine's"
    if abs(skew_s) > limit_s:
        return False, f"{detail} (over {limit_s:g} s: leases and timers will misjudge time)"
    return True, detail


async def check_clock(settings: Settings) -> str:
    config = parse_database_url(settings.database_url)
    if config.dialect != "postgresql":
        return f"{config.dialect}: the database runs on this machine's clock"
    dsn = config.url.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn, timeout=CHECK_TIMEOUT_S)
    try:
        sent = time.time()
        db_now: datetime = await conn.fetchval("SELECT now()")
        back = time.time()
    finally:
        await conn.close()
    # The server read its clock somewhere within the round trip: compare to its middle.
    skew = db_now.timestamp() - (sent + back) / 2
    ok, detail = skew_verdict(skew)
    if not ok:
        raise CheckFailed(detail)
    return f"{detail} (round trip {1000 * (back - sent):.0f} ms)"


# --- Slack --------------------------------------------------------------------------


def manifest_scopes(path: str | None) -> tuple[list[str], str]:
    """The manifest's bot scopes and where they came from."""
    if path is None and not os.path.exists(MANIFEST):
        return list(BOT_SCOPES), "this release's manifest"
    path = path or MANIFEST
    try:
        with open(path, encoding="utf-8") as file:
            data = yaml.safe_load(file)
        scopes = data["oauth_config"]["scopes"]["bot"]
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise TypeError("oauth_config.scopes.bot is not a list of scopes")
    except OSError as exc:
        raise CheckFailed(f"cannot read the manifest {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, KeyError, TypeError) as exc:
        detail = f"no oauth_config.scopes.bot ({exc})" if isinstance(exc, KeyError) else exc
        raise CheckFailed(f"the manifest {path}: {one_line(detail)}") from None
    return scopes, path


class Slack:
    """One ``auth.test``, shared by the token and scopes checks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._answer: asyncio.Task[Any] | None = None

    async def auth_test(self) -> Any:
        if self._answer is None:
            self._answer = asyncio.ensure_future(self._call())
        return await asyncio.shield(self._answer)

    async def _call(self) -> Any:
        token = self.settings.slack.bot_token.strip()
        if not token:
            raise CheckFailed("SLACK_BOT_TOKEN is not set")
        client = AsyncWebClient(
            token=token, base_url=self.settings.slack.api_url, timeout=int(CHECK_TIMEOUT_S)
        )
        client.retry_handlers = []  # one attempt: a doctor reports, it does not insist
        try:
            return await client.auth_test()
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else None
            raise CheckFailed(f"auth.test refused the token: {error or exc}") from None
        except (OSError, TimeoutError) as exc:
            url = self.settings.slack.api_url
            raise CheckFailed(
                f"cannot reach {url}: {one_line(exc) or type(exc).__name__}"
            ) from None

    async def token(self) -> str:
        answer = await self.auth_test()
        return (
            f"auth.test ok: bot {answer.get('user') or answer.get('user_id')} "
            f"in team {answer.get('team') or answer.get('team_id')}"
        )

    async def scopes(self, manifest: str | None) -> str:
        wanted, source = manifest_scopes(manifest)
        answer = await self.auth_test()
        header = answer.headers.get("x-oauth-scopes") if answer.headers else None
        if header is None:
            raise CheckFailed("auth.test gave no x-oauth-scopes header to compare")
        granted = {s.strip() for s in header.split(",") if s.strip()}
        missing = [s for s in wanted if s not in granted]
        if missing:
            raise CheckFailed(
                f"the token lacks {', '.join(missing)} (in {source}): reinstall the app"
            )
        extra = sorted(granted - set(wanted))
        more = f"; also granted {', '.join(extra)}" if extra else ""
        return f"every scope of {source} granted ({len(wanted)}){more}"


async def check_signing_secret(settings: Settings) -> str:
    if not settings.slack.signing_secret.strip():
        if settings.slack.app_token.strip():
            return "not set; SLACK_APP_TOKEN is (Socket Mode needs no signing secret)"
        raise CheckFailed("SLACK_SIGNING_SECRET is not set: `opsloop serve` refuses to start")
    return "SLACK_SIGNING_SECRET is set"


# --- the model ----------------------------------------------------------------------


async def check_model(settings: Settings) -> str:
    key = settings.model.api_key.strip()
    if not key:
        raise CheckFailed("ANTHROPIC_API_KEY is not set")
    name = settings.model.name or DEFAULT_MODEL
    client = anthropic.AsyncAnthropic(
        api_key=key,
        base_url=(settings.model.base_url or "").strip() or None,
        max_retries=0,
        timeout=CHECK_TIMEOUT_S,
    )
    try:
        model = await client.models.retrieve(name)
    except anthropic.AuthenticationError:
        raise CheckFailed("the API key was refused (401)") from None
    except anthropic.PermissionDeniedError:
        raise CheckFailed("the API key may not use the API (403)") from None
    except anthropic.NotFoundError:
        raise CheckFailed(f"the key is accepted but the model {name!r} is unknown") from None
    except anthropic.APIStatusError as exc:
        raise CheckFailed(f"the API answered {exc.status_code}") from None
    except anthropic.APIConnectionError as exc:
        raise CheckFailed(f"cannot reach the API: {one_line(exc)}") from None
    finally:
        await client.close()
    return f"key accepted; model {model.id} available"


# --- MCP servers --------------------------------------------------------------------


async def check_mcp(
    name: str,
    spec: McpServerConfig,
    noted: dict[str, list[str] | None] | None = None,
    database_url: str | None = None,
) -> str:
    """``noted[name]``: the server's tool names when it listed them, else None. A server
    with ``auth:`` uses the tokens serve keeps at ``database_url``; while serve waits for
    an admin to authorize opsloop, the line is the link to open."""
    noted = {} if noted is None else noted
    noted[name] = None
    source = McpSource(name, spec)
    async with stored_oauth(database_url, [source]) as store:
        try:
            tools = await source.open()  # McpLoadError: unreachable, allowlist not served
            now = await source.current_definitions()
        except ToolError as exc:
            if link := await authorization_link(store, name, spec):
                raise CheckFailed(f"waits for an admin to authorize opsloop: open {link}") from None
            raise CheckFailed(one_line(exc)) from None
        finally:
            await source.close()
    noted[name] = [t.name for t in tools]
    drifted = sorted(t.name for t in tools if now.get(t.name) != t.definition_hash)
    if drifted:
        raise CheckFailed(
            f"definitions changed between two listings: {', '.join(drifted)} "
            "(calls approved under one are refused under the other)"
        )
    if source.left_out:  # what the model API would refuse (one warning line each at serve)
        raise CheckWarning(
            f"reachable ({spec.transport}); {len(tools)} tools, definitions stable; "
            f"left out (serve runs without them): {'; '.join(source.left_out)}"
        )
    oauth = f"; OAuth {spec.auth.type}" if spec.auth is not None else ""
    return f"reachable ({spec.transport}); {len(tools)} tools, definitions stable{oauth}"


# --- the policy's rules --------------------------------------------------------------


async def check_rules(
    settings: Settings, config: ConfigFile, mcp_tools: dict[str, list[str] | None]
) -> str:
    """Every rule matches a tool the process loads: its modules and HTTP actions, loaded
    here as ``opsloop config check`` loads them, and the tools the MCP checks found
    (``mcp_tools``; None: that server's tools are not known, so a rule that may match
    one is not counted)."""
    try:
        loaded = await check_loading(settings, config)
    except ToolError as exc:
        raise CheckFailed(one_line(exc)) from None
    names = [*loaded.tools.names(), *(n for found in mcp_tools.values() for n in found or ())]
    unknown = [server for server, found in mcp_tools.items() if found is None]
    problems = unmatched_rules(config.policy, names, unknown)
    if problems:
        raise CheckWarning("; ".join(p.line() for p in problems))
    return f"each of the {len(config.policy)} rules matches a tool ({len(names)} tools)"


# --- running them -------------------------------------------------------------------

LOCAL = "not needed by opsloop local"


async def _not_needed(why: str) -> str:
    return f"{LOCAL} ({why})"


async def check_local_model(settings: Settings) -> str:
    """Local mode asks Claude when a key is set (then it must work), else runs offline."""
    if not settings.model.api_key.strip():
        return f"{LOCAL}: without ANTHROPIC_API_KEY it runs its offline phrasebook model"
    return await check_model(settings)


def checks(
    settings: Settings,
    config: ConfigFile | None,
    manifest: str | None,
    *,
    local: bool = False,
    mcp_tools: dict[str, list[str] | None] | None = None,
) -> list[Check]:
    """The checks; ``local``: for `opsloop local`, which makes its own Slack workspace
    (token, scopes and signing secret) and needs no model key. Each MCP check notes the
    tools it found in ``mcp_tools`` (None when it failed) for :func:`check_rules`."""
    slack = Slack(settings)
    found: list[Check] = [
        ("database", lambda: check_database(settings), CHECK_TIMEOUT_S),
        ("clock", lambda: check_clock(settings), CHECK_TIMEOUT_S),
    ]
    if local:
        workspace = "the local workspace makes its own"
        found += [
            ("slack token", partial(_not_needed, f"{workspace} token"), CHECK_TIMEOUT_S),
            ("slack scopes", partial(_not_needed, f"{workspace} app"), CHECK_TIMEOUT_S),
            ("signing secret", partial(_not_needed, f"{workspace} secret"), CHECK_TIMEOUT_S),
            ("model", lambda: check_local_model(settings), CHECK_TIMEOUT_S),
        ]
    else:
        found += [
            ("slack token", slack.token, CHECK_TIMEOUT_S),
            ("slack scopes", lambda: slack.scopes(manifest), CHECK_TIMEOUT_S),
            ("signing secret", lambda: check_signing_secret(settings), CHECK_TIMEOUT_S),
            ("model", lambda: check_model(settings), CHECK_TIMEOUT_S),
        ]
    servers = config.tools.mcp if config is not None else {}
    noted = {} if mcp_tools is None else mcp_tools
    for name, spec in servers.items():
        # The connect (start, initialize, first listing) as serve allows it, then the
        # second listing within the usual check time.
        allowed = CONNECT_TIMEOUT_S + CHECK_TIMEOUT_S
        check = partial(check_mcp, name, spec, noted, settings.database_url)
        found.append((f"mcp {name}", check, allowed))
    return found


async def _run(name: str, check: Callable[[], Awaitable[str]], allowed_s: float) -> Result:
    try:
        async with asyncio.timeout(allowed_s):
            return Result(name, True, await check())
    except CheckWarning as exc:
        return Result(name, True, str(exc), warn=True)
    except CheckFailed as exc:
        return Result(name, False, str(exc))
    except TimeoutError:
        return Result(name, False, f"no answer within {allowed_s:g} s")
    except Exception as exc:  # a check's own failure is its line, never a traceback
        return Result(name, False, one_line(exc) or type(exc).__name__)


def scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


async def run_doctor(
    settings: Settings,
    config: ConfigFile | None,
    *,
    manifest: str | None = None,
    secrets: Sequence[str] = (),
    out: Callable[[str], None] = print,
    local: bool = False,
    strict: bool = False,
) -> int:
    """Run every check; print one line each, in order; 1 if any failed (with
    ``strict``, or warned), else 0. The rules are checked last, against the tools the
    MCP checks found."""
    mcp_tools: dict[str, list[str] | None] = {}
    todo = checks(settings, config, manifest, local=local, mcp_tools=mcp_tools)
    results = list(await asyncio.gather(*(_run(*check) for check in todo)))
    if config is not None and config.policy:
        rules = partial(check_rules, settings, config, mcp_tools)
        # Importing the tool modules is local work, but slow on a loaded machine.
        allowed = CONNECT_TIMEOUT_S + CHECK_TIMEOUT_S
        results.append(await _run("policy rules", rules, allowed))
    if strict:
        results = [Result(r.name, False, r.detail) if r.warn else r for r in results]
    width = max(len(r.name) for r in results)
    for result in results:
        out(scrub(result.line(width), secrets))
    return 0 if all(r.ok for r in results) else 1


__all__ = ["BOT_SCOPES", "CHECK_TIMEOUT_S", "MAX_SKEW_S", "run_doctor", "skew_verdict"]
