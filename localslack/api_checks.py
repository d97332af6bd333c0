"""What every Web API method answers with when it refuses, and the checks they share.

Pure: no I/O here.
"""

from __future__ import annotations

from typing import Any

MAX_BLOCKS = 50


class ApiError(Exception):
    """A method's ``{"ok": false, "error": ...}`` answer (``extra`` goes beside it)."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra


def required(params: dict[str, Any], key: str, error: str) -> str:
    value = params.get(key)
    if not value or not isinstance(value, str):
        raise ApiError(error)
    return value


def check_blocks(blocks: Any) -> None:
    """The checks Slack makes that a renderer most easily breaks (``invalid_blocks``).

    Deliberately independent of ``bot.limits.check_limits``: a second opinion.
    """
    if blocks is None:
        return
    errors = []
    if not isinstance(blocks, list):
        errors.append("blocks must be a list")
    elif len(blocks) > MAX_BLOCKS:
        errors.append(f"no more than {MAX_BLOCKS} items allowed [json-pointer:/blocks]")
    for i, block in enumerate(blocks if isinstance(blocks, list) else []):
        if not isinstance(block, dict):
            errors.append(f"must be an object [json-pointer:/blocks/{i}]")
            continue
        raw_text = block.get("text")
        text: dict[str, Any] = raw_text if isinstance(raw_text, dict) else {}
        body = text.get("text")
        if block.get("type") == "section" and body is not None and not 0 < len(body) <= 3000:
            errors.append(f"must be 1 to 3000 characters [json-pointer:/blocks/{i}/text/text]")
        raw_elements = block.get("elements")
        elements: list[Any] = raw_elements if isinstance(raw_elements, list) else []
        for element in elements:
            if not isinstance(element, dict):
                errors.append(f"must be an object [json-pointer:/blocks/{i}/elements]")
                continue
            if len(str(element.get("value", ""))) > 2000:
                errors.append(f"value over 2000 characters [json-pointer:/blocks/{i}]")
            if len(str(element.get("action_id", ""))) > 255:
                errors.append(f"action_id over 255 characters [json-pointer:/blocks/{i}]")
    if errors:
        raise ApiError("invalid_blocks", errors=errors)
