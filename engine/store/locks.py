"""Proof of life on SQLite: one lock file per worker, ``flock``ed while it lives.

A process that registers as a worker (engine.workers) holds an exclusive ``flock`` on
``<db>.workers/<worker id>.lock`` for its whole life; the kernel drops it when the
process dies, however it dies (SIGKILL included), and keeps it while the process is
merely stopped (SIGSTOP) or slow. So an owner is *provably dead* when its file exists
and a non-blocking ``flock`` on it succeeds. ``flock`` (not ``fcntl``/``lockf``) on
purpose: its locks belong to the open file, so a check from the holder's own process
(another open of the file) conflicts as a check from any other process does.

A missing file is never proof of death (someone may have removed the directory): the
lease then waits for its expiry, as it would without workers.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


class WorkerLocks:
    """The lock files next to one database file."""

    def __init__(self, database_path: str) -> None:
        self.directory = f"{database_path}.workers"
        self._held: dict[str, int] = {}  # worker id -> the descriptor holding its lock

    def path(self, worker_id: str) -> str:
        # Worker ids are ``host:pid:hex``; anything else is made a safe file name.
        return os.path.join(self.directory, _UNSAFE.sub("_", worker_id) + ".lock")

    def hold(self, worker_id: str) -> bool:
        """Take ``worker_id``'s lock for the life of this process (False: a live process
        holds it already). Descriptors are not inherited by subprocesses (PEP 446), so a
        tool's child process never keeps a dead worker looking alive."""
        if worker_id in self._held:
            return True
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path(worker_id), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._held[worker_id] = fd
        return True

    def drop(self, worker_id: str, *, remove: bool) -> None:
        """Give up ``worker_id``'s lock; ``remove``: its file too (its row is gone)."""
        fd = self._held.pop(worker_id, None)
        if fd is None:
            return
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path(worker_id))
        os.close(fd)

    def dead(self, worker_id: str, *, remove: bool = False) -> bool:
        """Whether ``worker_id`` is provably dead: its lock file exists and nobody holds
        it. ``remove``: delete the file too (while still locked), once its row goes."""
        try:
            fd = os.open(self.path(worker_id), os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        else:
            if remove:
                with contextlib.suppress(OSError):
                    os.unlink(self.path(worker_id))
            return True
        finally:
            os.close(fd)  # releases the probe's lock, if it got it

    def close(self) -> None:
        for worker_id in list(self._held):
            fd = self._held.pop(worker_id)
            os.close(fd)


def worker_of(owner: str) -> str:
    """The worker a lease owner belongs to: its id up to the first ``/`` (delivery's
    owner is ``<worker id>/delivery``)."""
    return owner.split("/", 1)[0]
