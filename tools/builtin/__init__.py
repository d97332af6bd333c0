"""Built-in tools, registered in the global REGISTRY on import."""

from __future__ import annotations

from typing import Any

from tools.builtin import docs, tickets

__all__ = ["close", "configure", "docs", "tickets"]


def configure(settings: Any) -> None:
    """The loader's hook: the docs folder and the tickets database."""
    docs.configure(settings)
    tickets.configure(settings)


async def close() -> None:
    """The loader's shutdown hook: the tickets database's connections."""
    await tickets.close()
