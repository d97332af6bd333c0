"""Contract of @tool, Tool and ToolRegistry (this module uses postponed annotations)."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field, ValidationError

import tools
from tools import (
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    WaitFor,
    tool,
)
from tools.errors import RetryableToolError, ToolDefinitionError

LOCAL = ToolRegistry()


class RefundArgs(BaseModel):
    order_id: str
    amount_cents: int = Field(gt=0)


class Nested(BaseModel):
    sku: str


class OrderArgs(BaseModel):
    items: list[Nested]
    mode: Literal["a", "b"] = "a"


@tool(policy="approve_before_run", registry=LOCAL)
async def refund_customer(args: RefundArgs, ctx: ToolContext) -> dict:
    """Refund a customer's order.

    Second paragraph.
    """
    return {"order": args.order_id, "key": ctx.idempotency_key, "attempt": ctx.attempt}


@tool(registry=LOCAL)
async def place_order(args: OrderArgs, ctx: ToolContext) -> int:
    """Place an order."""
    return len(args.items)


def make_ctx(key: str = "k1") -> ToolContext:
    return ToolContext(thread_id="t1", tool_call_id="c1", idempotency_key=key, attempt=1)


def test_public_api_exports() -> None:
    expected = {
        "tool",
        "Tool",
        "ToolContext",
        "ToolRegistry",
        "REGISTRY",
        "ToolError",
        "RetryableToolError",
        "WaitFor",
        "ToolLoadError",
        "load_tools",
        "Policy",
    }
    assert expected <= set(tools.__all__)
    assert all(hasattr(tools, n) for n in expected)
    assert isinstance(tools.REGISTRY, ToolRegistry)


def test_decorator_returns_registered_tool() -> None:
    assert isinstance(refund_customer, Tool)
    assert refund_customer.name == "refund_customer"
    assert refund_customer.policy == "approve_before_run"
    assert refund_customer.args_model is RefundArgs
    assert refund_customer.description == "Refund a customer's order.\n\nSecond paragraph."
    assert LOCAL.get("refund_customer") is refund_customer
    assert place_order.policy == "run_now"
    assert "refund_customer" not in tools.REGISTRY


def test_input_schema_shape() -> None:
    schema = refund_customer.input_schema()
    assert schema["type"] == "object"
    assert "title" not in schema
    assert set(schema["properties"]) == {"order_id", "amount_cents"}
    assert schema["required"] == ["order_id", "amount_cents"]
    nested = place_order.input_schema()
    assert "Nested" in nested["$defs"]
    assert nested["properties"]["items"]["items"] == {"$ref": "#/$defs/Nested"}
    assert nested["required"] == ["items"]


def test_parse_arguments_validates() -> None:
    parsed = refund_customer.parse_arguments({"order_id": "o1", "amount_cents": 5})
    assert parsed == RefundArgs(order_id="o1", amount_cents=5)
    with pytest.raises(ValidationError):
        refund_customer.parse_arguments({"order_id": "o1", "amount_cents": -1})
    with pytest.raises(ValidationError):
        refund_customer.parse_arguments({})


@pytest.mark.asyncio
async def test_tool_is_callable_and_runs() -> None:
    args = RefundArgs(order_id="o9", amount_cents=100)
    direct = await refund_customer(args, make_ctx("abc"))
    via_run = await refund_customer.run(args, make_ctx("abc"))
    assert direct == via_run == {"order": "o9", "key": "abc", "attempt": 1}


def test_context_is_frozen() -> None:
    ctx = make_ctx()
    assert ctx.requester is None
    with pytest.raises(AttributeError):
        ctx.attempt = 2  # type: ignore[misc]


def test_custom_name_and_local_model() -> None:
    reg = ToolRegistry()

    class LocalArgs(BaseModel):  # defined in a function: resolved from caller locals
        q: str

    @tool(name="lookup-v2", registry=reg)
    async def lookup(args: LocalArgs, ctx: ToolContext) -> str:
        """Look something up."""
        return args.q

    assert reg.names() == ["lookup-v2"]
    assert lookup.args_model is LocalArgs


def test_bare_decorator_registers_in_given_registry_default_global() -> None:
    reg = ToolRegistry()

    @tool(registry=reg)
    async def ping(args: RefundArgs, ctx: ToolContext) -> str:
        """Ping."""
        return "pong"

    assert "ping" in reg
    assert "ping" not in tools.REGISTRY


def _define(**kwargs):
    """Apply @tool(**kwargs) with a fresh registry; returns the decorator."""
    return tool(registry=ToolRegistry(), **kwargs)


def test_rejects_sync_function() -> None:
    with pytest.raises(ToolDefinitionError, match="async def"):

        @_define()
        def sync_tool(args: RefundArgs, ctx: ToolContext) -> None:
            """Sync."""


def test_rejects_missing_docstring() -> None:
    with pytest.raises(ToolDefinitionError, match="docstring"):

        @_define()
        async def undocumented(args: RefundArgs, ctx: ToolContext) -> None:
            pass


def test_rejects_non_model_annotation() -> None:
    with pytest.raises(ToolDefinitionError, match="BaseModel subclass"):

        @_define()
        async def bad(args: dict, ctx: ToolContext) -> None:
            """Bad."""

    with pytest.raises(ToolDefinitionError, match="annotated"):

        @_define()
        async def unannotated(args, ctx) -> None:  # type: ignore[no-untyped-def]
            """Bad."""

    with pytest.raises(ToolDefinitionError, match="cannot resolve"):

        @_define()
        async def dangling(args: NoSuchModel, ctx: ToolContext) -> None:  # type: ignore[name-defined]  # noqa: F821
            """Bad."""


def test_rejects_wrong_parameter_count() -> None:
    with pytest.raises(ToolDefinitionError, match="exactly two"):

        @_define()
        async def one(args: RefundArgs) -> None:
            """One."""

    with pytest.raises(ToolDefinitionError, match="exactly two"):

        @_define()
        async def three(args: RefundArgs, ctx: ToolContext, extra: int) -> None:
            """Three."""


def test_rejects_reserved_and_invalid_names() -> None:
    with pytest.raises(ToolDefinitionError, match="reserved"):

        @_define()
        async def request_clarification(args: RefundArgs, ctx: ToolContext) -> None:
            """Clash."""

    for bad in ["has space", "x" * 65, "", "dots.not.ok", "ok\n"]:
        with pytest.raises(ToolDefinitionError, match="invalid tool name"):

            @_define(name=bad)
            async def named(args: RefundArgs, ctx: ToolContext) -> None:
                """Named."""


def test_rejects_bad_policy() -> None:
    with pytest.raises(ToolDefinitionError, match="unknown policy 'later'"):

        @_define(policy="later")
        async def later(args: RefundArgs, ctx: ToolContext) -> None:
            """Later."""


def test_registry_duplicates() -> None:
    reg = ToolRegistry()

    async def impl(args: RefundArgs, ctx: ToolContext) -> None:
        """Impl."""

    first = tool(registry=reg, name="dup")(impl)
    # Same function object again (module re-import): replaced silently.
    second = tool(registry=reg, name="dup")(impl)
    assert reg.get("dup") is second and second is not first

    async def other(args: RefundArgs, ctx: ToolContext) -> None:
        """Other."""

    with pytest.raises(ToolDefinitionError, match="duplicate tool name 'dup'"):
        tool(registry=reg, name="dup")(other)
    assert reg.get("dup") is second


def test_registry_listing_copy_unregister() -> None:
    reg = ToolRegistry()
    reg.register(place_order)
    reg.register(refund_customer)
    assert reg.names() == ["place_order", "refund_customer"]
    assert [t.name for t in reg] == ["place_order", "refund_customer"]
    assert reg.all() == [place_order, refund_customer]
    clone = reg.copy()
    assert reg.unregister("place_order") is place_order
    assert reg.unregister("place_order") is None
    assert "place_order" not in reg
    assert "place_order" in clone and len(clone) == 2


@pytest.mark.asyncio
async def test_poller_decorator_and_waitfor() -> None:
    reg = ToolRegistry()

    class DeployArgs(BaseModel):
        deploy_id: str

    @tool(policy="wait_for_external_event", registry=reg)
    async def wait_for_deploy(args: DeployArgs, ctx: ToolContext) -> WaitFor:
        """Wait until a deploy finishes."""
        return WaitFor(f"deploy {args.deploy_id}", {"id": args.deploy_id}, poll_every_s=5)

    assert wait_for_deploy.poll is None

    @wait_for_deploy.poller
    async def check(data: dict, ctx: ToolContext) -> dict | None:
        return {"done": data["id"]} if data["id"] == "ready" else None

    assert wait_for_deploy.poll is check
    assert callable(check)  # the decorator hands the function back unchanged
    wait = await wait_for_deploy(DeployArgs(deploy_id="ready"), make_ctx())
    assert isinstance(wait, WaitFor) and wait.timeout_s == 3600.0
    assert WaitFor.from_dict(wait.to_dict()) == wait
    assert await wait_for_deploy.poll(wait.data, make_ctx()) == {"done": "ready"}
    assert await wait_for_deploy.poll({"id": "x"}, make_ctx()) is None


def test_waitfor_requires_json_data() -> None:
    assert WaitFor("x").data == {}
    with pytest.raises(TypeError, match="JSON"):
        WaitFor("x", {"when": object()})
    with pytest.raises(ValueError):
        WaitFor("x", timeout_s=0)


def test_error_tree() -> None:
    err = RetryableToolError("rate limited", retry_after=2.5)
    assert isinstance(err, ToolError) and str(err) == "rate limited"
    assert err.retry_after == 2.5
    assert RetryableToolError("flaky").retry_after is None
    assert issubclass(tools.ToolLoadError, ToolError)
    assert issubclass(ToolDefinitionError, ToolError)
