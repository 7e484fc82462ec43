"""Every evaluation command on any encoder name: a tiny random Hugging Face model (``hf:FOLDER``, VideoMAE: a
fixed 8-frame 32 px clip) and a torchvision model at random init (``torchvision:r3d_18``), end to end through the
CLI; the values are checked against the encoder's own forward (:func:`moquad.eval.encoders.load_encoder`) or the
cached features. Bad names: one ``error:`` line that names the fix, exit 2, nothing written."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from test_encoders import save
from test_features import make_tiny_dataset
from typer.testing import CliRunner

from moquad.data.store import Split
from moquad.digest import sha256_file
from moquad.eval import clips, common
from moquad.eval.encoders import load_encoder
from moquad.eval.features import read_features

T = pytest.importorskip("transformers")

# name -> the clip flags it runs with: VideoMAE at its native clip (none given), r3d_18 at a small one
ENCODERS = {"hf": (), "torchvision": ("--frames", "4", "--size", "32")}
FAST = ("--num-clips", "2", "--set", "workers=0", "--set", "batch_size=8", "--device", "cpu")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The data (9 train, 6 test videos of 3 classes) and the two encoder names."""
    root = tmp_path_factory.mktemp("encoders")
    folder, _, _ = save(root, "videomae")
    return make_tiny_dataset(root / "data"), {"hf": f"hf:{folder}", "torchvision": "torchvision:r3d_18"}


def cli(*args: str):
    from moquad.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], terminal_width=200)


def _run(world, tmp_path, command: str, kind: str, *extra: str):
    data, names = world
    out = tmp_path / f"{command}-{kind}"
    r = cli(command, "--data", data, "--encoder", names[kind], "--out", out, *ENCODERS[kind], *FAST, *extra)
    assert r.exit_code == 0, r.output
    return out, names[kind]


@pytest.mark.parametrize("kind", ENCODERS)
def test_extract_is_the_encoders_forward(world, tmp_path, kind):
    """Each cached feature is the mean over the video's views of load_encoder(NAME)'s forward on the same clips,
    framed as the family's authors frame them; VideoMAE's unset clip is its own (8 frames of 32 px at its frame step
    4)."""
    out, name = _run(world, tmp_path, "extract", kind, "--split", "test")
    feats = read_features(out / "features" / "test.lance")
    proto = feats["metadata"]["protocol"]
    clip = (proto["frames"], proto["size"], proto["dilation"])
    assert clip == ((8, 32, 4) if kind == "hf" else (4, 32, 2))
    enc = load_encoder(name)
    split = Split(world[0], "test")
    views = clips.TestViews(split, list(range(len(split))), *clip[:1], clip[2], 2, clip[1], 1, enc.framing)
    with torch.no_grad():
        want = np.stack([enc(enc.normalize(views[i][1], "cpu")).mean(0).numpy() for i in range(len(split))])
    assert feats["embedding"].shape == (6, enc.out_dim) and np.abs(want).mean() > 1e-3
    np.testing.assert_allclose(feats["embedding"], want, atol=1e-5, rtol=1e-4)
    assert feats["metadata"]["checkpoint_sha256"] == enc.sha256() and proto["normalize"] == enc.norm.source
    assert proto["resize"].startswith(enc.framing.text(32))  # torchvision: short side 36 (its 128 for a 112 crop)
    cached = (out / "features" / "test.lance").stat().st_ino
    _run(world, tmp_path, "extract", kind, "--split", "test")  # the same encoder, clip and data: the cache is kept
    assert (out / "features" / "test.lance").stat().st_ino == cached


@pytest.mark.parametrize("kind", ENCODERS)
def test_retrieve_hits_are_the_cached_features_nearest(world, tmp_path, kind):
    out, name = _run(world, tmp_path, "retrieve", kind, "--set", "ks=1,5")
    res = json.loads((out / "retrieval.json").read_text())
    q, g = read_features(out / "features" / "test.lance"), read_features(out / "features" / "train.lance")
    unit = [f["embedding"] / np.linalg.norm(f["embedding"], axis=1, keepdims=True) for f in (q, g)]
    nearest = (unit[0] @ unit[1].T).argmax(1)
    assert res["top1"] == pytest.approx(float((g["label"][nearest] == q["label"]).mean()))
    assert (res["encoder"]["spec"], res["checkpoint"]["path"]) == (name, name)
    assert res["encoder"]["family"] == ("videomae" if kind == "hf" else "torchvision")
    framing = load_encoder(name).framing  # the result names the framing its views were made with
    assert res["encoder"]["framing"]["resize"] == framing.resize and res["clip"]["short_side"] == framing.short_side(32)
    assert res["protocol"]["framing"].startswith(f"short side {framing.short_side(32)}, centre crop 32")


