"""A new authorization link for an MCP server, posted privately to its ``admins``
(bot/oauth_notice.py): one DM per admin per new link, none for the retries that reuse
it, none without admins; a Slack failure changes nothing but a log line. Against the
fake Slack and the MCP server behind OAuth (tests/support/oauth_servers.py)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from bot.mrkdwn import escape
from bot.oauth_callback import add_oauth_callback_route
from bot.oauth_notice import notice_text, post_authorization_link
from bot.runtime import start_runtime
from engine.config_file import parse_config
from engine.errors import ConfigError
from engine.store import Store
from tests.bot.test_cli import run_cli
from tests.bot.test_runtime import settings_for
from tests.fakes.slack import SIGNING_SECRET, TOKEN, FakeSlack
from tests.support.oauth_servers import PRE_ID, PRE_SECRET
from tests.tools.test_mcp_oauth import (
    PENDING,
    Callback,
    OAuthServer,
    admin_opens,
    code_flow,
    listed,
    start,
)
from tools.mcp import McpLoadError, McpServerConfig, McpSource, keeper
from tools.mcp.auth import PENDING_TTL, binding, pending_link

ADMIN, OTHER = "U0ADMIN01", "W0ADMIN02"
_DATE = re.compile(r"<!date\^(\d+)\^")
_LINK = re.compile(r"<(https?://[^|>]+)\|")
slow = pytest.mark.slow  # starts the MCP server behind OAuth, or a CLI process


@pytest.fixture
def oauth_server() -> Iterator[OAuthServer]:
    server = start()
    yield server
    server.proc.kill()
    server.proc.wait()


@pytest.fixture
async def callback(store: Store) -> AsyncIterator[Callback]:
    told: list[str] = []
    app = web.Application()
    add_oauth_callback_route(app, store, told.append)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield Callback(f"http://127.0.0.1:{runner.addresses[0][1]}/oauth/callback", told)
    await runner.cleanup()


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


def serving(config: McpServerConfig, store: Store, slack_url: str) -> McpSource:
    """The source as serve wires it: OAuth in the store, new links to the admins."""
    src = McpSource("docs", config)
    client = AsyncWebClient(token=TOKEN, base_url=slack_url)
    src.keep_oauth_in(store, partial(post_authorization_link, client))
    return src


async def waits_for_the_admin(src: McpSource) -> None:
    with pytest.raises(McpLoadError) as caught:
        await listed(src)
    assert str(caught.value) == f"MCP server 'docs' is not authorized: {PENDING}"


def dms(slack: FakeSlack) -> list[tuple[str, str]]:
    return [
        (str(c.params["channel"]), str(c.params["text"]))
        for c in slack.calls_to("chat.postMessage")
    ]


def link_in(text: str) -> str:
    """The link of a DM, as the admin's browser opens it (Slack decodes the entities)."""
    [found] = _LINK.findall(text)
    return str(found).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@slow
async def test_each_admin_gets_one_dm_per_new_link_and_it_authorizes_opsloop(
    store: Store, oauth_server, callback, slack: FakeSlack, caplog
):
    config = code_flow(
        oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET, admins=[ADMIN, OTHER]
    )
    caplog.set_level(logging.INFO)
    for _ in range(3):  # serve's first connect, then retries that reuse the link
        await waits_for_the_admin(serving(config, store, slack.url))
    link = await pending_link(store, "docs", config)
    row = await store.select_mcp_oauth("docs")
    assert link is not None and row is not None and row.pending_since is not None

    sent = dms(slack)
    assert [channel for channel, _ in sent] == [ADMIN, OTHER]  # each in their DM with the app
    assert [m["text"] for m in slack.posted(ADMIN)] == [sent[0][1]]
    text = sent[0][1]
    assert text == sent[1][1]
    assert "MCP server `docs`" in text
    assert "grants opsloop *your* access on `docs`" in text
    assert f"<{escape(link)}|" in text and link not in text  # its & escaped
    assert link_in(text) == link
    [until] = _DATE.findall(text)
    assert int(until) == int((row.pending_since + PENDING_TTL).timestamp())
    call = slack.calls_to("chat.postMessage")[0]
    assert call.params["unfurl_links"] in (False, "false", "0")  # Slack never opens it

    assert urlsplit(link).query not in caplog.text  # the link's query is never logged
    assert row.pending_state is not None and row.pending_state not in caplog.text
    assert f"mcp authorization link posted server=docs admins={ADMIN},{OTHER}" in caplog.text

    # The link as the admin got it works: opsloop is authorized, and nobody is told again.
    page = await admin_opens(link_in(text))
    assert (page.status_code, callback.authorized) == (200, ["docs"])
    assert await listed(serving(config, store, slack.url)) == ["mcp__docs__ping"]
    assert len(dms(slack)) == 2


