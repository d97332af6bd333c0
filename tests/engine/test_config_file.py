"""opsloop.yaml: the model of the file, its one-line errors, ${VAR}, hosts, the hash."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.config import load_settings
from engine.config_file import (
    LATER_RULE_KEYS,
    ConfigFile,
    load_config_file,
    parse_config,
    parse_duration,
)
from engine.errors import ConfigError
from tools.http_config import placeholders

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "opsloop.example.yaml"
SECRETS = {"GRAFANA_TOKEN": "graf-s3cret", "PLATFORM_TOKEN": "plat-s3cret"}


def example() -> ConfigFile:
    cfg = load_config_file(str(EXAMPLE), SECRETS)
    assert cfg is not None
    return cfg


def error_of(text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(text, env or {})
    message = str(err.value)
    assert "\n" not in message
    return message


# --- the DESIGN example -------------------------------------------------------------------


def test_the_example_is_the_design_example_minus_the_keys_this_release_refuses():
    # DESIGN's example also shows rule keys no code acts on yet (LATER_RULE_KEYS: the
    # loader refuses them as "not supported by this release"). The shipped example shows
    # only what works: DESIGN's lines, less those keys, and nothing else changed.
    places = [ROOT / "DESIGN.md", ROOT / "docs" / "DESIGN.md", Path("/work/shared/DESIGN.md")]
    design = next((p for p in places if p.exists()), None)
    if design is None:
        pytest.skip("DESIGN.md is not beside the checkout")
    block = re.search(r"## The configuration file.*?```yaml\n(.*?)```", design.read_text(), re.S)
    assert block is not None
    later = re.compile(rf"^\s+(?:{'|'.join(LATER_RULE_KEYS)}):")
    supported = [line for line in block.group(1).splitlines(True) if not later.match(line)]
    assert len(supported) == len(block.group(1).splitlines()) - len(LATER_RULE_KEYS)
    assert EXAMPLE.read_text() == "".join(supported)


def test_the_example_loads_every_section():
    cfg = example()
    assert cfg.tools.modules == ["tools.builtin", "acme_tools.deploy"]
    grafana, kube = cfg.tools.mcp["grafana"], cfg.tools.mcp["kube"]
    assert grafana.url == "https://mcp-grafana.internal/mcp" and grafana.command is None
    assert grafana.plain_headers() == {"Authorization": "Bearer graf-s3cret"}
    assert kube.command == "kubernetes-mcp-server" and kube.args == ["--read-only"]
    assert kube.plain_env() == {"KUBECONFIG": "/etc/opsloop/kubeconfig"}
    assert kube.tools == ["pods_list", "pods_log", "resources_get"]
    action = cfg.tools.http["restart_service"]
    assert (action.method, action.idempotency_header, action.idempotent) == (
        "POST",
        "Idempotency-Key",
        True,
    )
    assert action.plain_headers() == {"Authorization": "Bearer plat-s3cret"}
    assert action.arguments["required"] == ["service"]
    assert cfg.approvals.approvers == ["S0SRE"] and cfg.approvals.expires_in == 86400.0
    deploy = cfg.policy[2]
    assert (deploy.tool, deploy.policy, deploy.quorum) == ("deploy", "approve_before_run", 2)
    assert deploy.expires_in == 7200.0 and cfg.policy[3].channels == ["C0OPS"]
    assert (deploy.max_grant, cfg.policy[3].max_grant) == (None, 3600.0)  # grants: opt-in
    assert cfg.policy[1].reason == "Deleting resources is not allowed from chat."


def test_secrets_never_show_in_repr_or_str():
    cfg = parse_config(
        """
tools:
  http_allow_hosts: [api.example]
  mcp:
    s: {command: srv, args: ["--token=${T}"], env: {TOKEN: "${T}"}}
  http:
    a:
      description: d
      url: https://api.example/x
      headers: {Authorization: "Bearer ${T}"}
      body: {key: "${T}"}
