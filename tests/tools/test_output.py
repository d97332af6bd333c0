"""A tool's answer as it may be stored: no lone surrogates, at most 1 MiB, cut marked."""

from __future__ import annotations

import hashlib
import json

from tools.output import MAX_RESULT_BYTES, clean, fit_text, storable, storable_text


def compact(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def test_lone_surrogates_are_replaced_in_values_and_keys_and_pairs_are_kept() -> None:
    value = json.loads('{"x": "lone \\ud800", "k\\udc00": ["\\ud83d\\ude00", 3, null]}')
    assert storable(value) == {"x": "lone \ufffd", "k\ufffd": ["\U0001f600", 3, None]}
    assert clean(("a\udfff",)) == ["a\ufffd"]
    assert storable_text("boom \ud800") == "boom \ufffd"


def test_a_value_under_the_bound_is_kept_as_it_is() -> None:
    value = {"text": "x" * (MAX_RESULT_BYTES - 20)}
    assert storable(value) is value


def test_a_value_over_the_bound_is_cut_with_its_size_and_digest() -> None:
    value = {"text": "é" * MAX_RESULT_BYTES}  # two bytes each in UTF-8
    full = compact(value)
    cut = storable(value)
    assert list(cut) == ["cut", "bytes", "sha256", "head"]
    assert cut["bytes"] == len(full)
    assert cut["sha256"] == hashlib.sha256(full).hexdigest()
    assert full.decode().startswith(cut["head"]) and cut["head"].startswith('{"text":"éé')
    shown = len(cut["head"].encode())
    assert cut["cut"] == (
        f"[cut: {len(full):,} bytes, sha256 {cut['sha256']}; showing the first {shown:,} bytes]"
    )
    assert len(compact(cut)) <= MAX_RESULT_BYTES


def test_a_cut_full_of_escapes_still_fits_the_bound() -> None:
    value = ['"\\\n' * MAX_RESULT_BYTES]  # each character doubles in JSON, and again in head
    cut = storable(value)
    assert len(compact(cut)) <= MAX_RESULT_BYTES
    assert len(fit_text('"' * 100, 52)) == 25  # 2 quotes + 25 escaped quotes = 52 bytes


def test_a_long_error_text_starts_with_the_cut_note() -> None:
    text = "trace " * MAX_RESULT_BYTES
    stored = storable_text(text)
    assert stored.startswith(f"[cut: {len(text):,} bytes, sha256 ")
    assert len(json.dumps(stored).encode()) <= MAX_RESULT_BYTES
