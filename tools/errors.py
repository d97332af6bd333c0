"""Exceptions raised by tools and by the tool machinery.

Tree::

    ToolError                 base; a tool failed permanently (the model sees the message)
    +-- RetryableToolError    transient failure; the engine retries with backoff
    +-- OutcomeUnknown        the effect may or may not have happened; a person decides
    +-- ToolLoadError         a module named in OPSLOOP_TOOLS could not be imported
    +-- ToolDefinitionError   @tool was used incorrectly (raised at decoration time)
"""

from __future__ import annotations


class ToolError(Exception):
    """Base class: a tool failed, and retrying the same call will not help."""


class RetryableToolError(ToolError):
    """A transient failure: the engine reschedules the call with backoff.

    ``retry_after`` (seconds), when given, overrides the engine's backoff delay.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        if retry_after is not None and retry_after < 0:
            raise ValueError("retry_after must be >= 0 seconds")
        self.retry_after = retry_after


class ToolLoadError(ToolError):
    """A tool module failed to import; str() is one line naming module and cause."""

    def __init__(self, module: str, cause: BaseException) -> None:
        self.module = module
        self.cause = cause
        detail = " ".join(str(cause).split())
        text = type(cause).__name__ + (f": {detail}" if detail else "")
        super().__init__(f"cannot import tool module {module!r}: {text}")


class ToolDefinitionError(ToolError):
    """The @tool decorator (or a registry) was given something it cannot accept."""


class OutcomeUnknown(ToolError):
    """A non-idempotent effect may or may not have happened (the connection was lost
    after the request went out): the engine asks a person instead of retrying."""
