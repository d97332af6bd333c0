"""The tests' fake GitHub: ``opsloop local``'s (:mod:`localslack.github`), on a port of
its own (``async with FakeGitHub() as gh``), with its controls for tests (``start``,
``complete``, ``fail``, ``hold``, ``wait_for``) and webhook deliveries as GitHub signs
them (``delivery``)."""

from __future__ import annotations

from localslack.github import (
    LOGIN,
    REPO,
    TOKEN,
    WEBHOOK_SECRET,
    App,
    Call,
    FakeGitHub,
    Job,
    Run,
    Workflow,
    delivery,
    signature,
)

__all__ = [
    "LOGIN",
    "REPO",
    "TOKEN",
    "WEBHOOK_SECRET",
    "App",
    "Call",
    "FakeGitHub",
    "Job",
    "Run",
    "Workflow",
    "delivery",
    "signature",
]
