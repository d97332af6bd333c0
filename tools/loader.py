"""Import tool modules (built-ins first, then those named in OPSLOOP_TOOLS)."""

from __future__ import annotations

import importlib

from tools.errors import ToolLoadError
from tools.registry import REGISTRY, ToolRegistry

BUILTIN_MODULE = "tools.builtin"


def load_tools(spec: str | None, registry: ToolRegistry | None = None) -> list[str]:
    """Import ``tools.builtin`` then each comma-separated module in ``spec``.

    Tools register themselves in REGISTRY on import.  If another ``registry`` is
    given, every tool in REGISTRY is also registered there afterwards.  Any
    exception raised by an import becomes a one-line :class:`ToolLoadError`.
    Returns the module names imported, in order.
    """
    names = [BUILTIN_MODULE]
    for part in (spec or "").split(","):
        part = part.strip()
        if part and part not in names:
            names.append(part)
    for module in names:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ToolLoadError(module, exc) from exc
    if registry is not None and registry is not REGISTRY:
        for t in REGISTRY:
            registry.register(t)
    return names
