"""deploy/compose.yaml: its structure, checked without docker (not on CI machines)."""

from __future__ import annotations

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_postgres_a_migration_step_and_two_replicas_behind_one_port() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "migrate", "opsloop-1", "opsloop-2", "proxy"}
    assert services["migrate"]["command"] == ["opsloop", "migrate"]
    assert services["migrate"]["restart"] == "no"
    for name in ("opsloop-1", "opsloop-2"):
        replica = services[name]
        assert replica["command"] == ["opsloop", "serve"]
        assert replica["environment"]["DATABASE_URL"].startswith("postgresql://")
        assert "ports" not in replica  # reached through the proxy only
    assert services["proxy"]["ports"] == ["3000:3000"]
    upstreams = (DEPLOY / "nginx.conf").read_text()
    assert "server opsloop-1:3000" in upstreams and "server opsloop-2:3000" in upstreams
    mount = services["proxy"]["volumes"][0].split(":")[0]
    assert (DEPLOY / mount).resolve() == (DEPLOY / "nginx.conf").resolve()


def test_each_step_waits_for_the_one_before_it() -> None:
    services = _compose()["services"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("opsloop-1", "opsloop-2"):
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }
    assert services["proxy"]["depends_on"] == {
        "opsloop-1": {"condition": "service_healthy"},
        "opsloop-2": {"condition": "service_healthy"},
    }


def test_every_long_running_service_has_a_health_check() -> None:
    services = _compose()["services"]
    for name in ("postgres", "opsloop-1", "opsloop-2", "proxy"):
        check = services[name]["healthcheck"]
        assert check["test"][0] in ("CMD", "CMD-SHELL")
        assert {"interval", "timeout", "retries"} <= set(check)
    replica_check = " ".join(services["opsloop-1"]["healthcheck"]["test"])
    assert "127.0.0.1:3000/healthz" in replica_check
    assert "healthcheck" not in services["migrate"]  # a one-off step, judged by its exit


def test_metrics_stay_off_the_public_port() -> None:
    services = _compose()["services"]
    for name in ("opsloop-1", "opsloop-2"):
        metrics_port = services[name]["environment"]["OPSLOOP_METRICS_PORT"]
        assert metrics_port != services[name]["environment"]["PORT"]
        assert "ports" not in services[name] and "expose" not in services[name]
    assert services["proxy"]["ports"] == ["3000:3000"]
    conf = " ".join((DEPLOY / "nginx.conf").read_text().split())
    assert "location = /metrics { return 404; }" in conf
