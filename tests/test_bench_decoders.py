"""benchmarks/bench_decoders.py: its ``--tiny`` run (a subprocess: torchcodec needs FFmpeg on LD_LIBRARY_PATH, which
only a fresh process reads) prints the table and records it, and every source builds the quadruples from the same
frames."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REAL = next((p / "shared" / "data" / "real-videos" for p in ROOT.parents
             if (p / "shared" / "data" / "real-videos").is_dir()), None)
PEERS = {"torchcodec": "torchcodec", "decord2": "decord"}  # row name -> module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The smoke run: 8 copies of a 1 s clip, one epoch, every installed source; its stdout, JSON and record."""
    if REAL is None:
        pytest.skip("real clips (../shared/data/real-videos) not found")
    out = tmp_path_factory.mktemp("bench_decoders")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_decoders.py"), "--tiny", "--cache",
                          str(out / "cache"), "--json", str(out / "r.json"), "--record", str(out / "record.json")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout, json.loads((out / "r.json").read_text()), json.loads((out / "record.json").read_text())


def test_tiny_prints_and_records_the_table(tiny):
    stdout, res, record = tiny
    rate = res["tiny"]["rate"]
    assert res["tiny"]["quads"] == 8 and set(rate) >= {"shards", "PyAV", "decode bound"}
    assert all(len(v) == 1 and v[0] > 0 for v in rate.values())
    table = record["tables"]["tiny"]
    assert table["columns"][:2] == ["source", "quadruples / CPU s"]
    for name in rate:  # each source a row of the record, its rate as printed, and on the terminal
        row = next(r for r in table["rows"] if r[0] == name)
        assert row[1] == f"{statistics.median(rate[name]):.1f}" and f"| {name} " in stdout
    assert record["command"].startswith("python benchmarks/bench_decoders.py --tiny") and "--record" not in \
        record["command"]
    by = res["tiny"]["bytes"]
    assert by["payload"] >= by["frames"] > 0 and by["read"] >= by["payload"]  # read = payloads + RAD donors
    notes = " ".join(record["tables"]["tiny_bytes"]["notes"])
    assert "pays for itself" in notes and res["tiny"]["preprocess_cpu_per_video"] > 0


@pytest.mark.parametrize("peer", ["PyAV", *PEERS])
def test_same_frames_as_the_shards(tiny, peer):
    """Within JPEG tolerance of the shards' frames (the shards hold JPEG re-encodes: PSNR >= 30 dB on every video),
    and the seek-by-index decoders bit-equal at full size (the same frames of the same h264 stream)."""
    if peer in PEERS and importlib.util.find_spec(PEERS[peer]) is None:
        pytest.skip(f"{peer} not installed (pip install -e '.[bench]')")
    _, res, _ = tiny
    if res["status"].get(peer):
        pytest.skip(f"{peer} cannot decode here: {res['status'][peer]}")
    check = res["tiny"]["check"][peer]
    if peer == "PyAV":  # torch's antialiased bilinear resize, not FFmpeg's area filter: ~30-32 dB; bench_loader's
        assert check["psnr_min"] >= 27.0  # pyav_frames also gives a clip's last frame as its neighbour
    else:
        assert check["matched"] == check["videos"] == 8 and check["psnr_min"] >= 30.0
    if peer == "decord2" and check["full_size_ref"] == "torchcodec":
        assert check["full_size_max_abs"] == 0
