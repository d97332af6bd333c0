"""What an MCP server lists, offered as the model API takes it (issue 16 §3, §6, §11):
tool names mapped to its alphabet, top-level unions flattened, what cannot be offered
left out with one line, never a stopped ``serve``. Real SDK servers
(tests/support/mcp_servers.py ``--odd-names``, ``--unions``)."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import pytest

from bot.configured import known_without_connecting
from bot.doctor import CheckWarning, check_mcp
from engine.config_file import parse_config
from tests.bot.test_cli import assert_one_line_error, run_cli
from tests.tools.test_mcp import SCRIPT, HttpServer, run, stdio
from tools import Tool, ToolDefinitionError, ToolRegistry
from tools.mcp import McpSource, current_definitions
from tools.mcp.config import McpServerConfig, registered_name
from tools.mcp.input_schema import COMBINATORS, Unfit, fit_for_the_model
from tools.schema_tool import schema_tool

pytestmark = pytest.mark.slow

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def accepted_by_the_model_api(tool: Tool) -> bool:
    """Anthropic's rules for a custom tool: the name's alphabet and length, an object
    input schema with no anyOf / oneOf / allOf at its top level."""
    schema = tool.input_schema()
    return (
        bool(NAME.match(tool.name))
        and schema.get("type") == "object"
        and not any(word in schema for word in COMBINATORS)
    )


async def opened(src: McpSource) -> dict[str, Tool]:
    """The tools by the server's own names."""
    return {t.source_name: t for t in await src.open()}


# --- names (§6, §11) -----------------------------------------------------------------


async def test_names_with_dots_and_slashes_are_mapped_and_called_by_their_own(caplog):
    src = McpSource("demo", stdio("--odd-names"))
    try:
        with caplog.at_level(logging.WARNING, logger="tools.mcp"):
            tools = await opened(src)
        assert all(accepted_by_the_model_api(t) for t in tools.values())
        read = tools["files/read"]
        assert read.name == "mcp__demo__files_read"
        assert await run(read, {"path": "/etc"}) == {"text": "files/read: {'path': '/etc'}"}
        # get.status maps onto get_status, which the server names so: get_status keeps
        # its name, get.status is left out; a.b and a/b map to one name: both left out.
        assert tools["get_status"].name == "mcp__demo__get_status"
        assert "get.status" not in tools and "a.b" not in tools and "a/b" not in tools
        both = "tools 'get.status' and 'get_status' both map to the name 'mcp__demo__get_status'"
        assert src.left_out == [
            f"'get.status': {both}",
            "'a.b': tools 'a.b' and 'a/b' both map to the name 'mcp__demo__a_b'",
            "'a/b': tools 'a.b' and 'a/b' both map to the name 'mcp__demo__a_b'",
        ]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 3 and all("\n" not in w for w in warnings)
        assert warnings[0] == f"mcp tool left out server=demo tool=get.status reason={both}"
        # The drift check sees the same names (no drift from the mapping itself).
        live = await current_definitions(src)
        assert {n: live[n] for n in (t.name for t in tools.values())} == {
            t.name: t.definition_hash for t in tools.values()
        }
    finally:
        await src.close()


def test_the_mapping_is_deterministic_and_cuts_long_names_with_a_hash():
    assert registered_name("kube", "pods.list") == "mcp__kube__pods_list"
    assert registered_name("kube", "a/b c:d") == "mcp__kube__a_b_c_d"
    long_a, long_b = "x" * 60 + "a", "x" * 60 + "b"
    cut_a, cut_b = registered_name("kube", long_a), registered_name("kube", long_b)
    assert len(cut_a) == len(cut_b) == 64 and cut_a != cut_b
    assert cut_a == registered_name("kube", long_a)  # the same every time


def test_a_name_two_servers_give_is_refused_naming_both_servers_and_tools():
    # mcp__a__b__c is server a's tool b__c and server a__b's tool c.
    def made(source: str, own: str) -> Tool:
        async def func(args, ctx):  # pragma: no cover - never run
            return None

        return schema_tool(
            name="mcp__a__b__c", description="d", schema={"type": "object"},
            func=func, source=source, source_name=own,
        )  # fmt: skip

    registry = ToolRegistry()
    registry.register(made("mcp:a", "b__c"))
    with pytest.raises(ToolDefinitionError) as caught:
        registry.register(made("mcp:a__b", "c"))
    assert str(caught.value) == (
        "duplicate tool name 'mcp__a__b__c': already registered by mcp:a (its tool 'b__c'), "
        "now again by mcp:a__b (its tool 'c')"
    )


def config_file(tmp_path: Path, key: str, *flags: str) -> None:
    args = ", ".join([SCRIPT, "stdio", *flags])
    (tmp_path / "opsloop.yaml").write_text(
        f"tools:\n  mcp:\n    {key}:\n      command: {sys.executable}\n      args: [{args}]\n"
    )


