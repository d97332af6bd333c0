"""OAuth for HTTP MCP servers (issue 16 §10): the SDK's client with its state in the
database, against an MCP server behind OAuth and its authorization server
(tests/support/oauth_servers.py): client credentials, pre-registered and dynamically
registered clients, the authorization-code flow through a link an admin opens and
serve's ``GET /oauth/callback``, tokens reused across restarts and refreshed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
from aiohttp import web

from bot.doctor import CheckFailed, check_mcp
from bot.oauth_callback import add_oauth_callback_route
from engine.config_file import parse_config
from engine.errors import ConfigError
from engine.store import Store
from tests.support.oauth_servers import CC_ID, CC_SECRET, PRE_ID, PRE_SECRET
from tests.tools.test_mcp import run
from tools.mcp import McpLoadError, McpServerConfig, McpSource
from tools.mcp.auth import MemoryRecords, pending_link
from tools.mcp.errors import McpNotAuthorized

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).resolve().parents[1] / "support" / "oauth_servers.py")
PENDING = "an admin must authorize opsloop first (`opsloop doctor` shows the link)"


@dataclass
class OAuthServer:
    """The MCP server behind OAuth and its authorization server, on one origin."""

    proc: subprocess.Popen[str]
    port: int

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/mcp"

    def stats(self) -> dict[str, int]:
        return dict(httpx2.get(f"{self.origin}/stats").json())

    def revoke(self, *, refresh: bool = False) -> None:
        query = "?refresh" if refresh else ""
        httpx2.post(f"{self.origin}/revoke{query}").raise_for_status()


def start(*flags: str) -> OAuthServer:
    proc = subprocess.Popen([sys.executable, SCRIPT, *flags], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[1])
    proc.stdout.close()
    return OAuthServer(proc, port)


@pytest.fixture
def oauth_server() -> Iterator[OAuthServer]:
    server = start()
    yield server
    server.proc.kill()
    server.proc.wait()


def cc(server: OAuthServer, secret: str = CC_SECRET, **more: Any) -> McpServerConfig:
    auth = {"type": "client_credentials", "client_id": CC_ID, "client_secret": secret}
    return McpServerConfig.model_validate({"url": server.url, "auth": {**auth, **more}})


async def listed(src: McpSource) -> list[str]:
    try:
        return [t.name for t in await src.open()]
    finally:
        await src.close()


# --- client credentials -----------------------------------------------------------------


async def test_client_credentials_get_a_token_kept_in_the_database(store: Store, oauth_server):
    src = McpSource("docs", cc(oauth_server, issuer=oauth_server.origin), oauth=store)
    try:
        [tool] = await src.open()
        assert await run(tool, {}) == {"text": "pong"}
    finally:
        await src.close()
    assert oauth_server.stats()["token:client_credentials"] == 1
    row = await store.select_mcp_oauth("docs")
    assert row is not None and row.tokens is not None and row.expires_at is not None
    token = json.loads(row.tokens)["access_token"]
    assert oauth_server.stats()[f"mcp:{token}"] >= 3  # initialize, list, call: one token
    in_an_hour = datetime.now(UTC) + timedelta(hours=1)
    assert abs((row.expires_at - in_an_hour).total_seconds()) < 60
    assert CC_SECRET not in repr(row)  # the client secret stays in the file


async def test_a_restart_uses_the_stored_token_without_asking_for_another(
    store: Store, oauth_server
):
    assert await listed(McpSource("docs", cc(oauth_server), oauth=store)) == ["mcp__docs__ping"]
    assert await listed(McpSource("docs", cc(oauth_server), oauth=store)) == ["mcp__docs__ping"]
    stats = oauth_server.stats()
    assert stats["token:client_credentials"] == 1
    assert stats["401"] == 1  # the first connect's only


async def test_an_expired_token_is_replaced(store: Store, oauth_server):
    await listed(McpSource("docs", cc(oauth_server), oauth=store))
    row = await store.select_mcp_oauth("docs")
    assert row is not None and row.tokens is not None
    gone = datetime.now(UTC) - timedelta(seconds=1)
    await store.upsert_mcp_tokens("docs", row.binding, row.tokens, gone, datetime.now(UTC))
    assert await listed(McpSource("docs", cc(oauth_server), oauth=store)) == ["mcp__docs__ping"]
    assert oauth_server.stats()["token:client_credentials"] == 2
    fresh = await store.select_mcp_oauth("docs")
    assert fresh is not None and fresh.tokens != row.tokens
    assert fresh.expires_at is not None and fresh.expires_at > datetime.now(UTC)


async def test_a_token_revoked_mid_session_is_replaced_and_the_call_runs(oauth_server):
    src = McpSource("docs", cc(oauth_server))
    try:
        [tool] = await src.open()
        oauth_server.revoke()
        assert await run(tool, {}) == {"text": "pong"}
    finally:
        await src.close()
    assert oauth_server.stats()["token:client_credentials"] == 2


async def test_a_refused_client_secret_says_so_in_one_line_without_the_secret(oauth_server, caplog):
    wrong = "wrong-secret-value"
    src = McpSource("docs", cc(oauth_server, secret=wrong))
    with pytest.raises(McpLoadError) as caught:
        await src.open()
    text = str(caught.value)
    assert text.startswith(
        "MCP server 'docs' is not authorized: OAuth: Token exchange failed (401)"
    )
    assert "invalid_client" in text and "\n" not in text
    assert wrong not in text and wrong not in caplog.text
    assert src.down_reason.startswith("MCP server 'docs': not authorized: OAuth:")


async def test_another_client_id_voids_the_stored_tokens(store: Store, oauth_server):
    await listed(McpSource("docs", cc(oauth_server), oauth=store))
    first = await store.select_mcp_oauth("docs")
    other = McpServerConfig.model_validate(
        {
            "url": oauth_server.url,
            "auth": {
                "type": "client_credentials",
                "client_id": PRE_ID,
                "client_secret": PRE_SECRET,
            },
        }
    )
    assert await listed(McpSource("docs", other, oauth=store)) == ["mcp__docs__ping"]
    second = await store.select_mcp_oauth("docs")
    assert first is not None and second is not None
    assert second.binding != first.binding and second.tokens != first.tokens
    assert oauth_server.stats()["token:client_credentials"] == 2


async def test_tokens_oauth_gave_are_redacted_like_configured_secrets(oauth_server):
    server = cc(oauth_server)
    await listed(McpSource("docs", server, oauth=(records := MemoryRecords())))
    token = json.loads(records.rows["docs"].tokens or "{}")["access_token"]
    assert server.redact(f"echo Bearer {token}") == "echo Bearer ***"
    assert server.redact(f"secret {CC_SECRET}") == "secret ***"


async def test_without_auth_a_401_keeps_todays_message(oauth_server):
    src = McpSource("docs", McpServerConfig(url=oauth_server.url))
    with pytest.raises(McpLoadError) as caught:
        await src.open()
    challenge = (
        f'Bearer resource_metadata="{oauth_server.origin}/.well-known/oauth-protected-resource/mcp"'
    )
    assert str(caught.value) == (
        f"MCP server 'docs' answered 401: this server needs authorization "
        f"(WWW-Authenticate: {challenge})"
    )


# --- the authorization-code flow --------------------------------------------------------


@dataclass
class Callback:
    """serve's ``GET /oauth/callback`` on its own port, and whom it told."""

    redirect_url: str
    authorized: list[str]


