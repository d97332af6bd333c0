"""load_tools: built-ins first, user modules next, one-line ToolLoadError on failure."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tools import REGISTRY, ToolLoadError, ToolRegistry, load_tools


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """Create pkg_<uuid>/tools_mod.py with ``body`` on sys.path; return its name."""
    pkg = f"pkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / pkg
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "tools_mod.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{pkg}.tools_mod"


GOOD = """
    from __future__ import annotations
    from pydantic import BaseModel
    from tools import ToolContext, ToolRegistry, tool

    REG = ToolRegistry()

    class EchoArgs(BaseModel):
        text: str

    @tool(registry=REG)
    async def echo(args: EchoArgs, ctx: ToolContext) -> str:
        \"\"\"Echo the text back.\"\"\"
        return args.text
"""


def test_loads_builtin_first_then_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _package(tmp_path, monkeypatch, GOOD)
    loaded = load_tools(f" {mod} , ,")
    assert loaded == ["tools.builtin", mod]
    assert sys.modules[mod].REG.names() == ["echo"]
    assert {"search_docs", "create_ticket"} <= set(REGISTRY.names())


def test_none_spec_loads_only_builtins() -> None:
    assert load_tools(None) == ["tools.builtin"]
    assert load_tools("") == ["tools.builtin"]


def test_given_registry_receives_loaded_tools() -> None:
    reg = ToolRegistry()
    load_tools(None, registry=reg)
    assert reg.get("search_docs") is REGISTRY.get("search_docs")
    assert reg.get("create_ticket").policy == "approve_before_run"


def test_missing_module_is_one_line_error() -> None:
    with pytest.raises(ToolLoadError) as info:
        load_tools("acme_missing_xyz.tools")
    msg = str(info.value)
    assert msg == (
        "cannot import tool module 'acme_missing_xyz.tools': "
        "ModuleNotFoundError: No module named 'acme_missing_xyz'"
    )
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert info.value.module == "acme_missing_xyz.tools"


def test_module_raising_at_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _package(tmp_path, monkeypatch, "raise RuntimeError('boom\\nsecond line')\n")
    with pytest.raises(ToolLoadError) as info:
        load_tools(mod)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg == f"cannot import tool module {mod!r}: RuntimeError: boom second line"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_module_with_syntax_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _package(tmp_path, monkeypatch, "def broken(:\n")
    with pytest.raises(ToolLoadError) as info:
        load_tools(mod)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"cannot import tool module {mod!r}: SyntaxError")


HOOKED = """
    from __future__ import annotations

    CONFIGURED = []
    CLOSED = []

    def configure(settings):
        CONFIGURED.append(settings.docs_dir)

    async def close():
        CLOSED.append(True)
        raise RuntimeError("a failing close does not stop the others")
"""


async def test_a_module_gets_its_settings_and_declares_its_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.config import load_settings
    from tools.builtin import docs, tickets
    from tools.loader import close_tools

    name = _package(tmp_path, monkeypatch, HOOKED)
    monkeypatch.setattr(tickets, "_url", tickets.DEFAULT_URL)  # both restored afterwards
    monkeypatch.setattr(docs, "_docs_dir", docs._docs_dir)
    settings = load_settings({"OPSLOOP_DOCS_DIR": "/srv/docs", "DATABASE_URL": "sqlite:///x.db"})
    assert load_tools([name], settings=settings.tool) == ["tools.builtin", name]
    module = sys.modules[name]
    assert module.CONFIGURED == ["/srv/docs"]
    assert tickets.tickets_url() == "sqlite:///x.db"  # the built-ins are configured too
    await tickets._engine_for(f"sqlite:///{tmp_path / 't.db'}")
    assert tickets._ENGINES._engines  # an engine is open ...
    await close_tools([name, "tools.builtin"])
    assert module.CLOSED == [True]
    assert tickets._ENGINES._engines == {}  # ... and closed by the built-ins' hook


def test_without_settings_configure_is_not_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _package(tmp_path, monkeypatch, HOOKED)
    load_tools(name)
    assert sys.modules[name].CONFIGURED == []


def test_a_failing_configure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.config import load_settings

    name = _package(tmp_path, monkeypatch, "def configure(settings):\n    raise ValueError('no')\n")
    with pytest.raises(ToolLoadError) as caught:
        load_tools(name, settings=load_settings({}).tool)
    assert name in str(caught.value) and "ValueError: no" in str(caught.value)