@pytest.mark.parametrize("kind", ENCODERS)
def test_linear_and_attentive_record_protocol_and_encoder(world, tmp_path, kind):
    out, name = _run(world, tmp_path, "linear", kind)
    lin = json.loads((out / "linear_fast.json").read_text())
    assert lin["task"] == "linear" and lin["encoder"]["spec"] == name and lin["videos"] == 6
    assert lin["top1"] == pytest.approx(np.trace(lin["confusion"]) / 6)
    out, _ = _run(world, tmp_path, "linear", kind, "--full", "--set", "linear.epochs=1", "--set",
                  "linear.batch_size=4")
    cvrl = json.loads((out / "linear_cvrl.json").read_text())
    assert cvrl["encoder"]["spec"] == name and "unchanged" in cvrl["protocol"]["backbone_check"]
    out, _ = _run(world, tmp_path, "attentive", kind, "--set", "attentive.heads=4", "--set", "attentive.epochs=2",
                  "--set", "attentive.depth=1", "--set", "attentive.batch_size=4")
    att = json.loads((out / "attentive.json").read_text())
    assert att["task"] == "attentive" and "V-JEPA 2" in att["protocol"]["variant"]
    assert att["encoder"]["spec"] == name and att["views"] == {"clips": 2, "crops": 1, "per_video": 2}
    assert att["top1"] == pytest.approx(np.trace(att["confusion"]) / 6)
    tokens = np.load(out / "tokens" / "test.npy", mmap_mode="r")  # (videos, crops, clips x t x h x w, C)
    assert tokens.shape == ((6, 1, 2 * 4 * 4 * 4, 32) if kind == "hf" else (6, 1, 2 * 1 * 2 * 2, 512))


@pytest.mark.parametrize("kind", ENCODERS)
def test_finetune_trains_the_whole_encoder(world, tmp_path, kind):
    out, name = _run(world, tmp_path, "finetune", kind, "--set", "finetune.epochs=1", "--set",
                     "finetune.batch_size=4", "--set", "finetune.optimizer=adamw", "--set", "finetune.lr=0.001")
    res = json.loads((out / "finetune.json").read_text())
    assert res["encoder"]["spec"] == name and "end to end" in res["protocol"]["init"]
    saved = torch.load(out / "finetune_model.pt", weights_only=True)
    enc = load_encoder(name)
    start = (enc.net if "backbone" in enc.info else enc).state_dict()  # a torchvision trunk, or the whole hf encoder
    moved = [k for k, v in saved["backbone"].items() if v.is_floating_point() and not torch.equal(v, start[k])]
    assert len(moved) > len(start) // 2  # trained end to end, not only the head
    assert saved["classifier"]["weight"].shape == (len(saved["classes"]), load_encoder(name).out_dim)


def test_motion_takes_both_names(world, tmp_path):
    data, names = world
    r = cli("motion", names["hf"], "--encoder", names["torchvision"], "--data", data, "--out", tmp_path / "m",
            "--split", "train", "--threads", "1")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "m" / "motion.json").read_text())
    hf, tv = (res["encoders"][k] for k in ("videomae-2", "r3d_18"))
    assert (res["protocol"]["frames"], res["protocol"]["size"]) == (8, 32)  # the first encoder's native clip
    assert (hf["feature_dim"], tv["feature_dim"]) == (32, 512)
    assert hf["encoder"]["normalize"]["source"].startswith("its VideoMAEVideoProcessor")


def test_checkpoint_still_means_a_moquad_checkpoint(world, tmp_path):
    """--checkpoint RUN/checkpoints/last.pt: as before (RUN/eval, the checkpoint's clip), no encoder record."""
    from video_fixtures import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", loader={"frames": 4, "size": 32})
    r = cli("extract", "--data", world[0], "--checkpoint", ckpt, "--split", "test", *FAST)
    assert r.exit_code == 0, r.output
    meta = read_features(tmp_path / "run" / "eval" / "features" / "test.lance")["metadata"]
    assert meta["protocol"]["frames"] == 4 and "encoder" not in meta["protocol"]
    assert meta["checkpoint_sha256"] == sha256_file(ckpt)


# ----------------------------------------------------------------------------- bad input


def _refused(args, says: str, out) -> None:
    common._encoder.cache_clear()  # the loaded encoders of this process: each case loads anew
    r = cli(*args)
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1 and says in errors[0], r.output
    assert not out.exists()  # nothing half-written