@pytest.fixture
async def callback(store: Store) -> AsyncIterator[Callback]:
    told: list[str] = []
    app = web.Application()
    add_oauth_callback_route(app, store, told.append)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield Callback(f"http://127.0.0.1:{port}/oauth/callback", told)
    await runner.cleanup()


def code_flow(server: OAuthServer, callback: Callback, **more: Any) -> McpServerConfig:
    auth = {"type": "authorization_code", "redirect_url": callback.redirect_url, **more}
    return McpServerConfig.model_validate({"url": server.url, "auth": auth})


async def admin_opens(link: str) -> httpx2.Response:
    """What the admin's browser does: the authorization server approves (at once, here)
    and sends it back to the callback."""
    async with httpx2.AsyncClient() as browser:
        approved = await browser.get(link)
        assert approved.status_code == 302
        return await browser.get(approved.headers["location"])


async def test_an_admin_authorizes_a_pre_registered_client_through_the_callback(
    store: Store, oauth_server, callback, caplog
):
    config = code_flow(oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET)
    caplog.set_level(logging.WARNING, logger="tools.mcp.source")
    for _ in range(2):  # serve's first connect, then a retry: one link, asked once
        with pytest.raises(McpLoadError) as caught:
            await listed(McpSource("docs", config, oauth=store))
        assert str(caught.value) == f"MCP server 'docs' is not authorized: {PENDING}"
    asked = [r.getMessage() for r in caplog.records if "needs authorization" in r.getMessage()]
    assert asked == [
        "mcp server needs authorization server=docs: an admin opens the link `opsloop doctor` "
        f"shows (it returns to {callback.redirect_url})"
    ]
    link = await pending_link(store, "docs", config)
    assert link is not None and link.startswith(f"{oauth_server.origin}/authorize?")
    assert "Traceback" not in caplog.text

    page = await admin_opens(link)
    assert (page.status_code, callback.authorized) == (200, ["docs"])
    assert "opsloop is authorized for the MCP server docs" in page.text

    assert await listed(McpSource("docs", config, oauth=store)) == ["mcp__docs__ping"]
    stats = oauth_server.stats()
    assert (stats["authorize"], stats["token:authorization_code"]) == (1, 1)
    assert stats.get("register", 0) == 0  # pre-registered: never a registration
    row = await store.select_mcp_oauth("docs")
    assert row is not None and row.pending_url is None and row.tokens is not None
    assert "refresh_token" in row.tokens
    assert await pending_link(store, "docs", config) is None

    async with httpx2.AsyncClient() as browser:
        again = await browser.get(page.request.url)  # the same answer, replayed
    assert again.status_code == 400 and "No authorization waits" in again.text


