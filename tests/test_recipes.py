"""Every recipe resolves to the paper's settings (Sec. 4.1, Tables 1-6) and states only what differs.

The expected values come from the paper's text (``PAPER`` below) and from each row's name
(dataset, backbone, dagger, ablation variable), never from re-reading the YAML values.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moquad import config as C
from moquad import settings
from moquad.errors import MoquadError
from moquad.recipes import RECIPE_ROOT, STAGES, find_recipe, list_recipes, load_recipe, read_recipe_file

ROOT = RECIPE_ROOT  # the packaged recipes: preprocess/, train/, eval/
TRANSFORMERS = ("swin3d_t", "mvit_v2_s")  # not paper rows: their recipes are tested in test_transformers.py


def _paper_row(p: Path) -> bool:
    return (not p.name.startswith("_") and p.stem != "cpu_demo" and not any(a in p.stem for a in TRANSFORMERS)
            and not p.stem.startswith("attentive"))  # V-JEPA 2's protocol, tested in test_attentive.py


TRAIN = sorted(p for p in (ROOT / "train").rglob("*.yaml") if _paper_row(p))
EVAL = sorted(p for p in (ROOT / "eval").glob("*.yaml") if _paper_row(p))
ALL = sorted(p for d in ("train", "eval", "preprocess") for p in (ROOT / d).rglob("*.yaml"))
KIND = {"train": C.PretrainConfig, "eval": C.EvalConfig, "preprocess": C.PreprocessConfig}

# Sec. 4.1 "Self-supervised pre-training", word for word in numbers
PAPER = {
    "frames": 16, "size": 224, "batch_size": 256, "optimizer": "lars", "lr": 3.2, "rad_k": 5,
    "rad_lambda": (0.1, 0.5), "warmup_ratio": 0.2, "hard_beta": 0.01, "hard_alpha": 1.5,
}
EPOCHS = {"k400": 200, "ssv2": 200, "ucf101": 800}  # "trained for 200, 200, and 800 epochs"
BACKBONE = {"r3d18": "r3d_18", "s3dg": "s3d", "r3d50": "r3d_50"}


def paper_view(cfg: C.PretrainConfig) -> dict:
    return {"frames": cfg.loader.frames, "size": cfg.loader.size, "batch_size": cfg.batch_size,
            "optimizer": cfg.optimizer, "lr": cfg.lr, "rad_k": cfg.loader.rad_k, "rad_lambda": cfg.loader.rad_lambda,
            "warmup_ratio": cfg.warmup_ratio, "hard_beta": cfg.hard_beta, "hard_alpha": cfg.hard_alpha}


def test_defaults_are_the_papers_main_setting():
    # the optimizer and its lr are the default backbone's (r3d_18: lars) with lars's setting, filled on resolving
    assert paper_view(settings.resolve(C.PretrainConfig(), None, {})) == PAPER
    cfg = C.PretrainConfig()
    assert (cfg.method, cfg.temperature, cfg.loader.dilations) == ("moquad", 0.1, (1, 2, 4))
    assert (cfg.loader.appearance_op, cfg.loader.motion_ops) == ("rad_inter", ("speed",))
    assert cfg.loader.ad_pos and cfg.loader.intra_neg and cfg.loader.ad_intra_neg
    ev = C.EvalConfig()  # fine-tuning: 100 epochs, batch 32, LARS 0.08, 16 frames at dilation 2; 10 clips per video
    from moquad.train.optimizers import finetune_optimizer

    ft, line = finetune_optimizer(ev.finetune, "lars", "the r3d_18 backbone")  # unset: the backbone row's optimizer
    assert (ft.init, ft.epochs, ft.batch_size, ft.optimizer, ft.lr, ft.weight_decay) == (
        "checkpoint", 100, 32, "lars", 0.08, 1e-4)
    assert line == ("finetune: optimizer lars (the r3d_18 backbone's default), lr 0.08, weight decay 0.0001 (lr, "
                    "weight decay: the paper's fine-tuning setting)")
    assert (ev.frames, ev.dilation, ev.size, ev.num_clips) == (None, None, None, 10)  # the checkpoint's clip
    from moquad.eval.common import with_clip

    paper = with_clip(ev)  # no checkpoint: the paper's pre-training clip, at its evaluation dilation
    assert (paper.frames, paper.dilation, paper.size) == (16, 2, 224)
    assert C.PreprocessConfig().short_side == 256  # 224 crops from full-resolution frames (CVRL)


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


def expected_row(path: Path) -> dict:
    """The settings a row's name implies, on top of ``PAPER``."""
    name, want = path.stem, dict(PAPER)
    if path.parent.name == "ablations":  # Sec. 4.3: R3D-18 on UCF101, plain MoQuad unless the row says otherwise
        want.update(backbone="r3d_18", epochs=800, warmup_ratio=0.0, hard_beta=0.0)
        if m := re.fullmatch(r"warmup_(\d+)", name):
            want.update(warmup_ratio=int(m[1]) / 100, hard_beta=0.01)  # Table 6 right: "+ hard mining 0.01/1.5"
        if m := re.fullmatch(r"hard_b(\w+)_a(\w+)", name):
            beta, alpha = (float(x.replace("p", ".")) for x in m.groups())
            want.update(hard_beta=beta, hard_alpha=alpha or 1.0)  # alpha=0 in the table: mining off
        if name.startswith("quad_k400"):
            want.update(epochs=200)
        return want
    dataset, arch = name.split("_")[:2]
    want.update(backbone=BACKBONE[arch], epochs=800 if name.endswith("800ep") else EPOCHS[dataset])
    if "dagger" not in name:  # plain MoQuad: without the two extra training strategies
        want.update(warmup_ratio=0.0, hard_beta=0.0)
    return want