def test_bad_encoders_are_one_line_each(world, tmp_path, monkeypatch):
    data, names = world
    out = tmp_path / "never"
    base = ("extract", "--data", data, "--out", out, "--split", "test")
    _refused((*base, "--encoder", names["hf"], "--frames", "6"), "takes exactly 8 frames of exactly 32 x 32 px, not "
             "6 frames of 32 px; pass --frames 8", out)
    _refused((*base, "--encoder", "torchvision:resnet50"), "'resnet50' is not a torchvision video model moquad "
             "reads", out)
    image = T.ViTModel(T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                   image_size=32, patch_size=8))
    image.save_pretrained(tmp_path / "vit")
    _refused((*base, "--encoder", f"hf:{tmp_path / 'vit'}"), "is a 'vit' model, not one of the video encoders", out)
    _refused((*base, "--encoder", "torchvision:s3d", "--frames", "4", "--size", "32"), "cannot take 4 frames of 32 px: "
             "its layers shrink that clip to nothing", out)  # S3D's pooling (a blank clip tried before any video)
    _refused(("motion", "torchvision:s3d", "--data", data, "--out", out, "--frames", "8", "--size", "16"),
             "cannot take 8 frames of 16 px", out)
    _refused(("attentive", "--data", data, "--encoder", names["torchvision"], "--out", out, "--heads", "5"),
             "heads (5) must divide the token width (512); pass --heads N", out)  # before any token is extracted
    _refused(("retrieve", "--data", data, "--encoder", names["torchvision"]), "has no run folder to put the results "
             "beside; pass --out DIR", tmp_path / "x")

    def offline(*_a, **_k):
        raise OSError("network is unreachable")

    monkeypatch.setattr(T.AutoConfig, "from_pretrained", offline)
    _refused((*base, "--encoder", "hf:facebook/vjepa2-vitl-fpc64-256"), "download it where the hub is reachable "
             "(hf download facebook/vjepa2-vitl-fpc64-256 --local-dir DIR) and pass hf:DIR", out)
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    _refused((*base, "--encoder", names["hf"]), "run pip install -e '.[hf]'", out)


# ----------------------------------------------------------------------------- every family


@pytest.mark.parametrize("family", ["vjepa2", "timesformer", "vivit", "xclip", "xclip_vision"])
def test_motion_and_retrieve_on_every_hf_family(world, tmp_path, family):
    """Each Hugging Face family (VideoMAE: above) through both commands at its native clip; retrieval's hit@1 is
    the cached features' nearest neighbour."""
    folder, _, _ = save(tmp_path, family)
    data = world[0]
    r = cli("motion", f"hf:{folder}", "--data", data, "--out", tmp_path / "m", "--split", "train", "--threads", "1")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "m" / "motion.json").read_text())["encoders"][folder.name]
    assert res["encoder"]["family"] == family.split("_")[0] and 0 <= res["appearance_share"] <= 1
    r = cli("retrieve", "--data", data, "--encoder", f"hf:{folder}", "--out", tmp_path / "r", *FAST)
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "r" / "retrieval.json").read_text())
    q, g = (read_features(tmp_path / "r" / "features" / f"{s}.lance") for s in ("test", "train"))
    unit = [f["embedding"] / np.linalg.norm(f["embedding"], axis=1, keepdims=True) for f in (q, g)]
    assert res["top1"] == pytest.approx(float((g["label"][(unit[0] @ unit[1].T).argmax(1)] == q["label"]).mean()))
    assert res["clip"]["frames"] == 8 and res["clip"]["size"] == 32


@pytest.mark.slow
def test_motion_on_every_torchvision_model(world, tmp_path):
    archs = ("r3d_18", "mc3_18", "r2plus1d_18", "s3d", "mvit_v2_s", "swin3d_t")
    r = cli("motion", *(f"torchvision:{a}" for a in archs), "--data", world[0], "--out", tmp_path / "m", "--split",
            "train", "--frames", "16", "--size", "32", "--threads", "1")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "m" / "motion.json").read_text())["encoders"]
    assert list(res) == list(archs) and all(r["encoder"]["weights"] == "random init (seed 0)" for r in res.values())
    for arch in archs:  # retrieval too: its hit@1 is the cached features' nearest neighbour's label
        out = tmp_path / f"r_{arch}"
        r = cli("retrieve", "--data", world[0], "--encoder", f"torchvision:{arch}", "--out", out, "--frames", "8",
                "--size", "32", *FAST)
        assert r.exit_code == 0, r.output
        q, g = (read_features(out / "features" / f"{s}.lance") for s in ("test", "train"))
        unit = [f["embedding"] / np.linalg.norm(f["embedding"], axis=1, keepdims=True) for f in (q, g)]
        top1 = float((g["label"][(unit[0] @ unit[1].T).argmax(1)] == q["label"]).mean())
        assert json.loads((out / "retrieval.json").read_text())["top1"] == pytest.approx(top1), arch
