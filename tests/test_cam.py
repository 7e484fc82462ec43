"""CAM: the activation maths against the CAM identity, strips from a video_id and from a raw file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from moquad.eval.cam import activation, cam
from moquad.models.hooks import pool_input


def test_classifier_cam_identity_and_projection():
    torch.manual_seed(0)
    fmap = torch.randn(1, 6, 2, 3, 3)
    fc = nn.Linear(6, 4)
    amap, info = activation(fmap, "classifier", fc=fc)
    logits = fc(fmap[0].mean((1, 2, 3)))
    assert info["pred"] == int(logits.argmax())
    # Zhou et al.: the class score equals the spatial-temporal mean of its CAM plus the bias
    torch.testing.assert_close(amap.mean() + fc.bias[info["pred"]], logits[info["pred"]])
    ref = sum(fc.weight[info["pred"], c] * fmap[0, c] for c in range(6))
    torch.testing.assert_close(amap, ref)
    norm, _ = activation(fmap, "norm")
    torch.testing.assert_close(norm[1, 2, 0], fmap[0, :, 1, 2, 0].norm())
    head = nn.Linear(6, 3)
    proj, _ = activation(fmap, "projection", head=head)
    z = nn.functional.normalize(head(fmap[0, :, 0, 1, 1]), dim=0)
    zc = nn.functional.normalize(head(fmap[0].mean((1, 2, 3))), dim=0)
    torch.testing.assert_close(proj[0, 1, 1], z @ zc)
    with pytest.raises(ValueError, match="finetune"):
        activation(fmap, "classifier")


def test_pool_input_is_the_pre_pool_map():
    from moquad.models import build_model

    bb = build_model("tiny", 16, 32).backbone.eval()
    x = torch.randn(1, 3, 4, 32, 32)
    fmap = pool_input(bb, x)
    torch.testing.assert_close(fmap.mean((2, 3, 4)), bb(x))


def test_cam_strip_from_video_id_and_finetuned_classifier(tmp_path):
    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    from moquad.models import build_model

    data = make_tiny_dataset(tmp_path / "data", {"train": 3, "test": 2}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    cfg = eval_cfg(data, ckpt, tmp_path / "out")
    png = cam("test/v_Red_00.avi", cfg, str(tmp_path / "strips"))
    assert png.name == "cam_test_v_Red_00_avi.png" and png.read_bytes()[:4] == b"\x89PNG"
    meta = json.loads(png.with_suffix(".json").read_text())
    assert meta["method"] == "projection" and meta["source"]["class_name"] == "Red"
    assert len(meta["source"]["frame_indices"]) == 4 and len(meta["checkpoint"]["sha256"]) == 64
    from moquad.record import environment

    assert meta["environment"] == json.loads(json.dumps(environment()))  # commit, lock, machine: as every result

    # a fine-tuned classifier from this checkpoint in the output folder is picked up by "auto"
    from moquad.digest import sha256_file

    bb = build_model("tiny", 16, 32).backbone
    fc = nn.Linear(64, 3)
    (tmp_path / "out").mkdir(exist_ok=True)
    torch.save({"backbone": bb.state_dict(), "classifier": fc.state_dict(), "classes": ["Red", "Green", "Blue"],
                "config": {"backbone": "tiny", "proj_dim": 16, "proj_hidden": 32},
                "source_sha256": sha256_file(ckpt)}, tmp_path / "out" / "finetune_model.pt")
    png2 = cam("train/v_Green_01.avi", cfg, str(tmp_path / "x.png"))
    meta2 = json.loads(png2.with_suffix(".json").read_text())
    assert png2 == tmp_path / "x.png" and meta2["method"] == "classifier"
    assert meta2["pred_class"] in ("Red", "Green", "Blue") and 0 < meta2["prob"] <= 1
    with pytest.raises(FileNotFoundError, match="neither a video file"):
        cam("no/such/video", cfg, str(tmp_path))


def test_cam_from_raw_video_file(real_videos_dir, tmp_path):
    from test_features import make_checkpoint

    from moquad.config import EvalConfig

    video = real_videos_dir / "v_SoccerJuggling_g23_c01.avi"
    if not video.is_file():
        pytest.skip("clip not present")
    cfg = EvalConfig(checkpoint=str(make_checkpoint(tmp_path / "c.pt")), frames=4, dilation=2, size=32,
                     out=str(tmp_path))
    png = cam(str(video), cfg, str(tmp_path), method="norm")
    meta = json.loads(png.with_suffix(".json").read_text())
    assert meta["method"] == "norm" and meta["source"]["num_frames"] > 4
    assert np.diff(meta["source"]["frame_indices"]).tolist() == [2, 2, 2]


def test_strip_has_a_colour_bar_and_source_frame_numbers():
    """Each column is labelled with the frame number in the source video; a colour bar gives the scale."""
    import matplotlib.pyplot as plt

    from moquad.eval.cam import strip_figure

    clip = torch.randint(0, 255, (3, 8, 16, 16), dtype=torch.uint8)
    amap = np.random.default_rng(0).random((8, 16, 16))
    source = [105, 109, 113, 117, 121, 125, 129, 133]
    fig = strip_figure(clip, amap, "v", 4, source)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["frame 105", "frame 113", "frame 125", "frame 133"]  # columns round(linspace(0, 7, 4))
    bars = [ax for ax in fig.axes if ax.get_ylabel() == "activation" and not ax.images]  # the colour bar axis
    assert len(bars) == 1 and bars[0].get_ylim() == (0.0, 1.0)
    plt.close(fig)


@pytest.mark.parametrize("kind", ["noise", "no video stream", "truncated"])
def test_a_file_that_is_not_a_video_is_one_error_line(tmp_path, kind):
    """``moquad cam`` on a file that is not a readable video: one ``error:`` line naming it, exit code 2."""
    from test_features import make_checkpoint
    from test_video_file import bad_videos
    from typer.testing import CliRunner

    from moquad.cli import app

    video = bad_videos(tmp_path / "videos")[kind]
    ckpt = make_checkpoint(tmp_path / "c.pt")
    r = CliRunner().invoke(app, ["cam", str(video), "--checkpoint", str(ckpt), "--out", str(tmp_path / "o.png"),
                                 "--frames", "4", "--size", "32"], terminal_width=200)
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1, r.output
    assert f"{video}: not a readable video" in errors[0] and "re-encode it" in errors[0]
    assert "Traceback" not in r.output and not (tmp_path / "o.png").exists()


def _cam_cli(*args):
    from typer.testing import CliRunner

    from moquad.cli import app
    from moquad.eval import common

    common._encoder.cache_clear()
    return CliRunner().invoke(app, ["cam", *map(str, args)], terminal_width=200)


def test_cam_of_a_torchvision_weights_file_is_its_last_feature_map(tmp_path):
    """``moquad cam VIDEO --encoder torchvision:r3d_18:W.pth`` writes a strip; the map is the norm of the feature
    map entering torchvision's own network's average pool (its forward, hooked independently), framed and
    normalised as its Kinetics weights' transforms say."""
    import torchvision.models.video as tvv
    from test_video_file import write_avi

    from moquad.config import EvalConfig
    from moquad.eval.cam import activation_map, load_clip
    from moquad.eval.encoders import load_encoder

    torch.manual_seed(0)
    ref = tvv.r3d_18().eval()
    torch.save(ref.state_dict(), tmp_path / "W.pth")
    video = write_avi(tmp_path / "v.avi", frames=16, height=48, width=64)
    r = _cam_cli(video, "--encoder", f"torchvision:r3d_18:{tmp_path / 'W.pth'}", "--frames", "4", "--size", "32",
                 "--out", tmp_path / "cam.png")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cam.png").read_bytes()[:4] == b"\x89PNG"
    meta = json.loads((tmp_path / "cam.json").read_text())
    assert meta["method"] == "norm" and meta["encoder"]["family"] == "torchvision"
    assert meta["encoder"]["framing"]["resize"] == 128 and "short side 36, centre crop 32" in meta["clip"]
    enc = load_encoder(f"torchvision:r3d_18:{tmp_path / 'W.pth'}")
    clip, _ = load_clip(str(video), EvalConfig(checkpoint="x", frames=4, size=32, dilation=2), enc.framing)
    x = enc.normalize(clip[None], "cpu")
    with torch.no_grad():
        amap, _ = activation_map(enc, x, "norm")
        seen = []
        ref.avgpool.register_forward_pre_hook(lambda _m, inp: seen.append(inp[0]))
        ref(x)
    torch.testing.assert_close(amap, seen[0][0].norm(dim=0))