@pytest.mark.parametrize("path", TRAIN, ids=lambda p: p.stem)
def test_train_recipe_has_paper_settings(path):
    cfg = settings.resolve(C.PretrainConfig(), path, {})
    want = expected_row(path)
    got = {**paper_view(cfg), "backbone": cfg.backbone, "epochs": cfg.epochs}
    assert got == want


def test_ablation_switches():
    load = lambda n: settings.resolve(C.PretrainConfig(), ROOT / "train" / "ablations" / f"{n}.yaml", {})  # noqa: E731
    for ds in ("ucf101", "k400"):
        assert load(f"quad_{ds}_simclr").method == "simclr"
        switches = {part: (load(f"quad_{ds}_{part}").loader.intra_neg, load(f"quad_{ds}_{part}").loader.ad_intra_neg)
                    for part in ("adpos", "adpos_intraneg", "full")}
        assert switches == {"adpos": (False, False), "adpos_intraneg": (True, False), "full": (True, True)}
    for op in ("be", "rad_intra", "rad_inter"):
        assert load(f"appearance_{op}").loader.appearance_op == op
    for op in ("reverse", "shuffle", "speed"):
        assert load(f"motion_{op}").loader.motion_ops == (op,)


@pytest.mark.parametrize("path", EVAL, ids=lambda p: p.stem)
def test_eval_recipe(path):
    from moquad.eval.common import with_clip

    raw = settings.resolve(C.EvalConfig(), path, {})
    assert raw.size is None  # every protocol tests at the checkpoint's crop size
    assert raw.frames == (32 if path.stem.startswith("linear") else None)  # the paper's linear protocol: 32 frames
    cfg = with_clip(raw)  # no checkpoint: the paper's pre-training clip (16 x 224)
    # "densely samples 10 clips from each video"; retrieval: 10 uniform clips averaged
    assert (cfg.size, cfg.num_clips) == (224, 10)
    if path.stem.startswith("finetune"):  # 100 epochs, batch 32, LARS 0.08, 16 frames dilation 2, 3-crop test
        from moquad.train.optimizers import finetune_optimizer

        ft = finetune_optimizer(cfg.finetune, "lars", "the r3d_18 backbone")[0]  # a CNN's default: the paper's
        assert (ft.epochs, ft.batch_size, ft.lr, ft.optimizer) == (100, 32, 0.08, "lars")
        assert (cfg.frames, cfg.dilation, cfg.crops) == (16, 2, 3)
    if path.stem.startswith("linear"):  # 32 frames at stride 2, 100 epochs, 3-crop test
        assert (cfg.linear.epochs, cfg.linear.batch_size, cfg.frames, cfg.dilation, cfg.crops) == (100, 32, 32, 2, 3)
    if path.stem.startswith("retrieval"):
        assert (cfg.frames, cfg.crops) == (16, 1) and {1, 5, 10} <= set(cfg.ks)
    # each benchmark's own splits: UCF101 / HMDB51 train / test; SSv2 (test unlabelled) and K400 (Table 2) train / val
    dataset = path.stem.split("_")[1]
    assert (cfg.train_split, cfg.test_split) == ("train", "val" if dataset in ("ssv2", "k400") else "test")
    protocol = getattr(cfg, path.stem.split("_")[0], None)  # linear / finetune settings
    if protocol is not None:  # SSv2's classes are left/right-sensitive: no flip of its training clips
        assert protocol.flip == (dataset != "ssv2")


