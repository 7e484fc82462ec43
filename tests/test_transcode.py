"""ffmpeg transcoding against a direct PyAV decode: counts, order, geometry, rotation, bad input."""

from __future__ import annotations

import subprocess

import av
import numpy as np
import pytest
from PIL import Image
from test_preprocess_layouts import BROKEN, CLIPS, make_broken, pyav_count

from moquad.data.store import decode_frames
from moquad.preprocess.transcode import (
    VideoError,
    ffmpeg_exe,
    mjpeg_qscale,
    output_size,
    split_jpegs,
    transcode,
)


@pytest.mark.parametrize("name", CLIPS)
def test_every_frame_kept_in_display_order(real_videos_dir, name):
    path = real_videos_dir / name
    fr = transcode(path, short_side=64)
    assert fr.num_frames == pyav_count(str(path))
    frames = decode_frames(fr.jpgs, fr.frame_offsets, range(fr.num_frames)).astype(np.float32)
    assert frames.shape[1:] == (fr.height, fr.width, 3) and min(fr.width, fr.height) == 64
    # reference: PyAV frames (display order), resized with PIL; frame i must match reference i best
    with av.open(str(path), metadata_errors="replace") as c:
        ref = [np.asarray(f.to_image().resize((fr.width, fr.height), Image.BILINEAR), np.float32)
               for f in c.decode(c.streams.video[0])]
    step = max(1, fr.num_frames // 24)
    same, shifted = [], []
    for i in range(1, fr.num_frames - 1, step):
        err = [np.abs(frames[i] - ref[j]).mean() for j in (i - 1, i, i + 1)]
        assert err[1] < 12 and err[1] <= min(err[0], err[2]) + 0.5, (i, err)  # near-duplicates tie
        same.append(err[1])
        shifted.append(min(err[0], err[2]))
    assert np.mean(same) < np.mean(shifted)  # off-by-one or reordered frames would flip this


def test_output_size_keeps_aspect_even_and_rotates():
    assert output_size(320, 240, 0, 128) == (170, 128)
    assert output_size(320, 240, 90, 128) == (128, 170)
    assert output_size(320, 240, -90, 128) == (128, 170)
    assert output_size(1920, 1080, 180, 64) == (114, 64)
    assert output_size(33, 21, 0, None) == (32, 20)


def test_rotation_metadata_makes_a_portrait_video(real_videos_dir, tmp_path):
    rot = tmp_path / "rot.mp4"
    subprocess.run([ffmpeg_exe(), "-v", "error", "-display_rotation", "90", "-i", str(real_videos_dir / "part_0.mp4"),
                    "-c", "copy", str(rot)], check=True)
    fr = transcode(rot, short_side=64)
    assert (fr.width, fr.height) == (64, 84) and fr.num_frames == 32
    first = decode_frames(fr.jpgs, fr.frame_offsets, [0])[0]
    assert first.shape == (84, 64, 3)
    # the stored landscape frame rotated by 90 degrees (counter-clockwise) is what we get
    plain = transcode(real_videos_dir / "part_0.mp4", short_side=64)
    land = decode_frames(plain.jpgs, plain.frame_offsets, [0])[0].astype(np.float32)
    ccw = np.asarray(Image.fromarray(land.astype(np.uint8)).transpose(Image.ROTATE_90).resize((64, 84)), np.float32)
    cw = np.asarray(Image.fromarray(land.astype(np.uint8)).transpose(Image.ROTATE_270).resize((64, 84)), np.float32)
    err_ccw, err_cw = np.abs(first - ccw).mean(), np.abs(first - cw).mean()
    assert min(err_ccw, err_cw) < 10 and abs(err_ccw - err_cw) > 5


def test_variable_frame_rate_keeps_every_frame_and_fps_resamples(tmp_path):
    vfr = tmp_path / "vfr.mp4"
    subprocess.run([ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "testsrc=s=96x64:r=25:d=2", "-vf",
                    "setpts='if(lt(N,20),N*2,40+(N-20))'", "-fps_mode", "vfr", "-c:v", "mpeg4", str(vfr)], check=True)
    assert pyav_count(str(vfr)) == 50
    assert transcode(vfr, short_side=32).num_frames == 50
    # fixed rate: duration (20 frames x 2/25 s + 30 frames x 1/25 s = 2.8 s) x 10 fps
    fr = transcode(vfr, short_side=32, fps=10)
    assert abs(fr.num_frames - 28) <= 1 and fr.fps == 10


def test_broken_files_raise_with_reason(real_videos_dir, tmp_path):
    files = make_broken(tmp_path, real_videos_dir)
    for name, reason in BROKEN.items():
        with pytest.raises(VideoError) as err:
            transcode(files[name], short_side=32)
        assert str(err.value).startswith(reason), (name, str(err.value))


def test_split_jpegs_ignores_markers_inside_headers():
    import simplejpeg

    img = np.random.default_rng(0).integers(0, 255, (16, 24, 3), dtype=np.uint8)
    j = simplejpeg.encode_jpeg(img, quality=80)
    # a comment segment that contains SOI/EOI bytes (as an EXIF thumbnail would)
    body = b"x\xff\xd9\xff\xd8y"
    com = b"\xff\xfe" + (len(body) + 2).to_bytes(2, "big") + body
    j2 = j[:2] + com + j[2:]
    data = j + j2 + j
    assert split_jpegs(data) == [0, len(j), len(j) + len(j2), len(data)]
    with pytest.raises(VideoError):
        split_jpegs(data[:-5])


def test_encoders_agree_and_quality_maps(real_videos_dir):
    a = transcode(real_videos_dir / "part_0.mp4", 64, encoder="mjpeg")
    b = transcode(real_videos_dir / "part_0.mp4", 64, encoder="simplejpeg")
    assert (a.num_frames, a.width, a.height) == (b.num_frames, b.width, b.height)
    fa = decode_frames(a.jpgs, a.frame_offsets, range(a.num_frames)).astype(np.float32)
    fb = decode_frames(b.jpgs, b.frame_offsets, range(b.num_frames)).astype(np.float32)
    assert np.abs(fa - fb).mean() < 4
    assert [mjpeg_qscale(q) for q in (100, 90, 85, 75, 1)] == [2, 2, 3, 5, 20]
    with pytest.raises(ValueError, match="encoder"):
        transcode(real_videos_dir / "part_0.mp4", encoder="png")


def test_truncated_matroska_without_frame_count_is_caught_by_duration(real_videos_dir, tmp_path):
    cut = tmp_path / "cut.mkv"
    cut.write_bytes((real_videos_dir / "flipping_a_pancake.mkv").read_bytes()[:150_000])
    with pytest.raises(VideoError, match="^truncated"):
        transcode(cut, short_side=32)


def _clip(path, frames: int):
    subprocess.run([ffmpeg_exe(), "-y", "-v", "error", "-nostdin", "-f", "lavfi", "-i", "testsrc=s=32x24:r=25:d=1",
                    "-frames:v", str(frames), "-c:v", "mpeg4", str(path)], check=True)
    return path


def test_videos_under_the_minimum_length_are_rejected(tmp_path):
    """A one-frame video would make anchor = Intra-Neg = AD-Intra-Neg: rejected, with its own reason."""
    from test_preprocess_layouts import pyav_count

    from moquad.preprocess.transcode import MIN_FRAMES

    one, two = _clip(tmp_path / "one.avi", 1), _clip(tmp_path / "two.avi", 2)
    assert (pyav_count(str(one)), pyav_count(str(two)), MIN_FRAMES) == (1, 2, 2)  # the reference decoder agrees
    with pytest.raises(VideoError, match=r"^too short: 1 frame\(s\), fewer than the 2 a training clip needs"):
        transcode(one, short_side=16)
    assert transcode(two, short_side=16).num_frames == 2


def test_preprocess_puts_short_videos_into_errors_parquet(tmp_path):
    from moquad.config import PreprocessConfig
    from moquad.preprocess.manifest import read_errors
    from moquad.preprocess.run import preprocess

    root = tmp_path / "ds"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        _clip(root / cls / f"{cls}1.avi", 6)
        _clip(root / cls / f"{cls}2.avi", 5)
    _clip(root / "a" / "single.avi", 1)
    summary = preprocess(PreprocessConfig(dataset="folder", root=str(root), out=str(tmp_path / "o"), short_side=16,
                                          workers=1, split_ratios=(0.5, 0.5)), quiet=True)
    assert (summary["ok"], summary["failed"]) == (4, 1)  # counted in the summary
    errors = read_errors(tmp_path / "o").to_pylist()
    assert [(e["video_id"], e["reason"].split(":")[0]) for e in errors] == [("a/single.avi", "too short")]