def test_cam_of_a_hugging_face_folder_is_its_token_grid(tmp_path):
    """``moquad cam VIDEO --encoder hf:FOLDER`` writes a strip; the map is the norm of each of the model's output
    tokens on its (t, h, w) grid (the library's forward), as the attentive probe reads them."""
    pytest.importorskip("transformers")
    from test_encoders import save
    from test_video_file import write_avi

    from moquad.config import EvalConfig
    from moquad.eval.cam import activation_map, load_clip
    from moquad.eval.encoders import load_encoder

    folder, model, _ = save(tmp_path, "videomae")
    video = write_avi(tmp_path / "v.avi", frames=20, height=48, width=64)
    r = _cam_cli(video, "--encoder", f"hf:{folder}", "--out", tmp_path / "cam.png")
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "cam.json").read_text())
    assert (tmp_path / "cam.png").is_file() and meta["method"] == "norm" and meta["encoder"]["family"] == "videomae"
    assert meta["encoder"]["framing"] == {**meta["encoder"]["framing"], "resize": 224, "crop": 224}
    enc = load_encoder(f"hf:{folder}")
    clip, _ = load_clip(str(video), EvalConfig(checkpoint="x", frames=8, size=32, dilation=4), enc.framing)
    x = enc.normalize(clip[None], "cpu")
    with torch.no_grad():
        amap, _ = activation_map(enc, x, "norm")
        tokens = model(x.transpose(1, 2)).last_hidden_state[0]  # (t * h * w, C), time-major
    torch.testing.assert_close(amap, tokens.norm(dim=1).reshape(4, 4, 4))