def test_opsloop_tools_shows_the_server_name_of_a_mapped_tool(tmp_path: Path):
    config_file(tmp_path, "demo", "--odd-names")
    proc = run_cli("tools", "--json", db=None, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    found = {r["name"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert found["mcp__demo__files_read"]["server_tool"] == "files/read"
    assert "server_tool" not in found["mcp__demo__echo"]  # not mapped
    table = run_cli("tools", db=None, cwd=tmp_path)
    row = next(r for r in table.stdout.splitlines() if r.startswith("mcp__demo__files_read "))
    assert row.split()[:3] == ["mcp__demo__files_read", "mcp:demo", "(files/read)"]


def test_a_server_key_over_40_characters_is_one_config_line_naming_it(tmp_path: Path):
    key = "s" * 41
    config_file(tmp_path, key)
    line = assert_one_line_error(run_cli("config", "check", db=None, cwd=tmp_path), key)
    assert f"tools.mcp.{key}: a server name is 1-40 letters" in line


# --- input schemas (§3) --------------------------------------------------------------


async def test_union_schemas_are_flattened_for_the_model_and_checked_as_sent(caplog):
    src = McpSource("demo", stdio("--unions"))
    try:
        with caplog.at_level(logging.WARNING, logger="tools.mcp"):
            tools = await opened(src)
        assert all(accepted_by_the_model_api(t) for t in tools.values())
        # A zod union of two objects: every property, required what both require.
        find = tools["find"]
        assert find.input_schema()["properties"] == {
            "id": {"type": "string"},
            "verbose": {"type": "boolean"},
            "query": {"type": "string"},
        }
        assert "required" not in find.input_schema()
        find.parse_arguments({"id": "7"})
        find.parse_arguments({"query": "q", "verbose": True})
        for refused in ({}, {"query": "q"}, {"id": "7", "query": "q"}):  # as the union says
            with pytest.raises(ValueError):
                find.parse_arguments(refused)
        assert await run(find, {"id": "7"}) == {"text": "find: {'id': '7'}"}
        # allOf: what each requires.
        assert tools["merged"].input_schema()["required"] == ["a", "b"]
        # A top-level oneOf of required lists: shown as the object, still checked.
        update = tools["update"]
        assert update.input_schema()["required"] == ["id"]
        update.parse_arguments({"id": "1"})
        with pytest.raises(ValueError):  # both branches hold: oneOf refuses it
            update.parse_arguments({"id": "1", "title": "t"})
        # A union with a string in it cannot be an object: left out, one line.
        assert "scalar" not in tools
        reason = "its top-level anyOf has a branch of type 'string', not only objects"
        assert src.left_out == [f"'scalar': {reason}"]
        [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warning == f"mcp tool left out server=demo tool=scalar reason={reason}"
    finally:
        await src.close()


async def test_doctor_warns_of_a_tool_left_out():
    with pytest.raises(CheckWarning) as caught:
        await check_mcp("demo", stdio("--unions", tools=["echo", "find", "scalar"]))
    assert str(caught.value) == (
        "reachable (stdio); 2 tools, definitions stable; left out (serve runs without them): "
        "'scalar': its top-level anyOf has a branch of type 'string', not only objects"
    )


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "array"}, "its input schema is of type 'array', not an object"),
        ({"oneOf": [{"$ref": "#/$defs/nope"}]}, "refers to '#/$defs/nope', which it does not"),
        ({"anyOf": [{"$ref": "https://x/s.json"}]}, "refers outside the schema"),
        ({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}},
         "nested too deep"),
    ],
)  # fmt: skip
def test_a_schema_that_cannot_be_an_object_is_unfit_in_one_line(schema, reason):
    with pytest.raises(Unfit, match=re.escape(reason)):
        fit_for_the_model(schema)


def test_a_union_of_referenced_objects_is_flattened_and_its_definitions_kept():
    def named(kind: str) -> dict:
        return {"type": "object", "properties": {"name": {"type": kind}}, "required": ["name"]}

    schema = {
        "oneOf": [{"$ref": "#/$defs/Pod"}, {"$ref": "#/$defs/Node"}],
        "$defs": {"Pod": named("string"), "Node": named("integer")},
    }
    assert fit_for_the_model(schema) == {
        "type": "object",
        "properties": {"name": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
        "required": ["name"],
        "$defs": schema["$defs"],
    }


def test_a_schema_without_a_union_is_shown_as_sent():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": []}
    assert fit_for_the_model(schema) == schema


def test_config_check_names_an_allowlisted_tool_as_it_will_be_registered():
    text = "tools: {mcp: {kube: {command: k, tools: [pods.list, pods_log]}}}"
    names, unknown = known_without_connecting(parse_config(text, {}))
    assert names == ["mcp__kube__pods_list", "mcp__kube__pods_log"] and unknown == []


# --- tools that require MCP tasks (§8) -------------------------------------------------


async def test_a_tool_that_requires_mcp_tasks_is_left_out_in_one_warning_line(caplog):
    # execution.taskSupport exists in the 2025-11-25 protocol (the handshake era) only.
    server = HttpServer(port=0, flags=("--legacy", "--tasks"))
    server.start()
    src = McpSource("demo", McpServerConfig(url=server.url))
    try:
        with caplog.at_level(logging.WARNING, logger="tools.mcp"):
            tools = await opened(src)
        assert "long_report" not in tools
        # taskSupport "optional": an ordinary call works, so it is offered.
        assert await run(tools["quick_report"], {}) == {"text": "quick_report: {}"}
        reason = (
            'its execution.taskSupport is "required" (it runs only as an MCP task), '
            "and tools that require MCP tasks are not offered yet"
        )
        assert src.left_out == [f"'long_report': {reason}"]
        [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warning == f"mcp tool left out server=demo tool=long_report reason={reason}"
    finally:
        await src.close()
        server.stop()