@pytest.mark.parametrize("path", sorted((ROOT / "preprocess").glob("*.yaml")), ids=lambda p: p.stem)
def test_preprocess_recipe(path):
    cfg = settings.resolve(C.PreprocessConfig(), path, {})
    # paper datasets at short side 256 for 224 crops; the *_small / folder recipes at 128 for 112 crops
    assert cfg.short_side == (128 if path.stem in ("folder", "ucf101_small") else 256)
    assert cfg.dataset == path.stem.split("_")[0]


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recipe_states_only_what_differs(path):
    """No key repeats the value it already has from the defaults (and the recipe's base)."""
    kind = KIND[path.relative_to(ROOT).parts[0]]
    own = read_recipe_file(path)
    base = own.pop("base", None)
    for key in ("description", "paper"):
        own.pop(key, None)
    start = C.update(kind(), load_recipe(path.parent / base)) if base else kind()
    redundant = [(k, v) for k, v in own.items() if not isinstance(v, dict) and C.update(start, {k: v}) == start]
    redundant += [(f"{k}.{kk}", vv) for k, v in own.items() if isinstance(v, dict)
                  for kk, vv in v.items() if C.update(start, {k: {kk: vv}}) == start]
    assert not redundant, f"{path.name} restates defaults: {redundant}"


def test_recipes_ship_as_package_data():
    """Every recipe file matches a package-data glob of pyproject.toml, so a plain `pip install` has it."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["moquad.recipes"]
    files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.yaml")]
    assert len(files) == len(ALL) > 40
    assert [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)] == []


def test_a_recipe_by_name_by_old_path_and_by_file(tmp_path, monkeypatch):
    want = ROOT / "train" / "ucf101_r3d18_moquad.yaml"
    assert find_recipe("ucf101_r3d18_moquad", "train") == want  # a name, in the command's stage
    assert find_recipe("ucf101_r3d18_moquad") == want  # unique across stages
    assert find_recipe("train/ucf101_r3d18_moquad.yaml") == want  # the path it had at the checkout's top level
    assert find_recipe("train/ucf101_r3d18_moquad", "eval") == want  # the stage spelled out wins
    assert find_recipe("ablations/warmup_0", "train") == ROOT / "train" / "ablations" / "warmup_0.yaml"
    assert find_recipe("cpu_demo", "eval") == ROOT / "eval" / "cpu_demo.yaml"
    with pytest.raises(MoquadError, match="ambiguous.*train/cpu_demo.yaml.*eval/cpu_demo.yaml"):
        find_recipe("cpu_demo")
    assert load_recipe("ucf101_r3d18_moquad", stage="train") == load_recipe(want)
    assert load_recipe("ucf101_r3d18_moquad", stage="train")["epochs"] == 800
    monkeypatch.chdir(tmp_path)  # a file of that name in the working folder comes first
    (tmp_path / "ucf101_r3d18_moquad").write_text("epochs: 3\n")
    assert load_recipe("ucf101_r3d18_moquad", stage="train") == {"epochs": 3}
    with pytest.raises(FileNotFoundError, match="moquad recipes"):
        load_recipe("no_such_recipe", stage="train")


def test_list_recipes():
    listed = list_recipes()
    assert [r["stage"] for r in listed] == sorted((r["stage"] for r in listed), key=STAGES.index)
    got = {(r["stage"], r["name"]) for r in listed}
    want = {(p.relative_to(ROOT).parts[0], p.relative_to(ROOT / p.relative_to(ROOT).parts[0]).with_suffix("").as_posix())
            for p in ALL if not p.name.startswith("_")}
    assert got == want and ("train", "ablations/warmup_0") in got
    row = next(r for r in listed if r["name"] == "ucf101_r3d18_moquad")
    assert row["description"] == " ".join(read_recipe_file(ROOT / "train" / "ucf101_r3d18_moquad.yaml")["description"].split())
    assert all(r["description"] for r in listed)



def test_the_api_takes_a_recipe_name_as_each_command_does():
    """``moquad.resolve_config`` looks a bare name up in its config's stage, as ``moquad pretrain --recipe cpu_demo``
    and ``moquad retrieve --recipe cpu_demo`` do: ``cpu_demo`` is in two stages, and neither call is ambiguous."""
    import moquad

    train = moquad.resolve_config(moquad.PretrainConfig(), "cpu_demo", {"data": "data/shards"})
    assert train == settings.resolve(C.PretrainConfig(), ROOT / "train" / "cpu_demo.yaml", {"data": "data/shards"})
    assert (train.backbone, train.epochs, train.data) == ("tiny", 60, "data/shards")
    ev = moquad.resolve_config(moquad.EvalConfig(), "cpu_demo", {})
    assert ev == settings.resolve(C.EvalConfig(), ROOT / "eval" / "cpu_demo.yaml", {})
    assert ev != C.EvalConfig() and settings.recipe_stage(C.EvalConfig) == "eval"
    assert settings.recipe_stage(C.PreprocessConfig) == "preprocess" and settings.recipe_stage(C.ExportConfig) is None
    with pytest.raises(FileNotFoundError, match="moquad recipes"):  # a train recipe is no evaluation recipe
        moquad.resolve_config(moquad.EvalConfig(), "ucf101_r3d18_moquad", {})
