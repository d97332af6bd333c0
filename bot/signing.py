"""Request signatures, as Slack signs its requests (and our webhook senders sign theirs).

``X-…-Signature: <version>=<hex HMAC-SHA256 of "<version>:<timestamp>:<bound:…><raw body>">``:
Slack's ``v0`` binds nothing but the timestamp; our webhooks' ``v1`` also binds the wait
id, so one wait's signature never passes for another's. Checked on the raw bytes before
anything is parsed, so an unsigned body costs one HMAC and nothing more
(https://docs.slack.dev/authentication/verifying-requests-from-slack). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from typing import Protocol

MAX_SKEW_S = 300
_DIGITS = re.compile(r"[0-9]{1,15}")
_DIGEST = re.compile(r"[0-9a-f]{64}")


class Headers(Protocol):
    """A request's headers, as aiohttp's ``CIMultiDictProxy`` or a plain mapping."""

    def get(self, key: str, /) -> str | None: ...


def signature(
    secret: str, timestamp: str, body: bytes, *, version: str = "v0", bound: Sequence[str] = ()
) -> str:
    """``<version>=<hex HMAC-SHA256 of "<version>:<timestamp>:<bound…:><body>">``."""
    base = ":".join((version, timestamp, *bound, "")).encode() + body
    return f"{version}=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def one_header(headers: Headers, name: str) -> str | None:
    """The header ``name``; ``ValueError`` when it is repeated (which one would count?)."""
    getall = getattr(headers, "getall", None)
    if getall is not None:
        values = list(getall(name, []))
        if len(values) > 1:
            raise ValueError(f"{name} is repeated")
        return values[0] if values else None
    return headers.get(name) or headers.get(name.lower())


def check(
    secret: str,
    headers: Headers,
    body: bytes,
    *,
    timestamp_header: str,
    signature_header: str,
    now: float | None = None,
    version: str = "v0",
    bound: Sequence[str] = (),
) -> str | None:
    """None if ``body`` (with ``bound``) is signed with ``secret`` in ``headers`` by the
    scheme ``version``; otherwise why not."""
    try:
        stamp = one_header(headers, timestamp_header)
        given = one_header(headers, signature_header)
    except ValueError as exc:
        return str(exc)
    if not stamp or not given:
        return "missing signature headers"
    if not _DIGITS.fullmatch(stamp):
        return "malformed timestamp"
    scheme, _, digest = given.partition("=")
    if scheme != version or not _DIGEST.fullmatch(digest):
        return "malformed signature"
    if abs((time.time() if now is None else now) - int(stamp)) > MAX_SKEW_S:
        return "stale timestamp"
    if not hmac.compare_digest(signature(secret, stamp, body, version=version, bound=bound), given):
        return "bad signature"
    return None
