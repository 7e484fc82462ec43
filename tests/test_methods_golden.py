"""The renovation's test: every shipped method trains as it did before methods became one table row with a view
plan (``tests/golden_methods/methods.json``, made by ``tests/golden_methods/record_methods.py``; its first recording holds the
numbers recorded on the code before the change): the same loss floats at every step and the same parameter bytes
where this machine and its kernel settings are those of a recording, and within the measured tolerance of every
recording anywhere (other CPUs pick other float kernels: ``tests/kernel_settings.py``)."""

from __future__ import annotations

import json

import pytest
from golden_methods.record_methods import GOLDEN, LOSS_RTOL, METHODS, PARAM_RTOL, differences, record_all
from kernel_settings import fingerprint

pytestmark = pytest.mark.stored
RECORDINGS = json.loads(GOLDEN.read_text())["recordings"]


@pytest.fixture(scope="module")
def got():
    with pytest.MonkeyPatch.context() as mp:
        for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            mp.delenv(var, raising=False)
        return record_all(METHODS)


def test_shipped_methods_train_bit_for_bit_on_this_machine(got):
    """Bit for bit against every recording made with this machine's kernels (skipped where there is none: record
    one with ``python tests/golden_methods/record_methods.py`` on the code before a change, see CONTRIBUTING.md)."""
    same = [r for r in RECORDINGS if r["kernels"] == fingerprint()]
    if not same:
        pytest.skip("no recording made with this machine's kernels (torch, CPU, kernel settings): compared within "
                    "tolerance only")
    for rec in same:
        for m in METHODS:
            assert got[m]["loss"] == rec["runs"][m]["loss"], m  # exact floats
            assert got[m]["params"] == rec["runs"][m]["params"], m  # every parameter and buffer, byte for byte


@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda r: f"{r['kernels']['cpu'].get('vendor_id', '?')}-"
                         f"{r['kernels']['aten_capability']}")
def test_shipped_methods_train_as_recorded_within_tolerance(got, rec):
    """Every recording, whatever the kernels it was made with: the same views, steps and tensors, the losses and
    each tensor's sum, L1 and L2 norm within LOSS_RTOL / PARAM_RTOL (measured: tests/golden_methods/record_methods.py)."""
    for m in METHODS:
        assert got[m]["mode"] == rec["runs"][m]["mode"] and len(got[m]["loss"]) == len(rec["runs"][m]["loss"]) == 4
        assert got[m]["stats"].keys() == rec["runs"][m]["stats"].keys(), m  # the same parameters and buffers
    d = differences(rec["runs"], got)
    assert d["loss"] <= LOSS_RTOL and d["params"] <= PARAM_RTOL, (d, rec["kernels"])
