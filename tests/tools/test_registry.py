"""The registry a serving process changes while runners and listeners read it."""

from __future__ import annotations

from pydantic import BaseModel

from tools import Tool, ToolRegistry


class NoArgs(BaseModel):
    pass


def made(name: str, source: str) -> Tool:
    async def func(args: NoArgs, ctx: object) -> None:  # pragma: no cover - never run
        return None

    return Tool(name, "d", "run_now", NoArgs, func, source=source, source_name=name)


def test_a_source_s_tools_are_replaced_in_one_swap_and_counted():
    registry = ToolRegistry()
    kept = registry.register(made("search_docs", "module:tools.builtin"))
    a, b = made("mcp__s__a", "mcp:s"), made("mcp__s__b", "mcp:s")
    registry.replace_source("mcp:s", [a, b])
    before, held = registry.version, registry.all()  # what a reader took
    b2, c = made("mcp__s__b", "mcp:s"), made("mcp__s__c", "mcp:s")
    assert registry.replace_source("mcp:s", [b2, c]) == []
    assert registry.version == before + 1
    assert registry.names() == [
        "mcp__s__b",
        "mcp__s__c",
        "search_docs",
    ]
    assert registry.get("mcp__s__a") is None and registry.get("mcp__s__b") is b2
    assert held == [a, b, kept]  # the reader's list is the one it took
    registry.replace_source("mcp:s", [b2, c])
    assert registry.version == before + 1  # nothing changed, nothing to look at again


def test_a_name_another_source_holds_stays_theirs():
    registry = ToolRegistry()
    theirs = registry.register(made("mcp__a__b__c", "mcp:a"))
    mine = made("mcp__a__b__c", "mcp:a__b")
    [(refused, why)] = registry.replace_source("mcp:a__b", [mine])
    assert refused is mine and registry.get("mcp__a__b__c") is theirs
    assert why == (
        "duplicate tool name 'mcp__a__b__c': already registered by mcp:a (its tool "
        "'mcp__a__b__c'), now again by mcp:a__b (its tool 'mcp__a__b__c')"
    )
