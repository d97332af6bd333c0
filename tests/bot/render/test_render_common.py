"""What the renderers share: a button's or a modal's binding to one pending call."""

from __future__ import annotations

import pytest

from bot.render.common import binding_value, parse_binding
from tests.bot.render.support import HASH, THREAD


@pytest.mark.parametrize(
    ("binding", "why"),
    [
        ("", "not JSON"),
        ("nope", "not JSON"),
        ("[1]", "wrong keys"),
        ('{"t":"a","c":"b"}', "wrong keys"),
        ('{"t":"a","c":"b","h":"c","x":1}', "wrong keys"),
        ('{"t":"a","c":"","h":"c"}', "empty"),
        ('{"t":"a","c":1,"h":"c"}', "non-string"),
    ],
)
def test_parse_binding_refuses_forged_values(binding: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_binding(binding)


def test_binding_value_refuses_ids_too_long_for_a_button() -> None:
    with pytest.raises(ValueError, match="too long"):
        binding_value(THREAD, "x" * 2000, HASH)
