"""The renovation's test: every shipped method trains as it did before methods became one table row with a view
plan (``tests/golden/methods.json``, made by ``tests/golden/record_methods.py``; its first recording holds the
numbers recorded on the code before the change): the same loss floats at every step and the same parameter bytes
where this machine and its kernel settings are those of a recording, within the measured tolerance of every
recording elsewhere (other CPUs pick other float kernels: ``tests/kernels.py``)."""

from __future__ import annotations

import json

import pytest
from golden.record_methods import GOLDEN, LOSS_RTOL, METHODS, PARAM_RTOL, differences, record_all
from kernels import fingerprint


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.stored
def test_shipped_methods_train_as_recorded():
    recordings = json.loads(GOLDEN.read_text())["recordings"]
    got = record_all(METHODS)
    same = [r for r in recordings if r["kernels"] == fingerprint()]
    for rec in same:  # this machine and settings: bit for bit
        for m in METHODS:
            assert got[m]["loss"] == rec["runs"][m]["loss"], m  # exact floats
            assert got[m]["params"] == rec["runs"][m]["params"], m  # every parameter and buffer, byte for byte
    for rec in recordings:  # every recording (other kernels, or these): within the measured tolerance
        d = differences(rec["runs"], got)
        assert d["loss"] <= LOSS_RTOL and d["params"] <= PARAM_RTOL, (d, rec["kernels"])
        assert all(got[m]["mode"] == rec["runs"][m]["mode"] for m in METHODS)
        assert all(got[m]["stats"].keys() == rec["runs"][m]["stats"].keys() for m in METHODS)  # the same tensors
        assert all(len(got[m]["loss"]) == len(rec["runs"][m]["loss"]) == 4 for m in METHODS)
    print(f"bit for bit against {len(same)} of {len(recordings)} recordings (the others: other kernels)")
