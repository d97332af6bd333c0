"""Changed copies of frozen pydantic models (events, states), without validating again.

The reducer and the store build each new state and each stamped event from values that
were validated where they came in: an event, a state, the store's own seq and clock.
Validating the copy again was a fifth of a step's CPU (issue 19), so ``replaced`` only
checks that every changed name is a field (a misspelt one still raises).

``OPSLOOP_STRICT_COPIES=1`` (the test suite sets it, for its child processes too)
validates every copy as well and requires the validated one to equal it: a value of the
wrong type, or one that passes only once converted (a list for a tuple), fails in the
tests that produce it rather than going unnoticed.

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
    copy = cls.__new__(cls)
    _set(copy, "__dict__", values)
    _set(copy, "__pydantic_fields_set__", model.__pydantic_fields_set__)
    _set(copy, "__pydantic_extra__", model.__pydantic_extra__)
    _set(copy, "__pydantic_private__", model.__pydantic_private__)
    if STRICT:
        _check(copy)
    return copy


def _check(copy: BaseModel) -> None:
    """``copy`` as validation would build it, value for value and type for type."""
    valid = type(copy).model_validate(copy.__dict__)
    for name, value in copy.__dict__.items():
        want = valid.__dict__[name]
        if type(value) is not type(want) or value != want:
            raise ValueError(
                f"{type(copy).__name__}.{name} is {value!r}; validated, it is {want!r}"
            )
