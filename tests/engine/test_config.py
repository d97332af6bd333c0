from __future__ import annotations

import pytest

from engine.config import HttpSettings, load_settings
from engine.errors import ConfigError


def test_defaults_need_no_environment():
    s = load_settings({})
    assert s.database_url == "sqlite:///opsloop.db"
    assert s.reviewers.approvers == frozenset() and not s.reviewers.allow_self
    assert s.runner.max_rejections == 3


def test_approvers_and_self_approval_are_parsed():
    s = load_settings(
        {"OPSLOOP_APPROVERS": " U012AB, S0ONCALL ,W99ZZ", "OPSLOOP_ALLOW_SELF_APPROVAL": "true"}
    )
    assert s.reviewers.approvers == {"U012AB", "S0ONCALL", "W99ZZ"}
    assert s.reviewers.groups == {"S0ONCALL"}
    assert s.reviewers.allow_self


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"OPSLOOP_APPROVERS": "bob"}, "OPSLOOP_APPROVERS"),
        ({"OPSLOOP_ALLOW_SELF_APPROVAL": "maybe"}, "OPSLOOP_ALLOW_SELF_APPROVAL"),
        ({"DATABASE_URL": "mysql://x/y"}, "'mysql'"),
        ({"OPSLOOP_MAX_REJECTIONS": "lots"}, "OPSLOOP_MAX_REJECTIONS"),
        ({"OPSLOOP_LEASE_SECONDS": "0"}, "OPSLOOP_LEASE_SECONDS"),
    ],
)
def test_bad_settings_are_one_line_errors_naming_the_variable(env, needle):
    with pytest.raises(ConfigError) as err:
        load_settings(env)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_every_variable_lands_in_one_settings_object():
    s = load_settings(
        {
            "SLACK_BOT_TOKEN": "xoxb-1",
            "SLACK_SIGNING_SECRET": "sig",
            "SLACK_APP_TOKEN": "xapp-1",
            "SLACK_API_URL": "http://127.0.0.1:9/api/",
            "OPSLOOP_WEBHOOK_SECRET": "hook",
            "ANTHROPIC_API_KEY": "sk-ant",
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:8/",
            "OPSLOOP_MODEL": "claude-x",
            "OPSLOOP_MAX_TOKENS": "100",
            "OPSLOOP_MODEL_TIMEOUT_SECONDS": "5",
            "OPSLOOP_TOOLS": " acme.deploy, tools.demo ,acme.deploy",
            "OPSLOOP_DOCS_DIR": "/runbooks",
            "OPSLOOP_HOST": "127.0.0.1",
            "PORT": "0",
            "OPSLOOP_SWEEP_SECONDS": "0.5",
        }
    )
    assert (s.slack.bot_token, s.slack.signing_secret, s.slack.app_token) == (
        "xoxb-1",
        "sig",
        "xapp-1",
    )
    assert s.slack.api_url == "http://127.0.0.1:9/api/" and s.slack.webhook_secret == "hook"
    assert (s.model.api_key, s.model.base_url, s.model.name) == (
        "sk-ant",
        "http://127.0.0.1:8/",
        "claude-x",
    )
    assert (s.model.max_tokens, s.model.timeout_s) == (100, 5.0)
    assert s.tool.modules == ("acme.deploy", "tools.demo") and s.tools == "acme.deploy,tools.demo"
    assert s.tool.docs_dir == "/runbooks"
    assert (s.host, s.port, s.sweep_seconds) == ("127.0.0.1", 0, 0.5)


def test_secrets_never_show_in_the_settings_repr():
    s = load_settings(
        {
            "SLACK_BOT_TOKEN": "xoxb-topsecret",
            "SLACK_SIGNING_SECRET": "sig-topsecret",
            "ANTHROPIC_API_KEY": "sk-topsecret",
            "OPSLOOP_WEBHOOK_SECRET": "hook-topsecret",
        }
    )
    assert "topsecret" not in repr(s)


def test_a_set_variable_wins_over_the_file_and_an_empty_one_does_not():
    s = load_settings(
        {"OPSLOOP_MAX_REJECTIONS": "7", "OPSLOOP_MODEL": ""},
        file={"OPSLOOP_MAX_REJECTIONS": "2", "OPSLOOP_MODEL": "claude-from-file"},
    )
    assert s.runner.max_rejections == 7
    assert s.model.name == "claude-from-file"


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"OPSLOOP_MAX_TOKENS": "1.5"}, "OPSLOOP_MAX_TOKENS must be a whole number, not '1.5'"),
        ({"PORT": "70000"}, "PORT must be at most 65535, not '70000'"),
        ({"OPSLOOP_SWEEP_SECONDS": "fast"}, "OPSLOOP_SWEEP_SECONDS must be a number, not 'fast'"),
    ],
)
def test_number_problems_read_as_a_sentence(env, line):
    with pytest.raises(ConfigError, match="^" + line.replace(".", r"\.") + "$"):
        load_settings(env)


def test_tool_modules_add_up_from_the_file_and_the_environment():
    s = load_settings({"OPSLOOP_TOOLS": "acme.deploy"}, file={"OPSLOOP_TOOLS": "tools.demo"})
    assert s.tool.modules == ("tools.demo", "acme.deploy")


def test_approvers_may_name_whoever_is_on_call():
    s = load_settings({"OPSLOOP_APPROVERS": "U012AB,oncall:PXXXXXX"})
    assert s.reviewers.approvers == {"U012AB", "oncall:PXXXXXX"}


def test_the_tools_databases_default_to_the_database_url() -> None:
    s = load_settings({"DATABASE_URL": "postgresql://u@h/db"})
    assert (s.tool.tickets_url, s.tool.demo_url) == ("postgresql://u@h/db",) * 2
    s = load_settings(
        {"OPSLOOP_TICKETS_URL": "sqlite:///t.db", "OPSLOOP_DEMO_URL": "sqlite:///d.db"}
    )
    assert (s.tool.tickets_url, s.tool.demo_url) == ("sqlite:///t.db", "sqlite:///d.db")


def test_the_metrics_port_is_unset_by_default_and_must_differ_from_port() -> None:
    assert load_settings({}).metrics_port is None  # /metrics stays beside /healthz
    assert load_settings({"OPSLOOP_METRICS_PORT": "9464"}).metrics_port == 9464
    with pytest.raises(ConfigError) as same:
        load_settings({"OPSLOOP_METRICS_PORT": "3000"})
    assert str(same.value) == "OPSLOOP_METRICS_PORT must differ from PORT, not 3000"
    with pytest.raises(ConfigError) as zero:
        load_settings({"OPSLOOP_METRICS_PORT": "0"})
    assert str(zero.value) == "OPSLOOP_METRICS_PORT must be at least 1, not '0'"


def test_the_http_time_limits_default_to_10s_and_are_settable() -> None:
    assert load_settings({}).http == HttpSettings(header_timeout_s=10.0, body_timeout_s=10.0)
    s = load_settings(
        {"OPSLOOP_HEADER_TIMEOUT_SECONDS": "1", "OPSLOOP_BODY_TIMEOUT_SECONDS": "2.5"}
    )
    assert s.http == HttpSettings(header_timeout_s=1.0, body_timeout_s=2.5)
    with pytest.raises(ConfigError) as zero:
        load_settings({"OPSLOOP_BODY_TIMEOUT_SECONDS": "0"})
    assert str(zero.value) == "OPSLOOP_BODY_TIMEOUT_SECONDS must be at least 0.1, not '0'"
