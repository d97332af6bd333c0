"""The local workspace kept in one JSON file, replaced atomically on every save.

A save writes a temporary file beside the target, flushes it to disk and renames it over
the target (``os.replace`` is atomic on POSIX and Windows), then syncs the directory:
a crash at any point leaves the previous complete file or the new complete file, never
half of one. Saves are serialised and coalesced: a save that finds a newer one already
written returns at once.

Where the file lives: ``OPSLOOP_LOCAL_STATE`` if set, else beside a SQLite
``DATABASE_URL`` (``opsloop.db`` → ``opsloop.local.json``), else ``opsloop.local.json`` in
the working directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from engine.db import parse_database_url
from engine.errors import ConfigError
from localslack.workspace import Workspace

log = logging.getLogger("opsloop.local.state")

DEFAULT_NAME = "opsloop.local.json"


class StateFileError(ConfigError):
    """The state file cannot be read (one line, naming the file)."""


def state_path(database_url: str, env: Mapping[str, str] | None = None) -> Path:
    """Where the workspace of a local run on ``database_url`` is kept: ``env``'s
    ``OPSLOOP_LOCAL_STATE`` (the settings' ``local_state``) when given, else beside a
    SQLite database, else ``./opsloop.local.json``."""
    explicit = ((env or {}).get("OPSLOOP_LOCAL_STATE") or "").strip()
    if explicit:
        return Path(explicit)
    config = parse_database_url(database_url)
    database = config.url.database
    if config.dialect == "sqlite" and database and database != ":memory:":
        db = Path(database)
        return db.with_name(f"{db.stem}.local.json")
    return Path(DEFAULT_NAME)


class StateFile:
    """Saves ``workspace`` to ``path`` (see the module's docstring)."""

    def __init__(self, path: Path, workspace: Workspace) -> None:
        self.path = path
        self.workspace = workspace
        self._saved = -1
        self._lock = asyncio.Lock()

    def load(self) -> bool:
        """Restore the workspace from the file; False when there is none yet."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StateFileError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            self.workspace.restore(json.loads(raw))
        except ValueError as exc:
            raise StateFileError(
                f"{self.path} is not a saved local workspace ({exc}); move it away to start afresh"
            ) from None
        self._saved = self.workspace.version
        return True

    async def save(self) -> None:
        """Write the workspace as it is now, unless a save already wrote this version."""
        wanted = self.workspace.version
        async with self._lock:
            if self._saved >= wanted:
                return  # a save that started after our change wrote it already
            version = self.workspace.version
            data = json.dumps(self.workspace.snapshot(), ensure_ascii=False, separators=(",", ":"))
            await asyncio.to_thread(write_atomically, self.path, data)
            self._saved = version

    @property
    def dirty(self) -> bool:
        return self._saved < self.workspace.version


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: the old file or the new one, never half of either."""
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_directory(directory)


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
