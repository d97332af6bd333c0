"""Import tool modules (built-ins first, then those named in OPSLOOP_TOOLS), hand them
their settings, and close them.

A tool module may define two hooks, both optional, which is how a tool gets what it
needs without reading the environment and declares its own shutdown:

- ``configure(settings)``: called once after the import with the process's tool
  settings (``engine.config.ToolSettings``: ``docs_dir``, ``tickets_url``, ``demo_url``);
- ``async close()``: called once at shutdown, on the event loop the tools ran on.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterable
from typing import Any

from tools.errors import ToolLoadError
from tools.registry import REGISTRY, ToolRegistry

BUILTIN_MODULE = "tools.builtin"

log = logging.getLogger("opsloop.tools")


def module_names(spec: str | Iterable[str] | None) -> list[str]:
    """``tools.builtin`` then each module of ``spec`` (comma-separated or a list), once."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec or ())
    names = [BUILTIN_MODULE]
    for part in parts:
        part = part.strip()
        if part and part not in names:
            names.append(part)
    return names


def load_tools(
    spec: str | Iterable[str] | None,
    registry: ToolRegistry | None = None,
    *,
    settings: Any = None,
) -> list[str]:
    """Import ``tools.builtin`` then each module in ``spec``.

    Tools register themselves in REGISTRY on import.  If another ``registry`` is
    given, every tool in REGISTRY is also registered there afterwards.  With
    ``settings``, each module's ``configure(settings)`` is called.  Any exception
    raised by an import or a ``configure`` becomes a one-line :class:`ToolLoadError`.
    Returns the module names imported, in order.
    """
    names = module_names(spec)
    for module in names:
        try:
            loaded = importlib.import_module(module)
            configure = getattr(loaded, "configure", None)
            if settings is not None and callable(configure):
                configure(settings)
        except Exception as exc:
            raise ToolLoadError(module, exc) from exc
    if registry is not None and registry is not REGISTRY:
        for t in REGISTRY:
            registry.register(t)
    return names


async def close_tools(modules: Iterable[str]) -> None:
    """Call ``close()`` of each of ``modules`` that has one (shutdown, on the loop the
    tools ran on); a failing one is logged and the others still close."""
    for name in modules:
        close = getattr(sys.modules.get(name), "close", None)
        if close is None or not callable(close):
            continue
        try:
            await close()
        except Exception:
            log.warning("closing the tools of %s failed", name, exc_info=True)
