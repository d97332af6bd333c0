"""Turn user-style database URLs into SQLAlchemy async-driver URLs."""

from __future__ import annotations

_PREFIXES = {
    "sqlite+aiosqlite://": "sqlite+aiosqlite://",
    "sqlite://": "sqlite+aiosqlite://",
    "postgresql+asyncpg://": "postgresql+asyncpg://",
    "postgresql://": "postgresql+asyncpg://",
    "postgres://": "postgresql+asyncpg://",
}


def to_async_url(url: str) -> str:
    """``sqlite:///x`` -> ``sqlite+aiosqlite:///x``; ``postgres(ql)://`` -> asyncpg.

    Other URLs are returned unchanged (SQLAlchemy reports unsupported ones).
    """
    url = url.strip()
    for prefix, replacement in _PREFIXES.items():
        if url.startswith(prefix):
            return replacement + url[len(prefix) :]
    return url
