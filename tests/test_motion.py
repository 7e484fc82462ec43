"""The motion report: transforms frame by frame, known-answer encoders, the command end to end."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner
from video_fixtures import coded_dataset, decode_code, make_checkpoint, write_dataset

from moquad.data.store import Split
from moquad.errors import MoquadError
from moquad.eval import motion as M
from moquad.eval.encoders import native_clip, wrap
from moquad.eval.motion_views import video_views

FRAMES, SIZE = 8, 32


def square_video(rng: np.random.Generator, direction: int, frames: int = 32, size: int = 32) -> np.ndarray:
    """A static random texture whose brightness rises over time (the arrow of time, the same everywhere, so a single
    frame cannot tell left from right) and a white square moving 2 px per frame left (-1) or right (+1)."""
    bg = rng.integers(0, 120, (size, size, 3)).astype(np.float64)
    out = np.empty((frames, size, size, 3), np.uint8)
    x0 = int(rng.integers(0, size - 8))
    for t in range(frames):
        f = bg + 3.0 * t
        x = (x0 + direction * 2 * t) % (size - 8)
        f[12:20, x : x + 8] = 255
        out[t] = np.clip(f, 0, 255)
    return out


@pytest.fixture(scope="module")
def squares(tmp_path_factory):
    """24 test videos: classes Left / Right (a built-in direction pair), 32 frames of 32 px."""
    rng = np.random.default_rng(0)
    videos = [(f"v{i:02d}", square_video(rng, -1 if i % 2 == 0 else 1), i % 2) for i in range(24)]
    return write_dataset(tmp_path_factory.mktemp("sq") / "data", videos, split="test", classes=["Left", "Right"],
                         videos_per_shard=8)


class MeanFrame(nn.Module):
    """Appearance only: a fixed random 2D conv of the clip's MEAN frame, pooled to a 4 x 4 grid."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.adaptive_avg_pool2d(self.conv(x.mean(2)).relu(), 4).flatten(1)


