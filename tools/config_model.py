"""What the models of configured tool sources are built from (``tools.mcp.config``,
``tools.http_config``), so that each source owns the model of its ``opsloop.yaml``
section and ``engine/config_file.py`` only composes them.

A model is strict, frozen and refuses unknown keys; a validator that finds a problem
below the key it validates raises :class:`KeyProblem` with the rest of the path, and
the file's reader turns it into its one line (``opsloop.yaml: tools.http.x.url: …``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, SecretStr

from tools.schemas import compile_schema

MAX_DURATION_S = 365 * 86400.0
_DURATION = re.compile(r"^([1-9][0-9]*)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class KeyProblem(ValueError):
    """A validator's problem at a key below the one it validates (``http.x.url``)."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        self.path = path
        super().__init__(message)


class StrictModel(BaseModel):
    """A section of the file: exact types, no unknown keys, frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def parse_duration(value: object) -> float:
    """``30s`` / ``10m`` / ``2h`` / ``1d`` in seconds, at most a year; anything else is an
    error (an unbounded one overflowed the clock arithmetic of every call it decided)."""
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"must be a duration such as 30s, 10m, 2h or 1d, not {value!r}")
    if len(match.group(1)) > 9 or int(match.group(1)) * _UNIT_S[match.group(2)] > MAX_DURATION_S:
        raise ValueError(f"must be at most a year (365d), not {value!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema opsloop can run safely (tools/schemas.py): refs inside it only,
    patterns the linear-time engine runs, no reference loop."""
    compile_schema(schema)  # SchemaProblem is a ValueError: one line at the key
    return schema


def plain(secrets: dict[str, SecretStr]) -> dict[str, str]:
    """Header or environment values as the code that sends them needs them."""
    return {k: v.get_secret_value() for k, v in secrets.items()}


Duration = Annotated[float, BeforeValidator(parse_duration)]
JsonSchema = Annotated[dict[str, Any], AfterValidator(_json_schema)]