def test_a_raw_videos_clip_is_framed_from_its_own_frames(tmp_path):
    """A raw file's clip is the encoder's framing applied to the file's frames at their own size (decoded here
    with PyAV alone): torchvision's Kinetics weights resize without antialiasing, so a frame shrunk first (an
    antialiased filter) would give other pixels than their transforms."""
    import av
    import torchvision.transforms.v2.functional as TF

    from moquad.config import EvalConfig
    from moquad.eval.cam import load_clip
    from moquad.eval.encoders import load_encoder

    torch.save(__import__("torchvision").models.video.r3d_18().state_dict(), tmp_path / "W.pth")
    enc = load_encoder(f"torchvision:r3d_18:{tmp_path / 'W.pth'}")
    video = tmp_path / "v.avi"  # fine stripes, which an antialiased shrink blurs and a plain one does not
    with av.open(str(video), "w", format="avi") as out:
        stream = out.add_stream("mpeg4", rate=8, options={"qscale": "1"})
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        for i in range(16):
            img = np.zeros((96, 128, 3), np.uint8)
            img[:, (np.arange(128) + i) % 4 < 2] = 230
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    clip, info = load_clip(str(video), EvalConfig(checkpoint="x", frames=4, size=32, dilation=3), enc.framing)
    with av.open(str(video)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    # 16 frames, 4 x dilation 3 spans 10: the middle clip starts at 3; short side 32 * 128 / 112 -> 36, long 48
    assert info["frame_indices"] == [3, 6, 9, 12] and info["num_frames"] == 16
    x = torch.from_numpy(frames[[3, 6, 9, 12]]).permute(0, 3, 1, 2).float()
    want = TF.resize(x, [36, 48], antialias=False)[:, :, 2:34, 8:40].round().clamp(0, 255).to(torch.uint8)
    assert torch.equal(clip, want.permute(1, 0, 2, 3))
