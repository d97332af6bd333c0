"""The model of HTTP actions: allowed hosts (one reading, any IP spelling), the URL rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tools.http_config import METHODS, AllowedHost, AllowedHosts, HttpActionConfig, placeholders


@pytest.mark.parametrize(
    ("url", "hosts", "allowed"),
    [
        ("https://platform.internal/x", ["platform.internal"], True),
        ("https://PLATFORM.internal./x", ["platform.internal"], True),
        ("http://platform.internal:8080/x", ["platform.internal"], True),
        ("https://platform.internal/x", ["platform.internal:443"], True),
        ("https://platform.internal:8443/x", ["platform.internal:443"], False),
        ("http://platform.internal/x", ["platform.internal:80"], True),
        ("https://api.platform.internal/x", ["platform.internal"], False),
        ("https://platform.internal.evil.com/x", ["platform.internal"], False),
        ("https://platform.internal@evil.com/x", ["platform.internal"], False),
        ("https://evil.com\\@platform.internal/x", ["platform.internal"], False),
        ("https://evil.com#@platform.internal/x", ["platform.internal"], False),
        ("https://platform.internal /x", ["platform.internal"], False),
        ("ftp://platform.internal/x", ["platform.internal"], False),
        ("file:///etc/passwd", ["platform.internal"], False),
        ("https:///x", ["platform.internal"], False),
        ("https://platform.internal:99999/x", ["platform.internal"], False),
        ("http://10.0.0.5:9000/x", ["10.0.0.5"], True),
        ("http://10.0.0.6/x", ["10.0.0.5"], False),
        ("http://[::1]:8080/x", ["::1"], True),
        ("http://[0:0::1]:8080/x", ["[::1]:8080"], True),
        ("http://[::1]:8080/ping", ["0:0:0:0:0:0:0:1"], True),
        ("http://[0:0:0:0:0:0:0:1]/x", ["[::1]"], True),
        ("http://[::1]:8081/x", ["[::1]:8080"], False),
        ("https://platform.internal/x", [], False),
    ],
)
def test_allows(url, hosts, allowed):
    assert AllowedHosts.parse(hosts).allows(url) is allowed


def test_allowed_host_entries():
    assert AllowedHost.parse("Platform.Internal") == AllowedHost("platform.internal")
    assert AllowedHost.parse("10.0.0.5:8080") == AllowedHost("10.0.0.5", 8080)
    assert AllowedHost.parse("[::1]:8080") == AllowedHost("::1", 8080)
    assert AllowedHost.parse("::1") == AllowedHost("::1")
    assert AllowedHost.parse("0:0:0:0:0:0:0:1") == AllowedHost("::1")


@pytest.mark.parametrize(
    "entry", ["https://h", "h/x", "h:0", "h:port", "host:http", "*.internal", "[::1", ""]
)
def test_anything_else_is_not_an_allowed_host(entry):
    with pytest.raises(ValueError, match="is not a host: give a host name or IP"):
        AllowedHost.parse(entry)


def test_placeholders_and_methods():
    assert placeholders("https://h/{a}/x?b={b}&c={}") == ["a", "b"]
    assert METHODS == ("GET", "POST", "PUT", "PATCH", "DELETE")
    action = HttpActionConfig.model_validate(
        {"description": "d", "method": "get", "url": "https://h/"}
    )
    assert (action.method, action.timeout, action.idempotent) == ("GET", 30.0, False)


def test_a_url_placeholder_must_be_a_required_argument():
    optional = {"type": "object", "properties": {"svc": {"type": "string"}}}
    with pytest.raises(ValidationError, match="must be a required argument"):
        HttpActionConfig.model_validate(
            {"description": "d", "url": "https://h/{svc}", "arguments": optional}
        )
    required = {**optional, "required": ["svc"]}
    action = HttpActionConfig.model_validate(
        {"description": "d", "url": "https://h/{svc}", "arguments": required}
    )
    assert placeholders(action.url) == ["svc"]
