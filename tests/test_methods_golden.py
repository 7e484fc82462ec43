"""The renovation's test: every shipped method trains bit for bit as it did before methods became one table row
with a view plan (``tests/golden/methods.json``, recorded on the code before the change by
``tests/golden/record_methods.py``): the same loss floats at every step and the same parameter bytes."""

from __future__ import annotations

import json

import pytest
from golden.record_methods import GOLDEN, METHODS, record_all


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def test_shipped_methods_train_bit_for_bit_as_recorded():
    want = json.loads(GOLDEN.read_text())
    got = record_all(METHODS)
    for m in METHODS:
        assert got[m]["loss"] == want[m]["loss"], m  # exact floats
        assert got[m]["params"] == want[m]["params"], m  # every parameter and buffer, byte for byte
