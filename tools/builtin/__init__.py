"""Built-in tools, registered in the global REGISTRY on import."""

from __future__ import annotations

from tools.builtin import docs, tickets

__all__ = ["docs", "tickets"]