""",
        {"T": "top-s3cret"},
    )
    for text in (repr(cfg), str(cfg), repr(cfg.tools.mcp["s"]), str(cfg.tools.http["a"])):
        assert "top-s3cret" not in text
    assert cfg.tools.mcp["s"].plain_env() == {"TOKEN": "top-s3cret"}
    assert cfg.tools.http["a"].body == {"key": "top-s3cret"}


# --- errors: one line, the file, the key ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "policy: [{tool: a, policy: run_now}, {tool: b, policy: run_now},"
            " {tool: c, policy: approve_before_run, quorum: 0}]",
            "opsloop.yaml: policy[2].quorum (rule 3): must be at least 1",
        ),
        (
            "tools: {mcp: {kube: {url: 'https://k', command: k}}}",
            "opsloop.yaml: tools.mcp.kube: give either url or command, not both",
        ),
        (
            "tools: {mcp: {kube: {args: [x]}}}",
            "opsloop.yaml: tools.mcp.kube: give url (streamable HTTP) or command (stdio)",
        ),
        (
            "tools: {mcp: {kube: {command: k, headers: {A: b}}}}",
            "opsloop.yaml: tools.mcp.kube: headers go with url, not command",
        ),
        (
            "tools: {mcp: {kube: {url: 'https://k', env: {A: b}}}}",
            "opsloop.yaml: tools.mcp.kube: args and env go with command, not url",
        ),
        (
            "tools: {mcp: {kube: {url: 'file:///x'}}}",
            "opsloop.yaml: tools.mcp.kube.url: must be an http or https URL, not 'file:///x'",
        ),
        (
            "tools: {mcp: {'my server': {command: k}}}",
            "opsloop.yaml: tools.mcp.my server: a server name is 1-40 letters, digits, _ or -"
            " (its tools are named mcp__<server>__<tool>, at most 64 characters)",
        ),
        (
            "integrations: {github: {repos: [acme/api]}}",
            "opsloop.yaml: integrations.github.token: is required"
            " (or app_id, private_key and installation_id)",
        ),
        (
            "integrations: {github: {token: t, repos: [acme]}}",
            "opsloop.yaml: integrations.github.repos[0]: 'acme' is not a repository:"
            " use owner/name",
        ),
        (
            "integrations: {github: {token: t, app_id: 1, repos: [a/b]}}",
            "opsloop.yaml: integrations.github.token: give a token or a GitHub App, not both",
        ),
        (
            "integrations: {pagerduty: {token: t, api_url: 'ftp://x'}}",
            "opsloop.yaml: integrations.pagerduty.api_url: 'ftp://x' is not an http(s) URL",
        ),
        (
            "alerts: {pagerduty: {channel: C0ALERTS}}",
            "opsloop.yaml: alerts.pagerduty: needs integrations.pagerduty.webhook_secret"
            " to verify what PagerDuty sends",
        ),
        ("alerts: {generic: {channel: C0OPS}}", "opsloop.yaml: alerts.generic.secret: is required"),
        (
            "alerts: {generic: {channel: ops, secret: s}}",
            "opsloop.yaml: alerts.generic.channel: 'ops' is not a channel id (C…, G… or D…)",
        ),
        ("polcy: []", "opsloop.yaml: polcy: is not a known key"),
        (
            "policy: [{tool: a, policy: run_now, approver: [U1A]}]",
            "opsloop.yaml: policy[0].approver (rule 1): is not a known key",
        ),
        ("policy: [{tool: a}]", "opsloop.yaml: policy[0].policy (rule 1): is required"),
        ("policy: [{policy: run_now}]", "opsloop.yaml: policy[0].tool (rule 1): is required"),
        (
            "policy: [{tool: a, policy: allow}]",
            "opsloop.yaml: policy[0].policy (rule 1):"
            " must be one of 'run_now', 'approve_before_run',"
            " 'wait_for_external_event' or 'reject', not 'allow'",
        ),
        (
            "policy: [{tool: a, policy: run_now, quorum: '2'}]",
            "opsloop.yaml: policy[0].quorum (rule 1): must be a whole number, not '2'",
        ),
        (
            "approvals: {allow_self: 'sure'}",
            "opsloop.yaml: approvals.allow_self: must be true or false, not 'sure'",
        ),
        ("policy: {tool: a}", "opsloop.yaml: policy: must be a list"),
        ("tools: [a]", "opsloop.yaml: tools: must be a mapping"),
        (
            "tools: {modules: [1]}",
            "opsloop.yaml: tools.modules[0]: must be a string, not 1",
        ),
        (
            "approvals: {expires_in: 24}",
            "opsloop.yaml: approvals.expires_in: must be a duration such as 30s, 10m, 2h or"
            " 1d, not 24",
        ),
        (
            "policy: [{tool: a, policy: approve_before_run, expires_in: 1 hour}]",
            "opsloop.yaml: policy[0].expires_in (rule 1): must be a duration such as 30s, 10m, 2h"
            " or 1d, not '1 hour'",
        ),
        (
            "policy: [{tool: a, policy: run_now, approvers: [bob]}]",
            "opsloop.yaml: policy[0].approvers[0] (rule 1): 'bob' is not an approver: use user ids"
            " (U…, W…), user-group ids (S…) or oncall:<schedule or escalation policy id>",
        ),
        (
            "policy: [{tool: a, policy: run_now, approvers: ['oncall:']}]",
            "opsloop.yaml: policy[0].approvers[0] (rule 1): 'oncall:' is not an approver: use user"
            " ids (U…, W…), user-group ids (S…) or oncall:<schedule or escalation policy id>",
        ),
        (
            "policy: [{tool: a, policy: run_now, channels: [ops]}]",
            "opsloop.yaml: policy[0].channels[0] (rule 1):"
            " 'ops' is not a channel id (C…, G… or D…)",
        ),
        (
            "policy: [{tool: a, policy: approve_before_run, escalate_to: [D0DM1]}]",
            "opsloop.yaml: policy[0].escalate_to[0] (rule 1):"
            " 'D0DM1' is not someone to escalate to:"
            " use user ids (U…, W…), user-group ids (S…), oncall:<schedule or escalation"
            " policy id> or a channel id (C…)",
        ),
        (
            "policy: [{tool: a, policy: approve_before_run, escalate_to: [C0A1, U0B2, C0C3]}]",
            "opsloop.yaml: policy[0].escalate_to (rule 1): may name one channel, not several",
        ),
        (
            "policy: [{tool: a, policy: approve_before_run, expires_in: 30m, remind_after: 1h}]",
            "opsloop.yaml: policy[0].remind_after (rule 1):"
            " must be shorter than expires_in: it would"
            " never come",
        ),
        (
            "approvals: {expires_in: 1h}\npolicy: [{tool: a, policy: run_now},"
            " {tool: b, policy: approve_before_run, remind_after: 1h}]",
            "opsloop.yaml: policy[1].remind_after (rule 2):"
            " must be shorter than approvals.expires_in:"
            " it would never come",
        ),
        (
            "policy: [{tool: a, policy: approve_before_run, remind_after: 0s}]",
            "opsloop.yaml: policy[0].remind_after (rule 1):"
            " must be a duration such as 30s, 10m, 2h or"
            " 1d, not '0s'",
        ),
        (
            "policy: [{tool: a, policy: approve_before_run, approvers: [U1A, U1A], quorum: 2}]",
            "opsloop.yaml: policy[0].quorum (rule 1): is 2 but only 1 approvers are listed",
        ),
        (
            "policy: [{tool: ' ', policy: run_now}]",
            "opsloop.yaml: policy[0].tool (rule 1):"
            " must be a tool name or a glob such as mcp__grafana__*",
        ),
        (
            "policy: [{tool: a, policy: run_now, when: {type: 5}}]",
            "opsloop.yaml: policy[0].when (rule 1):"
            " is not a valid JSON Schema: 5 is not valid under"
            " any of the given schemas",
        ),
        (
            "policy: [{tool: a, policy: run_now, when: {$ref: 'https://x/s.json'}}]",
            "opsloop.yaml: policy[0].when (rule 1):"
            " $ref 'https://x/s.json' points outside the schema;"
            " only #/… refs are read",
        ),
        (
            "policy: [{tool: a, policy: run_now, when: true}]",
            "opsloop.yaml: policy[0].when (rule 1): must be a mapping",
        ),
        ("- a\n- b\n", "opsloop.yaml: must be a mapping (tools:, approvals:, policy:)"),
        (
            "policy:\n  - tool: a\n    policy: run_now\npolicy: []\n",
            "opsloop.yaml: line 4, column 1: key 'policy' is given twice",
        ),
        (
            "tools:\n  modules: [a\n",
            "opsloop.yaml: line 3, column 1: expected ',' or ']', but got '<stream end>'",
        ),
        (
            "tools: {a: b: c}",
            "opsloop.yaml: line 1, column 13: expected ',' or '}', but got ':'",
        ),
        (
            "tools:\n  modules: a: b\n",
            "opsloop.yaml: line 2, column 13: mapping values are not allowed here",
        ),
    ],
)
def test_each_problem_is_one_line_naming_the_file_and_key(text, expected):
    assert error_of(text) == expected


def test_an_error_names_the_file_it_read(tmp_path):
    path = tmp_path / "prod.yaml"
    path.write_text("approvals: {expires_in: soon}\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: approvals\.expires_in: "):
        load_config_file(str(path), {})


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "tools: {}\napprovals: {}\npolicy: []\n"])
def test_an_empty_file_is_the_environment_alone(text):
    cfg = parse_config(text, {})
    assert cfg == ConfigFile() and cfg.env_values() == {}


# --- durations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("10m", 600.0), ("2h", 7200.0), ("1d", 86400.0)]
)
def test_durations_are_seconds(text, seconds):
    assert parse_duration(text) == seconds
    cfg = parse_config(f"policy: [{{tool: a, policy: approve_before_run, expires_in: {text}}}]", {})
    assert cfg.policy[0].expires_in == seconds


@pytest.mark.parametrize("bad", ["30", 30, "0s", "1.5h", "1w", "2 h", "h", "-1m", "1H", None, ""])
def test_anything_else_is_not_a_duration(bad):
    with pytest.raises(ValueError, match="must be a duration such as 30s"):
        parse_duration(bad)


# --- ${VAR} -----------------------------------------------------------------------------------


def test_variables_are_replaced_in_every_string_value():
    cfg = parse_config(
        "tools: {modules: ['${PKG}.tools', x]}\npolicy: [{tool: '${T}*', policy: reject,"
        " reason: 'ask ${WHO} ${WHO}'}]",
        {"PKG": "acme", "T": "kube", "WHO": "sre"},
    )
    assert cfg.tools.modules == ["acme.tools", "x"]
    assert (cfg.policy[0].tool, cfg.policy[0].reason) == ("kube*", "ask sre sre")


def test_a_double_dollar_escapes_a_literal():
    cfg = parse_config("policy: [{tool: a, policy: reject, reason: 'costs $5, $${HOME}'}]", {})
    assert cfg.policy[0].reason == "costs $5, ${HOME}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "tools:\n  mcp:\n    grafana:\n      url: https://g\n"
            '      headers: {Authorization: "Bearer ${GRAFANA_TOKEN}"}\n',
            "opsloop.yaml: tools.mcp.grafana.headers.Authorization: ${GRAFANA_TOKEN} is not set",
        ),
        (
            "policy: [{tool: a, policy: run_now}, {tool: '${EMPTY}', policy: run_now}]",
            "opsloop.yaml: policy[1].tool (rule 2): ${EMPTY} is not set",
        ),
        (
            "tools: {modules: ['${ bad }']}",
            "opsloop.yaml: tools.modules[0]: ${ must be followed by a variable name and }"
            " (write $${ for ${)",
        ),
    ],
)
def test_a_missing_variable_names_itself_and_the_key(text, expected):
    assert error_of(text, {"EMPTY": ""}) == expected


def test_an_error_quoting_a_substituted_value_shows_the_variable_instead():
    message = error_of(
        "tools: {http_allow_hosts: [h], http: {a: {description: d, url: 'https://h/',"
        " idempotency_header: '${KEY}'}}}",
        {"KEY": "sk live s3cret"},
    )
    assert "s3cret" not in message
    assert message.endswith("idempotency_header: '${KEY}' is not a header name")


def test_a_value_cannot_inject_yaml():
    sneaky = "x\npolicy: [{tool: '*', policy: run_now}]"
    cfg = parse_config("tools: {modules: ['${M}']}", {"M": sneaky})
    assert cfg.tools.modules == [sneaky] and cfg.policy == []


# --- tools --------------------------------------------------------------------------------


def test_http_actions_need_listed_hosts():
    text = "tools:\n  http:\n    ping:\n      description: Ping.\n      url: {url}\n{hosts}"
    assert error_of(text.format(url="https://evil.example/x", hosts="")) == (
        "opsloop.yaml: tools.http.ping.url: host 'evil.example' is not in tools.http_allow_hosts"
    )
    ok = text.format(url="https://api.example:8443/x", hosts="  http_allow_hosts: [api.example]")
    assert parse_config(ok, {}).tools.http["ping"].url == "https://api.example:8443/x"
    port = text.format(url="https://api.example/x", hosts="  http_allow_hosts: [api.example:8443]")
    assert "host 'api.example' is not in" in error_of(port)
    # An IP is one address however it is spelt (serve once refused this, check allowed it).
    v6 = text.format(
        url="'http://[::1]:8080/ping'", hosts="  http_allow_hosts: ['0:0:0:0:0:0:0:1']"
    )
    assert parse_config(v6, {}).tools.http["ping"].url == "http://[::1]:8080/ping"


@pytest.mark.parametrize(("length", "ok"), [(1, True), (40, True), (41, False), (56, False)])
def test_mcp_server_names_leave_room_for_a_tool_name(length, ok):
    # mcp__<server>__<tool> must fit Anthropic's 64 characters: 40 leaves a long tool name
    # 8 characters of its own before its hash suffix (issue 16 §11: 41-56 passed the
    # check, then failed at startup).
    name = "s" * length
    text = f"tools: {{mcp: {{{name}: {{command: srv}}}}}}"
    if ok:
        assert name in parse_config(text, {}).tools.mcp
    else:
        assert error_of(text).startswith(f"opsloop.yaml: tools.mcp.{name}: a server name is 1-40")


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a", True),
        ("Restart_svc-2", True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("a.b", False),
        ("a b", False),
        ("request_clarification", False),
    ],
)
def test_http_action_names_make_tool_names(name, ok):
    text = f"tools: {{http_allow_hosts: [h], http: {{'{name}': {{description: d, url: 'https://h/'}}}}}}"
    if ok:
        assert name in parse_config(text, {}).tools.http
    elif name == "request_clarification":
        assert error_of(text) == (
            f"opsloop.yaml: tools.http.{name}: {name!r} is the name of the engine's own"
            " control tool"
        )
    else:
        assert error_of(text) == (
            f"opsloop.yaml: tools.http.{name}: an action name is 1-64 letters, digits, _ or -"
        )


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (
            "{description: d, url: 'https://h/{svc}'}",
            "tools.http.a.url: {svc} is not one of the arguments",
        ),
        (
            "{description: d, url: 'https://h/{svc}', arguments: {type: object,"
            " properties: {svc: {type: string}}}}",
            "tools.http.a.url: {svc} must be a required argument (an optional one may be missing)",
        ),
        (
            "{description: d, url: 'https://h/x?v={svc}', arguments: {type: object,"
            " properties: {svc: {type: string}}}}",
            "tools.http.a.url: {svc} must be a required argument",
        ),
        (
            "{description: d, url: 'https://{svc}.h/', arguments: {type: object,"
            " properties: {svc: {type: string}}, required: [svc]}}",
            "tools.http.a.url: placeholders may appear only in the url's path and query",
        ),
        ("{description: d, url: 'https://u:p@h/'}", "tools.http.a.url: must not hold credentials"),
        ("{description: d, url: 'https://h/#x'}", "tools.http.a.url: must not have a #fragment"),
        ("{description: d, url: 'https://h/a/../b'}", "tools.http.a.url: its path must not have"),
        ("{description: d, url: 'ftp://h/'}", "tools.http.a.url: must be an absolute http://"),
        (
            "{description: d, url: 'https://h:99999/'}",
            "tools.http.a.url: 'https://h:99999/' is not",
        ),
        ("{description: d, url: 'https://h/a b'}", "tools.http.a.url: must not hold spaces"),
        (
            "{description: d, url: 'https://h/', headers: {'X Y': z}}",
            "tools.http.a.headers.X Y: 'X Y' is not a header name",
        ),
        ("{description: ' ', url: 'https://h/'}", "tools.http.a.description: must say what"),
        ("{url: 'https://h/'}", "tools.http.a.description: is required"),
        (
            "{description: d, url: 'https://h/', method: FETCH}",
            "tools.http.a.method: must be one of",
        ),
        (
            "{description: d, url: 'https://h/', timeout: 10}",
            "tools.http.a.timeout: must be a duration",
        ),
        (
            "{description: d, url: 'https://h/', arguments: {type: array}}",
            "tools.http.a.arguments: must be a JSON Schema of type: object",
        ),
        (
            "{description: d, url: 'https://h/', arguments: {type: object, required: 5}}",
            "tools.http.a.arguments: is not a valid JSON Schema",
        ),
        (
            "{description: d, url: 'https://h/', idempotency_header: 'Idem Key'}",
            "tools.http.a.idempotency_header: 'Idem Key' is not a header name",
        ),
        (
            "{description: d, url: 'https://h/', retries: 3}",
            "tools.http.a.retries: is not a known key",
        ),
    ],
)
def test_http_action_problems(action, expected):
    message = error_of(f"tools: {{http_allow_hosts: [h], http: {{a: {action}}}}}")
    assert message.startswith(f"opsloop.yaml: {expected}")


def test_http_action_keys():
    cfg = parse_config(
        """
