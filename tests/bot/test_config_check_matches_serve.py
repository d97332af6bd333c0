"""``opsloop config check`` and ``opsloop serve`` give every file the same verdict.

The same table of files goes to both: ``config check`` run as the command it is (a real
process), and serve's startup (``load_configuration`` then ``start_runtime``, as
``_cmd_serve`` runs them, MCP servers of the good files connected for real). A file one
accepts the other accepts; a file one refuses the other refuses with the same line.
The first rows are the files the two disagreed on before one model per section.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bot.cli import load_configuration
from bot.runtime import start_runtime
from engine.errors import ConfigError
from tests.bot.test_cli import ROOT, run_cli
from tests.fakes.anthropic import FAKE_API_KEY
from tests.fakes.slack import SIGNING_SECRET, TOKEN
from tools import ToolLoadError

pytestmark = pytest.mark.slow  # a real `opsloop config check` process per file

MCP_SERVER = ROOT / "tests" / "support" / "mcp_servers.py"
MCP = f"{{command: {sys.executable}, args: [{MCP_SERVER}, stdio], tools: [echo]}}"
SVC = "{type: object, properties: {svc: {type: string}}"


def http(action: str, hosts: str = "[platform.internal]") -> str:
    return f"tools:\n  http_allow_hosts: {hosts}\n  http:\n    {action}\n"


def rule(extra: str) -> str:
    return f"policy:\n  - {{tool: deploy, policy: approve_before_run, {extra}}}\n"


VALID = None
TABLE = [
    # --- the files check called valid and serve refused ---------------------------------
    (
        "optional-placeholder",
        http(
            f"a: {{description: d, url: 'https://platform.internal/{{svc}}', arguments: {SVC}}}}}"
        ),
        "tools.http.a.url: {svc} must be a required argument",
    ),
    (
        "ipv6-spelt-otherwise",
        http("ping: {description: d, url: 'http://[::1]:8080/ping'}", "['0:0:0:0:0:0:0:1']"),
        VALID,
    ),
    ("mcp-name-40", f"tools:\n  mcp:\n    {'m' * 40}: {MCP}\n", VALID),
    ("mcp-name-41", f"tools:\n  mcp:\n    {'m' * 41}: {MCP}\n", "a server name is 1-40"),
    (
        "credentials-in-url",
        http("a: {description: d, url: 'https://u:p@platform.internal/x'}"),
        "tools.http.a.url: must not hold credentials",
    ),
    (
        "placeholder-in-host",
        http(
            f"a: {{description: d, url: 'https://{{svc}}.platform.internal/', arguments: {SVC}"
            ", required: [svc]}}"
        ),
        "tools.http.a.url: placeholders may appear only in the url's path and query",
    ),
    (
        "reserved-name",
        http("request_clarification: {description: d, url: 'https://platform.internal/'}"),
        "tools.http.request_clarification: 'request_clarification' is the name of the engine's",
    ),
    (
        "name-of-a-module-tool",
        http("search_docs: {description: d, url: 'https://platform.internal/'}"),
        "tools.http: duplicate tool name 'search_docs'",
    ),
    (
        "module-that-cannot-be-imported",
        "tools:\n  modules: [no_such_tools_module]\n",
        "cannot import tool module 'no_such_tools_module'",
    ),
    # --- integrations ------------------------------------------------------------------
    ("integrations", "integrations: {github: {repos: [a/b]}}\n", "github.token: is required"),
    # --- and the rest ------------------------------------------------------------------
    ("empty", "", VALID),
    (
        "required-placeholder",
        http(
            f"a: {{description: d, method: put, url: 'https://platform.internal/{{svc}}?x=1',"
            f" timeout: 5s, arguments: {SVC}, required: [svc]}}}}"
        ),
        VALID,
    ),
    ("rule", rule("quorum: 1, expires_in: 2h, channels: [C0OPS]"), VALID),
    ("reminder", rule("remind_after: 30m, escalate_to: [U0A1, S0SRE, oncall:P1, C0OPS]"), VALID),
    ("grant", rule("max_grant: 30m"), VALID),
    ("grant-not-a-duration", rule("max_grant: soon"), "policy[0].max_grant (rule 1):"),
    (
        "reminder-after-expiry",
        rule("expires_in: 1h, remind_after: 1h"),
        "policy[0].remind_after (rule 1): must be shorter than expires_in",
    ),
    (
        "escalate-to-a-name",
        rule("escalate_to: [bob]"),
        "policy[0].escalate_to[0] (rule 1): 'bob' is not someone to escalate to",
    ),
    (
        "unlisted-host",
        http("a: {description: d, url: 'https://evil.example/'}"),
        "tools.http.a.url: host 'evil.example' is not in tools.http_allow_hosts",
    ),
    ("bad-allow-entry", "tools: {http_allow_hosts: ['https://h']}\n", "is not a host"),
    ("unknown-key", "tools: {unknown: 1}\n", "tools.unknown: is not a known key"),
    ("missing-variable", "tools: {modules: ['${NOT_SET_ANYWHERE}']}\n", "is not set"),
    ("mcp-two-transports", "tools: {mcp: {k: {url: 'https://k', command: k}}}\n", "not both"),
]


async def serve_verdict(path: Path, tmp_path: Path, fakes) -> str | None:
    """What serve's startup says of the file: None when it starts, else its one line."""
    slack, claude = fakes
    env = {
        "DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}",
        "ANTHROPIC_API_KEY": FAKE_API_KEY,
        "ANTHROPIC_BASE_URL": claude.url,
        "SLACK_API_URL": slack.url,
        "OPSLOOP_TICKETS_URL": f"sqlite:///{tmp_path / 'tickets.db'}",
    }
    try:
        settings, config = load_configuration(env, path=str(path))
        runtime = await start_runtime(
            settings, token=TOKEN, signing_secret=SIGNING_SECRET, config=config
        )
    except (ConfigError, ToolLoadError) as exc:
        return str(exc)
    await runtime.close(5)
    return None


def check_verdict(path: Path, tmp_path: Path) -> str | None:
    """What ``opsloop config check FILE`` says: None for exit 0, else its one line."""
    proc = run_cli("config", "check", str(path), db=None, cwd=tmp_path)
    if proc.returncode == 0:
        assert proc.stdout.startswith(f"{path}: valid ("), proc.stdout
        return None
    assert proc.returncode == 2 and proc.stdout == "", proc
    [line] = proc.stderr.splitlines()  # one line, never a traceback
    return line.removeprefix("opsloop: ")


@pytest.mark.parametrize(
    ("text", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
async def test_config_check_and_serve_give_the_same_verdict(
    text: str, expected: str | None, tmp_path: Path, fakes
) -> None:
    path = tmp_path / "opsloop.yaml"
    path.write_text(text)
    served = await serve_verdict(path, tmp_path, fakes)
    checked = check_verdict(path, tmp_path)
    assert checked == served
    if expected is VALID:
        assert served is None
    else:
        assert served is not None and expected in served and "\n" not in served