@slow
async def test_a_link_made_again_after_a_day_is_posted_again(
    store: Store, oauth_server, callback, slack: FakeSlack
):
    config = code_flow(
        oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET, admins=[ADMIN]
    )
    await waits_for_the_admin(serving(config, store, slack.url))
    row = await store.select_mcp_oauth("docs")
    assert row is not None and row.pending_state and row.pending_verifier and row.pending_url
    old = datetime.now(UTC) - PENDING_TTL - timedelta(minutes=1)
    await store.upsert_mcp_pending(
        "docs", row.binding, row.pending_state, row.pending_verifier, row.pending_url, old
    )
    await waits_for_the_admin(serving(config, store, slack.url))  # a new link
    await waits_for_the_admin(serving(config, store, slack.url))  # reused

    fresh = await pending_link(store, "docs", config)
    assert fresh not in (None, row.pending_url)
    assert [link_in(text) for _, text in dms(slack)] == [row.pending_url, fresh]


@slow
@pytest.mark.parametrize("admins", [{"admins": []}, {}], ids=["empty", "absent"])
async def test_without_admins_nobody_gets_a_dm(
    store: Store, oauth_server, callback, slack: FakeSlack, admins: dict[str, Any]
):
    config = code_flow(oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET, **admins)
    await waits_for_the_admin(serving(config, store, slack.url))
    assert await pending_link(store, "docs", config) is not None  # `opsloop doctor` shows it
    assert slack.calls_to("chat.postMessage") == []


@slow
async def test_a_slack_error_is_one_line_and_changes_nothing_else(
    store: Store, oauth_server, callback, slack: FakeSlack, caplog
):
    config = code_flow(
        oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET, admins=[ADMIN, OTHER]
    )
    slack.fail("chat.postMessage", "channel_not_found")  # the first admin's post
    for _ in range(2):
        await waits_for_the_admin(serving(config, store, slack.url))
    assert [channel for channel, _ in dms(slack)] == [ADMIN, OTHER]  # the other still told
    assert len(slack.posted(OTHER)) == 1 and slack.posted(ADMIN) == []
    lines = [r.getMessage() for r in caplog.records if "not posted" in r.getMessage()]
    assert lines == [
        f"mcp authorization link not posted server=docs admins={ADMIN}:channel_not_found: "
        "`opsloop doctor` shows it"
    ]
    link = await pending_link(store, "docs", config)
    assert link is not None and urlsplit(link).query not in caplog.text
    assert "Traceback" not in caplog.text

    await admin_opens(link)  # the link stays good
    assert await listed(serving(config, store, slack.url)) == ["mcp__docs__ping"]


@slow
async def test_slack_unreachable_or_a_failing_notice_never_breaks_the_connect(
    store: Store, oauth_server, callback, caplog
):
    config = code_flow(
        oauth_server, callback, client_id=PRE_ID, client_secret=PRE_SECRET, admins=[ADMIN]
    )
    async with FakeSlack() as gone:
        url = gone.url  # closed on leaving: nothing answers there any more
    await waits_for_the_admin(serving(config, store, url))
    [line] = [r.getMessage() for r in caplog.records if "not posted" in r.getMessage()]
    assert line.startswith(f"mcp authorization link not posted server=docs admins={ADMIN}:")
    assert "Traceback" not in caplog.text

    async def broken(*args: object) -> None:
        raise RuntimeError(f"a bug that quotes {args[1]}")

    await store.delete_mcp_oauth("docs")  # so the next connect makes a new link
    src = McpSource("docs", config)
    src.keep_oauth_in(store, broken)
    await waits_for_the_admin(src)
    link = await pending_link(store, "docs", config)
    assert link is not None and urlsplit(link).query not in caplog.text
    assert (
        "mcp authorization link not posted server=docs error=RuntimeError: "
        "`opsloop doctor` shows it"
    ) in caplog.text


# --- serve wires it ---------------------------------------------------------------------