tools:
  http_allow_hosts: [h]
  http:
    a:
      description: Scale a service.
      method: put
      url: https://h/services/{service}/scale
      body: {replicas: "{count}"}
      timeout: 30s
      arguments:
        type: object
        properties: {service: {type: string}, count: {type: integer}}
        required: [service]
""",
        {},
    )
    action = cfg.tools.http["a"]
    assert (action.method, action.timeout, action.idempotent) == ("PUT", 30.0, False)
    assert placeholders(action.url) == ["service"] and action.body == {"replicas": "{count}"}


@pytest.mark.parametrize("entry", ["https://h", "h/x", "h:0", "h:port", "*.internal", "[::1", ""])
def test_allow_host_entries_are_hosts(entry):
    assert "is not a host: give a host name or IP" in error_of(
        f"tools: {{http_allow_hosts: ['{entry}']}}"
    )


# --- reading the file ---------------------------------------------------------------------


def test_no_file_means_the_environment_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config_file(None, {}) is None
    assert load_config_file(None, {"OPSLOOP_CONFIG": " "}) is None


def test_the_working_directory_file_is_read_when_present(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "opsloop.yaml").write_text("tools: {modules: [here]}\n")
    cfg = load_config_file(None, {})
    assert cfg is not None and cfg.modules == ("here",)


def test_opsloop_config_wins_over_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "opsloop.yaml").write_text("tools: {modules: [here]}\n")
    (tmp_path / "other.yaml").write_text("tools: {modules: [there]}\n")
    cfg = load_config_file(None, {"OPSLOOP_CONFIG": str(tmp_path / "other.yaml")})
    assert cfg is not None and cfg.modules == ("there",)


def test_a_named_file_that_is_missing_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gone = tmp_path / "gone.yaml"
    with pytest.raises(ConfigError, match=r"gone\.yaml: no such file \(named by OPSLOOP_CONFIG\)$"):
        load_config_file(None, {"OPSLOOP_CONFIG": str(gone)})
    with pytest.raises(ConfigError, match=r"gone\.yaml: no such file$"):
        load_config_file(str(gone), {})
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config_file(str(tmp_path), {})


# --- what the file gives the settings -----------------------------------------------------


def test_env_values_feed_load_settings_and_set_variables_win():
    cfg = example()
    assert cfg.env_values() == {
        "OPSLOOP_TOOLS": "tools.builtin,acme_tools.deploy",
        "OPSLOOP_APPROVERS": "S0SRE",
        "OPSLOOP_ALLOW_SELF_APPROVAL": "false",
        "OPSLOOP_APPROVAL_TTL_SECONDS": "86400.0",
    }
    from_file = load_settings({}, file=cfg.env_values())
    assert from_file.reviewers.approvers == {"S0SRE"} and from_file.runner.approval_ttl_s == 86400
    env = {"OPSLOOP_APPROVERS": "U0BOSS", "OPSLOOP_ALLOW_SELF_APPROVAL": "true"}
    both = load_settings(env, file=cfg.env_values())
    assert both.reviewers.approvers == {"U0BOSS"} and both.reviewers.allow_self


def test_env_values_hold_only_what_the_file_gives():
    cfg = parse_config("approvals: {allow_self: true}", {})
    assert cfg.env_values() == {"OPSLOOP_ALLOW_SELF_APPROVAL": "true"}
    assert parse_config("approvals: {approvers: []}", {}).env_values() == {"OPSLOOP_APPROVERS": ""}


def test_modules_are_the_union_of_the_file_and_opsloop_tools():
    cfg = example()
    assert cfg.modules_with({}) == ("tools.builtin", "acme_tools.deploy")
    assert cfg.modules_with({"OPSLOOP_TOOLS": " extra.tools, tools.builtin ,"}) == (
        "tools.builtin",
        "acme_tools.deploy",
        "extra.tools",
    )


# --- policy_hash ----------------------------------------------------------------------------------


def test_policy_hash_names_approvals_and_policy_only():
    base = "approvals: {expires_in: 1d}\npolicy: [{tool: a, policy: run_now}]\n"
    h = parse_config(base, {}).policy_hash
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert parse_config(base + "tools: {modules: [x]}\n", {}).policy_hash == h
    assert parse_config(base.replace("1d", "24h"), {}).policy_hash == h  # same meaning
    assert parse_config(base.replace("run_now", "reject"), {}).policy_hash != h
    assert parse_config(base.replace("1d", "2d"), {}).policy_hash != h
    reordered = "policy: [{policy: run_now, tool: a}]\napprovals: {expires_in: 1d}\n"
    assert parse_config(reordered, {}).policy_hash == h
    assert example().policy_hash == example().policy_hash


# --- hostile files (issue 21): every one is one line, found before any expansion ----------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BOMB, "anchors and aliases (&name, *name) are not supported"),
        ("unknown:\n  " + BOMB.replace("\n", "\n  "), "anchors and aliases"),
        ("a: &a [*a]\n", "anchors and aliases"),
        ("policy: " + "[" * 1000 + "]" * 1000, "is nested more than 64 levels deep"),
        ("x: " + "{a: " * 1000 + "1" + "}" * 1000, "is nested more than 64 levels deep"),
        (
            "policy: [{tool: a, policy: run_now, when: {$ref: '#'}}]",
            "opsloop.yaml: policy[0].when (rule 1): $ref '#' leads back to itself without end",
        ),
        (
            "policy: [{tool: a, policy: run_now, when: {properties: {x: {pattern: '(a)\\1'}}}}]",
            "opsloop.yaml: policy[0].when (rule 1):"
            " pattern '(a)\\\\1' cannot be run by the linear-time"
            " regex engine",
        ),
        (
            "policy: [{tool: a, policy: approve_before_run, expires_in: 99999999999999d}]",
            "opsloop.yaml: policy[0].expires_in (rule 1): must be at most a year (365d), not"
            " '99999999999999d'",
        ),
        (
            "approvals: {expires_in: 366d}",
            "opsloop.yaml: approvals.expires_in: must be at most a year (365d), not '366d'",
        ),
        (
            "policy: [{tool: a, policy: approve_before_run, quorum: 51}]",
            "opsloop.yaml: policy[0].quorum (rule 1): must be at most 50",
        ),
        (
            "approvals: {approvers: [U1AA, U2BB]}\n"
            "policy: [{tool: a, policy: approve_before_run, quorum: 3}]",
            "opsloop.yaml: policy[0].quorum (rule 1):"
            " is 3 but approvals.approvers lists only 2 approvers",
        ),
        (
            "tools:\n  http_allow_hosts: [h]\n  http:\n    x:\n      description: d\n"
            "      url: http://h/\n      arguments: {type: object, properties: "
            "{a: {$ref: 'file:///etc/passwd'}}}\n",
            "opsloop.yaml: tools.http.x.arguments: $ref 'file:///etc/passwd' points outside",
        ),
    ],
)
def test_hostile_files_are_one_line(text: str, expected: str) -> None:
    assert expected in error_of(text)


def test_a_group_or_on_call_approver_list_may_take_any_quorum() -> None:
    parse_config(
        "approvals: {approvers: [S0SRE]}\npolicy: [{tool: a, policy: approve_before_run,"
        " quorum: 3}]",
        {},
    )


def test_a_year_is_the_longest_duration() -> None:
    assert parse_config("approvals: {expires_in: 365d}", {}).approvals.expires_in == 365 * 86400


def test_too_many_rules_or_too_large_a_file_is_one_line() -> None:
    rules = "policy:\n" + "  - {tool: a, policy: run_now}\n" * 1001
    assert error_of(rules) == "opsloop.yaml: policy: may hold at most 1000 entries"
    assert error_of("# x\n" * 300_000) == "opsloop.yaml: is over 1024 KiB; opsloop reads no more"
