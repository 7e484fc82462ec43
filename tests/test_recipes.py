"""Every recipe loads into a valid config and carries the paper's settings (Sec. 4.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moquad import config as C

ROOT = Path(__file__).resolve().parents[1]
TRAIN = sorted(p for p in (ROOT / "train").rglob("*.yaml") if not p.name.startswith("_"))
EVAL = sorted(p for p in (ROOT / "eval").glob("*.yaml") if not p.name.startswith("_"))


def test_there_is_a_recipe_per_paper_row():
    names = {p.stem for p in TRAIN}
    # Table 1 rows moquad can run, Table 2 (K400 via k400_r3d50_moquad, SSv2), ablations of Tables 4-6
    assert {"ucf101_r3d18_moquad", "ucf101_r3d18_moquad_dagger", "ucf101_s3dg_moquad_dagger", "k400_r3d18_moquad",
            "k400_r3d18_moquad_dagger", "k400_s3dg_moquad", "k400_s3dg_moquad_dagger", "k400_r3d50_moquad",
            "k400_r3d50_moquad_dagger", "k400_r3d50_moquad_dagger_800ep", "ssv2_r3d50_moquad"} <= names
    assert len([n for n in names if n.startswith("quad_")]) == 8
    assert {f"warmup_{r}" for r in (0, 10, 20, 40, 60)} <= names
    assert len([n for n in names if n.startswith("hard_")]) == 5
    assert {"appearance_be", "appearance_rad_intra", "appearance_rad_inter", "motion_reverse", "motion_shuffle",
            "motion_speed"} <= names


@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.stem)
def test_train_recipe_has_paper_settings(path):
    cfg = C.resolve(C.PretrainConfig(), path, {})
    assert cfg.batch_size == 256 and cfg.optimizer == "lars" and cfg.lr == 3.2
    assert cfg.weight_decay == 1e-6 and cfg.temperature == 0.1
    assert cfg.loader.frames == 16 and cfg.loader.size == 224
    assert cfg.loader.rad_k == 5 and cfg.loader.rad_lambda == (0.1, 0.5)
    assert cfg.epochs in (200, 800)
    assert cfg.epochs == (800 if "ucf101" in path.stem or path.parent.name == "ablations" and "k400" not in path.stem
                          else 200) or "800ep" in path.stem
    if "dagger" in path.stem or path.stem.startswith("warmup_") and path.stem != "warmup_0":
        assert cfg.warmup_ratio in (0.1, 0.2, 0.4, 0.6)
    if "dagger" in path.stem:
        assert (cfg.warmup_ratio, cfg.hard_beta, cfg.hard_alpha) == (0.2, 0.01, 1.5)
    elif path.parent.name == "train":
        assert cfg.warmup_ratio == 0.0 and cfg.hard_beta == 0.0  # plain MoQuad rows: no extra strategies
    assert cfg.method in ("moquad", "simclr")


def test_ablation_switches():
    load = lambda n: C.resolve(C.PretrainConfig(), ROOT / "train" / "ablations" / f"{n}.yaml", {})  # noqa: E731
    assert load("quad_ucf101_simclr").method == "simclr"
    adpos = load("quad_ucf101_adpos").loader
    assert adpos.ad_pos and not adpos.intra_neg and not adpos.ad_intra_neg
    assert load("motion_shuffle").loader.motion_op == "shuffle"
    assert load("appearance_be").loader.appearance_op == "be"
    assert load("warmup_20").warmup_ratio == 0.2 and load("warmup_20").hard_beta == 0.01
    assert (load("hard_b0p05_a1p5").hard_beta, load("hard_b0p05_a1p5").hard_alpha) == (0.05, 1.5)


@pytest.mark.parametrize("path", EVAL, ids=lambda p: p.stem)
def test_eval_recipe(path):
    cfg = C.resolve(C.EvalConfig(), path, {})
    assert cfg.size == 224 and cfg.num_clips == 10
    if path.stem.startswith("finetune"):
        assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.optimizer) == (100, 32, 0.08, "lars")
        assert (cfg.frames, cfg.dilation, cfg.crops) == (16, 2, 3)
    if path.stem.startswith("linear"):
        assert (cfg.epochs, cfg.frames, cfg.dilation) == (100, 32, 2)