@slow
async def test_serve_posts_a_new_link_to_the_admins_at_startup(
    db_url, fakes, tmp_path: Path, monkeypatch
) -> None:
    async def never(delay: float) -> None:
        await asyncio.get_running_loop().create_future()

    monkeypatch.setattr(keeper, "sleep", never)  # no retry of the keeper's own meanwhile
    slack, _ = fakes
    oauth = start()
    config = parse_config(
        f"""
tools:
  mcp:
    tickets:
      url: {oauth.url}
      auth:
        type: authorization_code
        redirect_url: http://127.0.0.1:1/oauth/callback
        client_id: {PRE_ID}
        client_secret: {PRE_SECRET}
        admins: [{ADMIN}]
""",
        {},
    )
    try:
        rt = await start_runtime(
            settings_for(db_url, fakes, tmp_path),
            token=TOKEN,
            signing_secret=SIGNING_SECRET,
            config=config,
        )
        try:
            row = await rt.store.select_mcp_oauth("tickets")
            assert row is not None and row.pending_url is not None
            [(channel, text)] = dms(slack)
            assert channel == ADMIN and link_in(text) == row.pending_url
            assert "MCP server `tickets`" in text
        finally:
            await rt.close(5)
    finally:
        oauth.proc.kill()
        oauth.proc.wait()


# --- the text ---------------------------------------------------------------------------


def test_the_text_escapes_what_it_shows() -> None:
    until = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
    text = notice_text("docs", "https://as.example/authorize?a=1&b=<x>|y", until)
    assert "<https://as.example/authorize?a=1&amp;b=&lt;x&gt;%7Cy|Authorize opsloop for docs>" in (
        text
    )
    assert f"<!date^{int(until.timestamp())}^" in text and "2030-01-02 03:04 UTC" in text
    assert "(at as.example)" in text


# --- the configuration ------------------------------------------------------------------

AUTH = "{type: authorization_code, redirect_url: 'https://o/oauth/callback', admins: %s}"


def _parse(auth: str) -> McpServerConfig:
    text = f"tools:\n  mcp:\n    docs:\n      url: https://docs/mcp\n      auth: {auth}\n"
    return parse_config(text, {}).tools.mcp["docs"]


def test_admins_are_user_ids_and_do_not_change_what_the_tokens_are_for() -> None:
    server = _parse(AUTH % f"[{ADMIN}, {OTHER}]")
    assert server.auth is not None and server.auth.admins == [ADMIN, OTHER]
    assert binding(server) == binding(_parse(AUTH % "[]"))  # tokens kept when admins change


@pytest.mark.parametrize(
    ("admins", "problem"),
    [
        (
            f"[{ADMIN}, S0SRE]",
            "admins[1]: 'S0SRE' is not a Slack user id (U…, W…): the link is sent privately "
            "to each admin",
        ),
        ("['#ops']", "admins[0]: '#ops' is not a Slack user id (U…, W…)"),
        ("[u0lower]", "admins[0]: 'u0lower' is not a Slack user id"),
        ("[123]", "admins[0]: must be a string, not 123"),
        (ADMIN, "admins: "),
    ],
    ids=["a-group", "a-channel-name", "lowercase", "a-number", "not-a-list"],
)
def test_a_bad_admin_is_one_line_naming_it(admins: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _parse(AUTH % admins)
    assert str(caught.value).startswith(f"opsloop.yaml: tools.mcp.docs.auth.{problem}")
    assert "\n" not in str(caught.value)


def test_admins_go_with_authorization_code() -> None:
    with pytest.raises(ConfigError) as caught:
        _parse(f"{{type: client_credentials, client_id: a, client_secret: b, admins: [{ADMIN}]}}")
    assert str(caught.value) == (
        "opsloop.yaml: tools.mcp.docs.auth.admins: goes with authorization_code "
        "(client_credentials needs no one)"
    )


@slow
def test_config_check_names_the_bad_admin(tmp_path: Path) -> None:
    path = tmp_path / "opsloop.yaml"
    path.write_text(
        f"tools:\n  mcp:\n    docs:\n      url: https://docs/mcp\n      auth: {AUTH % '[S0SRE]'}\n"
    )
    proc = run_cli("config", "check", str(path), db=None, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line == (
        f"opsloop: {path}: tools.mcp.docs.auth.admins[0]: 'S0SRE' is not a Slack user id "
        "(U…, W…): the link is sent privately to each admin"
    )
