"""The methods table (moquad.train.methods): each method's loader mode and forced switches per Algorithm 1 stage."""

from __future__ import annotations

from moquad.train.methods import METHODS


def test_each_method_s_views_per_stage():
    off = {"ad_pos": False, "intra_neg": False, "ad_intra_neg": False}
    assert list(METHODS) == ["moquad", "simclr", "simclr_classic"]
    assert METHODS["moquad"].loader_mode("appearance") == ("appearance", {})
    assert METHODS["moquad"].loader_mode("moquad") == ("moquad", {})
    assert METHODS["simclr"].loader_mode("moquad") == ("moquad", off)  # the ladder's base: no quadruple parts
    assert METHODS["simclr"].loader_mode("appearance") == ("appearance", {})  # same warm-up as moquad
    assert METHODS["simclr_classic"].loader_mode("moquad") == ("pair", {})
    assert [m.warmup for m in METHODS.values()] == [True, True, False]  # classic SimCLR has no Eq. 3 warm-up
    assert [m.label for m in METHODS.values()] == ["moquad", "simclr", "simclr"]
    assert [m.loss_label("appearance") for m in METHODS.values()] == ["appearance"] * 3  # the progress bar
    assert [m.loss_label("moquad") for m in METHODS.values()] == ["moquad", "simclr", "simclr"]


def test_every_loader_mode_has_its_loss():
    from moquad.data.views import MODES
    from moquad.train.losses import LOSSES

    assert {m.mode for m in METHODS.values()} | {"appearance"} == set(MODES) == set(LOSSES)


def test_the_tables_import_no_torch():
    """The method and optimizer tables: moquad.settings reads their names to check the settings, torch-free."""
    import subprocess
    import sys

    code = "import sys, moquad.train.methods, moquad.train.optimizers; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
