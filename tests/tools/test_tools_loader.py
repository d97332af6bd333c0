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
