"""The renovation's test: every shipped method trains as it did before methods became one table row with a view
plan (``tests/golden_methods/methods.json``, made by ``tests/golden_methods/record_methods.py``; its first recording holds the
numbers recorded on the code before the change): the same loss floats at every step and the same parameter bytes
where this machine and its kernel settings are those of a recording, and within the measured tolerance of every
recording anywhere (other CPUs pick other float kernels: ``tests/kernel_settings.py``)."""

from __future__ import annotations

import json

import pytest
from golden_methods.record_methods import GOLDEN, LOSS_RTOL, METHODS, PARAM_RTOL, differences, record_in
from kernel_settings import golden_env, golden_setting

pytestmark = pytest.mark.stored
RECORDINGS = json.loads(GOLDEN.read_text())["recordings"]


@pytest.fixture(scope="module")
def recorded():
    """This machine's recording under the golden setting (AVX2 kernels), made in a fresh process: the kernel
    variables are read when the libraries load."""
    env = {k: v for k, v in golden_env().items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return record_in(env)


@pytest.fixture(scope="module")
def got(recorded):
    return recorded["runs"]


def test_shipped_methods_train_bit_for_bit_on_this_machine(recorded):
    """Bit for bit against the recording made with the same kernels: the lock's numeric libraries, the
    architecture, the CPU vendor and the AVX2 setting (an AVX-512 CPU capped to AVX2, or an AVX2 CPU as it is).
    Skipped only where none matches (another lock, another vendor, or a CPU without AVX2): record one with
    ``python tests/golden_methods/record_methods.py`` on the code before a change, see CONTRIBUTING.md."""
    same = [r for r in RECORDINGS if r["kernels"] == recorded["kernels"]]
    if not same:
        pytest.skip(f"no recording made with this machine's kernels ({recorded['kernels']}); compared within "
                    "tolerance only")
    assert recorded["kernels"]["kernels"] == golden_setting() and recorded["kernels"]["locked"]
    for rec in same:
        for m in METHODS:
            assert recorded["runs"][m]["loss"] == rec["runs"][m]["loss"], m  # exact floats
            assert recorded["runs"][m]["params"] == rec["runs"][m]["params"], m  # every parameter and buffer, bytes


@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda r: f"{r['kernels']['vendor']}-{r['kernels']['kernels']}-"
                         f"{r['kernels']['aten_capability']}")
def test_shipped_methods_train_as_recorded_within_tolerance(got, rec):
    """Every recording, whatever the kernels it was made with: the same views, steps and tensors, the losses and
    each tensor's sum, L1 and L2 norm within LOSS_RTOL / PARAM_RTOL (measured: tests/golden_methods/record_methods.py)."""
    for m in METHODS:
        assert got[m]["mode"] == rec["runs"][m]["mode"] and len(got[m]["loss"]) == len(rec["runs"][m]["loss"]) == 4
        assert got[m]["stats"].keys() == rec["runs"][m]["stats"].keys(), m  # the same parameters and buffers
    d = differences(rec["runs"], got)
    assert d["loss"] <= LOSS_RTOL and d["params"] <= PARAM_RTOL, (d, rec["kernels"])
