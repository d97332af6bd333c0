"""An MCP ``CallToolResult`` as the JSON-able value (or the error) a tool call gives back."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import mcp_types as types

from tools.errors import ToolError
from tools.output import IMAGE_MEDIA_TYPES, MAX_IMAGE_BYTES


def tool_output(
    result: types.CallToolResult, redact: Callable[[str], str] = lambda text: text
) -> dict[str, Any]:
    """``{"text": …, "structured": …, "attachments": […]}`` with the keys that apply.

    Text blocks are joined; structured content is kept as sent; images, audio and
    resources are summarised (kind, type, size, uri), which is what Slack shows. The
    model gets more (engine/context.py): an embedded text resource keeps its ``text``
    (inline, within the result's cut), and an image the Anthropic API takes (PNG, JPEG,
    GIF, WebP; :data:`MAX_IMAGE_BYTES` for all of one result) keeps its base64 ``data``,
    sent as an image block; other binary content is never inlined (base64 as text costs
    tokens and tells the model nothing). Every string goes through ``redact`` first (the
    server's configured secrets: a server may echo its token), since what is returned is
    stored, shown to the model and posted to Slack; image data is not text to redact.

    Raises ToolError with the server's text when the result is an error (``isError``).
    """
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if result.is_error:
        raise ToolError(redact("\n".join(texts).strip()) or "the MCP tool reported an error")
    return _redacted(_output(result, texts), redact)


def _output(result: types.CallToolResult, texts: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if texts:
        out["text"] = "\n".join(texts)
    if result.structured_content is not None:
        out["structured"] = result.structured_content
    attachments = [
        _summary(block) for block in result.content if not isinstance(block, types.TextContent)
    ]
    if attachments:
        out["attachments"] = attachments
        _keep_images(result, attachments)
    return out


def _keep_images(result: types.CallToolResult, attachments: list[dict[str, Any]]) -> None:
    """Add the base64 ``data`` to the summaries of the images the model may be shown,
    in order, while they fit :data:`MAX_IMAGE_BYTES` together."""
    blocks = [block for block in result.content if not isinstance(block, types.TextContent)]
    room = MAX_IMAGE_BYTES
    for block, summary in zip(blocks, attachments, strict=True):
        if not isinstance(block, types.ImageContent):
            continue
        size = _decoded_size(block.data)
        if block.mime_type not in IMAGE_MEDIA_TYPES:
            summary["not_shown"] = "a media type the model does not take"
        elif size is None:
            summary["not_shown"] = "its data is not base64"
        elif size > room:
            summary["not_shown"] = f"larger than the {MAX_IMAGE_BYTES // 1024} KiB images may take"
        else:
            summary["data"] = block.data
            room -= size


def _decoded_size(data: str) -> int | None:
    """The bytes ``data`` decodes to; None when it is not base64."""
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return None


def _redacted(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        if value.get("type") == "image" and "data" in value:  # base64: no text in it
            rest = {k: v for k, v in value.items() if k != "data"}
            return {**_redacted(rest, redact), "data": value["data"]}
        return {redact(str(k)): _redacted(v, redact) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v, redact) for v in value]
    return value


def _summary(block: Any) -> dict[str, Any]:
    if isinstance(block, types.ImageContent | types.AudioContent):
        return {"type": block.type, "mime_type": block.mime_type, "bytes": len(block.data) * 3 // 4}
    if isinstance(block, types.ResourceLink):
        return {"type": "resource_link", "uri": block.uri, "name": block.name}
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            # Inline for the model (the result's JSON is cut at 4,000 characters there).
            return {
                "type": "resource",
                "uri": str(res.uri),
                "mime_type": res.mime_type,
                "bytes": len(res.text),
                "text": res.text,
            }
        size = len(res.blob) * 3 // 4
        return {"type": "resource", "uri": str(res.uri), "mime_type": res.mime_type, "bytes": size}
    return {"type": getattr(block, "type", "unknown")}
