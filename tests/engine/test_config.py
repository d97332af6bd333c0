from __future__ import annotations

import pytest

from engine.config import load_settings
from engine.errors import ConfigError


def test_defaults_need_no_environment():
    s = load_settings({})
    assert s.database_url == "sqlite:///opsloop.db"
    assert s.approvers.approvers == frozenset() and not s.approvers.allow_self
    assert s.runner.max_rejections == 3


def test_approvers_and_self_approval_are_parsed():
    s = load_settings(
        {"OPSLOOP_APPROVERS": " U012AB, S0ONCALL ,W99ZZ", "OPSLOOP_ALLOW_SELF_APPROVAL": "true"}
    )
    assert s.approvers.approvers == {"U012AB", "S0ONCALL", "W99ZZ"}
    assert s.approvers.groups == {"S0ONCALL"}
    assert s.approvers.allow_self


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