class FrameDiff(nn.Module):
    """Motion only: a fixed random 3D conv of the frame DIFFERENCES x[t+1] - x[t] (a still clip gives zeros)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv3d(3, 16, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x[:, :, 1:] - x[:, :, :-1]
        return nn.functional.adaptive_avg_pool3d(self.conv(d).relu(), (1, 4, 4)).flatten(1)


def test_transforms_frame_by_frame_against_direct_indexing(tmp_path):
    """Each view holds exactly the frames a direct index says (coded videos: G = 4 x frame), in order."""
    data = coded_dataset(tmp_path / "coded", num_videos=2, num_frames=48, size=(32, 32))
    split = Split(data, "train")
    views = video_views(split, 1, FRAMES, 1, SIZE)
    assert views.shape == (len(M.VIEWS), 3, FRAMES, SIZE, SIZE) and views.dtype == torch.uint8
    start = {1: (48 - 8) // 2, 2: (48 - 15) // 2, 4: (48 - 29) // 2}  # centred: (frames - span) // 2
    want = {"clip": start[1] + np.arange(8), "crop": start[1] + np.arange(8), "reversed": (start[1] + np.arange(8))[::-1],
            "speed2": start[2] + 2 * np.arange(8), "speed4": start[4] + 4 * np.arange(8), "mirror": start[1] + np.arange(8),
            "still": np.full(8, start[1] + 4)}
    for j, name in enumerate(M.VIEWS):
        got = [decode_code(views[j, :, t].float().mean((1, 2)).numpy()) for t in range(FRAMES)]
        assert got == [(1, int(f)) for f in want[name]], name


def test_mirror_reversal_speed_pixels_equal_the_reference(squares):
    """Pixel for pixel (32 px frames: the crop is the frame): reversed / speed / mirror / still = direct indexing."""
    split = Split(squares, "test")
    allf = torch.from_numpy(split.read_frames(3, np.arange(32))).permute(3, 0, 1, 2)  # (3, T, H, W)
    views = dict(zip(M.VIEWS, video_views(split, 3, FRAMES, 1, SIZE)))
    s1, s2, s4 = 12, 8, 1  # centred starts at dilation 1, 2, 4 of a 32-frame video
    assert torch.equal(views["clip"], allf[:, s1 : s1 + 8])
    assert torch.equal(views["reversed"], allf[:, s1 : s1 + 8].flip(1))
    assert torch.equal(views["speed2"], allf[:, s2 : s2 + 15 : 2])
    assert torch.equal(views["speed4"], allf[:, s4 : s4 + 29 : 4])
    assert torch.equal(views["mirror"], allf[:, s1 : s1 + 8].flip(-1))
    assert torch.equal(views["still"], allf[:, s1 + 4 : s1 + 5].expand(-1, 8, -1, -1))
    assert not torch.equal(views["crop"], views["clip"])  # another crop of the same frames


def test_known_answers(squares):
    """The appearance-only encoder is blind to the arrow of time and to direction; the motion-only one is not."""
    enc = [wrap("mean frame", MeanFrame()), wrap("frame diff", FrameDiff())]
    res = M.motion_report(squares, enc, frames=FRAMES, size=SIZE, show=False, threads=1)
    mean, diff = res["encoders"]["mean frame"], res["encoders"]["frame diff"]
    assert res["data"]["videos"] == 24 and res["data"]["split"] == "test"
    # mean frame: a clip and its reversal have the same mean -> identical features -> chance, distance 0
    assert mean["arrow_of_time_top1"] == 0.5
    assert mean["distance"]["reversed"] == pytest.approx(0.0, abs=1e-9)
    assert mean["ratio_to_crop"]["reversed"] == pytest.approx(0.0, abs=1e-7)
    assert mean["appearance_share"] > 0.6  # 0.71: the mean frame still holds the square's smear
    # frame differences: the brightening scene gives the arrow away; a still clip has no differences at all
    assert diff["arrow_of_time_top1"] == 1.0
    assert diff["ratio_to_crop"]["reversed"] > 1.0  # 1.27: farther from its reversal than from another crop
    assert diff["appearance_share"] < 0.05  # 0.003
    assert diff["speed_top1"] > 0.9
    # direction pair (Left | Right, built in): kNN confuses them with the mean frame, not with the differences
    pair = "Left | Right"
    assert set(diff["direction_pairs"]["pairs"]) == {pair}
    assert diff["direction_pairs"]["pairs"][pair] == 0.0
    assert mean["direction_pairs"]["pairs"][pair] >= 0.3  # 0.54
    print({k: (r["arrow_of_time_top1"], r["ratio_to_crop"]["reversed"], r["appearance_share"],
               r["direction_pairs"]["mean"]) for k, r in res["encoders"].items()})


def test_torchvision_weights_and_export_load_as_the_same_network(tmp_path):
    """A torchvision state dict (head included) and a safetensors export give moquad's / torchvision's features."""
    import torchvision

    from moquad.export import export

    torch.manual_seed(1)
    tv = torchvision.models.video.mc3_18().eval()
    torch.save(tv.state_dict(), tmp_path / "mc3.pth")
    enc = M.load_encoder(f"mc3=mc3_18:{tmp_path / 'mc3.pth'}")
    x = torch.randn(2, 3, 4, 32, 32)
    tv.fc = nn.Identity()
    with torch.no_grad():
        torch.testing.assert_close(enc.net(x), tv(x))
    assert (enc.label, enc.family_name, enc.info["backbone"]) == ("mc3", "torchvision", "mc3_18")
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    weights, _ = export(ckpt, "safetensors", tmp_path / "tiny.safetensors")
    a, b = M.load_encoder(str(ckpt)), M.load_encoder(str(weights))
    assert (a.label, a.family_name, b.label, b.family_name) == ("run", "moquad", "tiny", "moquad")
    assert b.info["card"] is not None and a.info["epoch"] is not None
    with torch.no_grad():
        torch.testing.assert_close(a.net(x), b.net(x))
    with pytest.raises(MoquadError, match="do not fit"):
        M.load_encoder(f"r3d_18:{tmp_path / 'mc3.pth'}")


def test_weights_without_a_clip_run_at_their_rows_native_clip(tmp_path):
    """``moquad motion mvit_v2_s:W.pth`` runs at 16 x 224 (MViT's native clip, from its backbone row), not 16 x 112;
    beside a moquad encoder pre-trained at 8 x 32 the report takes that clip and warns in one line for MViT."""
    import torchvision

    torch.save(torchvision.models.video.mvit_v2_s().state_dict(), tmp_path / "mvit.pth")
    mvit = M.load_encoder(f"mvit_v2_s:{tmp_path / 'mvit.pth'}")
    assert mvit.info["clip"] == {"frames": 16, "size": 224, "dilations": None, "from": "the mvit_v2_s row's native clip"}
    assert M.geometry([mvit], None, None) == (16, 224) and M.clip_warnings([mvit], None, None) == []
    tiny = M.load_encoder(str(make_checkpoint(tmp_path / "tiny" / "checkpoints" / "last.pt",
                                              loader={"frames": 8, "size": 32})))
    assert M.geometry([mvit, tiny], None, None) == (8, 32)  # a clip moquad trained at comes first
    assert M.clip_warnings([mvit, tiny], None, None) == [
        "warning: evaluating at 8x32 but encoder mvit_v2_s-mvit was pre-trained at 16x224 (the report's clip is tiny's)"]
    assert M.clip_warnings([mvit], 16, 112) == [
        "warning: evaluating at 16x112 but encoder mvit_v2_s-mvit was pre-trained at 16x224 (--frames/--size set it)"]
    assert native_clip("r3d_18")["size"] == 112 and native_clip("swin3d_t")["size"] == 224


def test_pairs():
    classes = ["Moving something up", "Moving something down", "Left", "Right", "Other"]
    assert M.resolve_pairs(classes, []) == [(0, 1), (2, 3)]
    assert M.resolve_pairs(classes, [M.parse_pair("Other | left")]) == [(4, 2), (0, 1), (2, 3)]
    with pytest.raises(MoquadError, match="not in this dataset"):
        M.resolve_pairs(classes, [("Other", "Nope")])
    with pytest.raises(MoquadError, match="two class names"):
        M.parse_pair("just one")


def test_command_writes_table_json_png(squares, tmp_path):
    from moquad.cli import app

    ckpt = make_checkpoint(tmp_path / "tiny" / "checkpoints" / "last.pt")
    r = CliRunner().invoke(app, ["motion", str(ckpt), f"again={ckpt}", "--data", str(squares), "--out", str(tmp_path / "m"),
                                 "--frames", "8", "--size", "32", "--max-videos", "10", "--threads", "1", "--pair", "Right|Left"],
                           terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "Motion report" in r.output and "tiny" in r.output
    res = json.loads((tmp_path / "m" / "motion.json").read_text())
    assert list(res["encoders"]) == ["tiny", "again"] and res["data"]["videos"] == 10
    assert res["encoders"]["tiny"] == res["encoders"]["again"] | {"encoder": res["encoders"]["tiny"]["encoder"]}
    assert res["protocol"]["frames"] == 8 and set(res["protocol"]["views"]) == set(M.VIEWS)
    assert (tmp_path / "m" / "motion.png").stat().st_size > 20000
    for args, msg in [([str(tmp_path / "nope.pt")], "not found"), ([str(ckpt), "--pair", "Up|Down"], "not in this"),
                      ([str(ckpt), "--split", "train"], "split 'train' is not")]:
        r = CliRunner().invoke(app, ["motion", *args, "--data", str(squares), "--out", str(tmp_path / "e")])
        assert r.exit_code == 2 and msg in r.output, r.output
    # from Python: write_report(show=False) writes the same files and prints nothing
    import contextlib
    import io

    from moquad import write_report

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        json_path, png = write_report(res, tmp_path / "quiet", show=False)
    assert printed.getvalue() == "" and json.loads(json_path.read_text())["encoders"] == res["encoders"]
    assert png.stat().st_size > 20000 and (tmp_path / "quiet" / "motion.txt").read_text().count("tiny") >= 1
    with contextlib.redirect_stdout(printed):
        write_report(res, tmp_path / "loud")
    assert "Motion report" in printed.getvalue()


def test_pairs_need_labels(tmp_path):
    from moquad.cli import app

    rng = np.random.default_rng(1)
    data = write_dataset(tmp_path / "u", [(f"u{i}", square_video(rng, 1), -1) for i in range(4)], split="test",
                         classes=["Left", "Right"])
    ckpt = make_checkpoint(tmp_path / "c.pt")
    r = CliRunner().invoke(app, ["motion", str(ckpt), "--data", str(data), "--pair", "Left|Right", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "needs labelled videos" in r.output, r.output


@pytest.mark.parametrize("width", [80, 110])
def test_table_headers_wrap_between_words(width):
    """Every word of every header stands whole in the printed table at 80 and 110 columns (never ``appearanc|e``)."""
    from rich.console import Console

    r = {"arrow_of_time_top1": 0.5, "ratio_to_crop": {"reversed": 1.2, "speed2": 0.3, "speed4": 0.5, "mirror": 0.1},
         "speed_top1": 0.333, "appearance_share": 0.9, "direction_pairs": {"mean": 0.5}}
    result = {"data": {"videos": 8, "split": "train"}, "protocol": {"frames": 8, "size": 32},
              "encoders": {"moquad-a-long-run-name": r, "torchvision-r3d_18": r}}
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(M.table(result))
    lines = console.export_text().splitlines()
    header = lines[:next(i for i, line in enumerate(lines) if line.startswith("┡"))]
    words = {w for line in header for cell in line.split("┃") for w in cell.split()}
    for name in M.COLUMNS:
        assert set(name.split()) <= words, (name, words)
    assert max(len(line) for line in lines) <= width
    assert "33.3%" in lines[-2] + lines[-3] + lines[-4]
