"""The tests' fake PagerDuty: ``opsloop local``'s (:mod:`localslack.pagerduty`), on a
port of its own (``async with FakePagerDuty() as pd``), with its controls for tests
(``put_on_call``, ``fail``, ``hold``, ``wait_for``)."""

from __future__ import annotations

from localslack.pagerduty import (
    ACCEPT,
    FROM_EMAIL,
    TOKEN,
    Call,
    FakePagerDuty,
    Incident,
    OnCall,
)

__all__ = ["ACCEPT", "FROM_EMAIL", "TOKEN", "Call", "FakePagerDuty", "Incident", "OnCall"]