async def test_an_expired_token_is_refreshed_without_asking_the_admin_again(
    store: Store, oauth_server, callback
):
    config = code_flow(oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET)
    with pytest.raises(McpLoadError):
        await listed(McpSource("docs", config, oauth=store))
    link = await pending_link(store, "docs", config)
    assert link is not None
    await admin_opens(link)
    await listed(McpSource("docs", config, oauth=store))
    row = await store.select_mcp_oauth("docs")
    assert row is not None and row.tokens is not None
    gone = datetime.now(UTC) - timedelta(seconds=1)
    await store.upsert_mcp_tokens("docs", row.binding, row.tokens, gone, datetime.now(UTC))

    assert await listed(McpSource("docs", config, oauth=store)) == ["mcp__docs__ping"]
    stats = oauth_server.stats()
    assert (stats["token:refresh_token"], stats["authorize"]) == (1, 1)
    fresh = await store.select_mcp_oauth("docs")
    assert fresh is not None and fresh.tokens is not None
    assert json.loads(fresh.tokens)["refresh_token"] != json.loads(row.tokens)["refresh_token"]


async def test_a_token_refused_before_it_expires_is_refreshed_without_the_admin(
    store: Store, oauth_server, callback
):
    config = code_flow(oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET)
    with pytest.raises(McpLoadError):
        await listed(McpSource("docs", config, oauth=store))
    link = await pending_link(store, "docs", config)
    assert link is not None
    await admin_opens(link)
    src = McpSource("docs", config, oauth=store)
    try:
        [tool] = await src.open()
        oauth_server.revoke()  # the access token only: the refresh token is still good
        assert await run(tool, {}) == {"text": "pong"}
    finally:
        await src.close()
    stats = oauth_server.stats()
    assert (stats["token:refresh_token"], stats["authorize"]) == (1, 1)
    assert await pending_link(store, "docs", config) is None  # no admin asked


async def test_without_a_client_id_opsloop_registers_once_and_keeps_the_client(
    store: Store, oauth_server, callback
):
    config = code_flow(oauth_server, callback)
    for _ in range(2):
        with pytest.raises(McpLoadError):
            await listed(McpSource("docs", config, oauth=store))
    link = await pending_link(store, "docs", config)
    assert link is not None
    await admin_opens(link)
    assert await listed(McpSource("docs", config, oauth=store)) == ["mcp__docs__ping"]
    assert oauth_server.stats()["register"] == 1
    row = await store.select_mcp_oauth("docs")
    assert row is not None and json.loads(row.client_info or "{}")["client_id"].startswith("dyn-")


async def test_the_callback_refuses_junk_with_a_4xx_and_stores_nothing(store: Store, callback):
    await store.upsert_mcp_pending("docs", "b", "the-state", "v", "https://as/a", datetime.now(UTC))
    async with httpx2.AsyncClient() as browser:
        for query in (
            "",
            "?code=c",
            "?state=the-state",
            "?state=unknown&code=c",
            "?error=access_denied&state=the-state",
            "?error=%3Cscript%3E&state=the-state",
            f"?state=the-state&code={'x' * 5000}",
        ):
            page = await browser.get(callback.redirect_url + query)
            assert page.status_code == 400, query
            assert "<script>" not in page.text and page.headers["content-type"].startswith(
                "text/plain"
            )
    row = await store.select_mcp_oauth("docs")
    assert row is not None and row.code is None and callback.authorized == []


