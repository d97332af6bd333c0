"""`.env.example` lists every setting the code reads, and nothing it does not."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Named in the code but not settings: the crash tests' fault injection, the test suite's
# validation of every copy the reducer makes (engine/frozen.py), and the values
# local mode fills into its own opsloop.yaml (localslack/demo.py), which nobody sets.
NOT_SETTINGS = {
    "OPSLOOP_FAULTS",
    "OPSLOOP_STRICT_COPIES",
    "OPSLOOP_LOCAL_PYTHON",
    "OPSLOOP_LOCAL_CATALOG",
    "OPSLOOP_LOCAL_URL",
    "OPSLOOP_LOCAL_HOST",
    # local mode's own GitHub, PagerDuty and alert credentials (localslack/integrations.py)
    "OPSLOOP_LOCAL_ALERT_SECRET",
    "OPSLOOP_LOCAL_GITHUB_TOKEN",
    "OPSLOOP_LOCAL_GITHUB_WEBHOOK_SECRET",
    "OPSLOOP_LOCAL_PAGERDUTY_FROM",
    "OPSLOOP_LOCAL_PAGERDUTY_TOKEN",
}
_NAME = re.compile(r'"((?:OPSLOOP|SLACK|ANTHROPIC)_[A-Z_]+|DATABASE_URL|PORT)"')


def _read_by_code() -> set[str]:
    names: set[str] = set()
    for package in ("bot", "engine", "localslack", "tools"):
        for path in (ROOT / package).rglob("*.py"):
            names.update(_NAME.findall(path.read_text(encoding="utf-8")))
    return names - NOT_SETTINGS


def _in_example() -> set[str]:
    text = (ROOT / ".env.example").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Z_]+)=", text, flags=re.MULTILINE))


def test_env_example_names_every_setting_the_code_reads() -> None:
    missing = _read_by_code() - _in_example()
    assert not missing, f"add to .env.example: {sorted(missing)}"


def test_env_example_names_nothing_the_code_ignores() -> None:
    unknown = _in_example() - _read_by_code()
    assert not unknown, f"not read anywhere: {sorted(unknown)}"


def test_readme_does_not_claim_no_tools_load_by_default() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `OPSLOOP_TOOLS`"))
    assert "none" not in row and "tools.builtin" in row


def test_docker_image_ships_the_runbook_for_search_docs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^COPY docs/\*\.md \./docs/$", dockerfile, flags=re.MULTILINE)
    assert list((ROOT / "docs").glob("*.md")), "docs/ holds no Markdown to ship"


def test_readme_says_what_the_model_receives() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "**What Anthropic receives.**" in readme
    assert ".venv/bin/opsloop" in readme


def test_readme_shows_the_shipped_opsloop_yaml_example() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = (ROOT / "opsloop.example.yaml").read_text(encoding="utf-8").rstrip()
    assert f"```yaml\n{example}\n```" in readme


def test_readme_names_the_cli_commands_of_the_configuration() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in ("opsloop tools", "opsloop policy check", "opsloop config check"):
        assert command in readme


def test_the_editable_install_is_a_plain_path_entry_without_a_warning() -> None:
    """setuptools picks a .pth entry (no "folders with the same name as your package"
    warning) only for a declared root package dir with a simple layout."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"": "."}
    assert setuptools["packages"]["find"]["namespaces"] is False
    for package in ("bot", "engine", "localslack", "tools"):
        assert (ROOT / package / "__init__.py").is_file()
