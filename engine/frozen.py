"""Changed copies of frozen pydantic models (events, states), without validating again.

The reducer and the store build each new state and each stamped event from values that
were validated where they came in: an event, a state, the store's own seq and clock.
Validating the copy again was a fifth of a step's CPU (issue 19), so ``replaced`` only
checks that every changed name is a field (a misspelt one still raises).

``OPSLOOP_STRICT_COPIES=1`` (the test suite sets it, for its child processes too)
validates every copy as well, so a value of the wrong type fails in the tests that
produce it rather than going unnoticed.

Pure: no I/O here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

STRICT = os.environ.get("OPSLOOP_STRICT_COPIES") == "1"

M = TypeVar("M", bound=BaseModel)

_set = object.__setattr__  # frozen models refuse their own __setattr__


def replaced(model: M, changes: Mapping[str, Any]) -> M:
    """``model`` with ``changes`` (field name -> value); ``model`` itself is unchanged."""
    cls = type(model)
    fields = cls.__pydantic_fields__
    for name in changes:
        if name not in fields:
            raise ValueError(f"{cls.__name__} has no field {name!r}")
    values = {**model.__dict__, **changes}
    if STRICT:
        return cls.model_validate(values)
    copy = cls.__new__(cls)
    _set(copy, "__dict__", values)
    _set(copy, "__pydantic_fields_set__", model.__pydantic_fields_set__)
    _set(copy, "__pydantic_extra__", model.__pydantic_extra__)
    _set(copy, "__pydantic_private__", model.__pydantic_private__)
    return copy