async def test_doctor_shows_the_link_an_admin_opens(store: Store, oauth_server, callback, db_url):
    config = code_flow(oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET)
    with pytest.raises(CheckFailed) as never_asked:  # serve has not asked yet
        await check_mcp("docs", config, database_url=db_url)
    assert "no authorization was asked for yet: `opsloop serve` asks for one" in str(
        never_asked.value
    )
    with pytest.raises(McpLoadError):
        await listed(McpSource("docs", config, oauth=store))  # serve asks
    link = await pending_link(store, "docs", config)
    with pytest.raises(CheckFailed) as caught:
        await check_mcp("docs", config, database_url=db_url)
    assert str(caught.value) == f"waits for an admin to authorize opsloop: open {link}"
    assert await pending_link(store, "docs", config) == link  # doctor asked nothing

    assert link is not None
    await admin_opens(link)
    await listed(McpSource("docs", config, oauth=store))
    line = await check_mcp("docs", config, database_url=db_url)
    assert line == "reachable (http); 1 tools, definitions stable; OAuth authorization_code"
    assert oauth_server.stats()["token:authorization_code"] == 1  # doctor used serve's token


async def test_a_call_needing_a_new_authorization_was_not_run(store: Store, oauth_server, callback):
    config = code_flow(oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET)
    with pytest.raises(McpLoadError):
        await listed(McpSource("docs", config, oauth=store))
    link = await pending_link(store, "docs", config)
    assert link is not None
    await admin_opens(link)
    src = McpSource("docs", config, oauth=store)
    try:
        [tool] = await src.open()
        oauth_server.revoke(refresh=True)  # the server forgot us altogether
        with pytest.raises(McpNotAuthorized) as caught:  # retryable, not an unknown outcome
            await run(tool, {})
        assert str(caught.value) == f"MCP server 'docs': not authorized: {PENDING}"
    finally:
        await src.close()
    assert await pending_link(store, "docs", config) not in (None, link)  # a new link
    assert oauth_server.stats()["token:refresh_token"] == 1  # tried first, refused
    row = await store.select_mcp_oauth("docs")
    assert row is not None and row.tokens is None  # not tried again at the next connect


# --- the configuration ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("auth", "problem"),
    [
        ("{type: client_credentials, client_id: a}", "auth: client_credentials needs client_id"),
        ("{type: password}", "auth.type: must be one of"),
        ("{type: authorization_code}", "auth: authorization_code needs redirect_url"),
        ("{type: authorization_code, redirect_url: ftp://x}", "auth.redirect_url: must be an"),
        ("{type: client_credentials, client_id: a, client_secret: b, scopes: c}", "auth.scopes:"),
        (
            "{type: authorization_code, redirect_url: 'https://o/cb', client_secret: b}",
            "auth: client_secret goes with client_id",
        ),
        (
            "{type: authorization_code, redirect_url: 'https://o/cb', private_key: k}",
            "auth: private_key goes with client_credentials",
        ),
    ],
)
def test_a_wrong_auth_is_one_line_naming_the_key(auth: str, problem: str) -> None:
    text = f"tools:\n  mcp:\n    docs:\n      url: https://docs/mcp\n      auth: {auth}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, {})
    assert str(caught.value).startswith(f"opsloop.yaml: tools.mcp.docs.{problem}")
    assert "\n" not in str(caught.value)


def test_auth_goes_with_url_and_its_secrets_are_secrets() -> None:
    with pytest.raises(ConfigError, match=r"tools\.mcp\.docs: auth goes with url, not command"):
        parse_config(
            "tools: {mcp: {docs: {command: srv, auth: {type: client_credentials, "
            "client_id: a, client_secret: b}}}}",
            {},
        )
    text = (
        "tools:\n  mcp:\n    docs:\n      url: https://docs/mcp\n      auth:\n"
        "        type: client_credentials\n        client_id: ${ID}\n"
        "        client_secret: ${SECRET}\n"
    )
    server = parse_config(text, {"ID": "opsloop-id", "SECRET": "the-s3cret"}).tools.mcp["docs"]
    assert "the-s3cret" not in repr(server)
    assert server.redact("id opsloop-id secret the-s3cret") == "id *** secret ***"
