"""``moquad preprocess --engine ray``: one Ray task per planned shard, the same bytes as the local engine."""

from __future__ import annotations

import dataclasses
import os

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine tests need ray (pip install -e '.[dev]')")

from test_preprocess_layouts import make_ucf101  # noqa: E402

from moquad import objstore  # noqa: E402
from moquad.config import PreprocessConfig  # noqa: E402
from moquad.data.store import read_errors, read_info, read_manifest  # noqa: E402
from moquad.errors import MoquadError  # noqa: E402
from moquad.preprocess.manifest import parts_dir, verify  # noqa: E402
from moquad.preprocess.run import preprocess  # noqa: E402


@pytest.fixture(scope="session")
def ray_s3():
    """ONE local Ray per test run (2 CPUs), started after a local S3 server so its workers see the endpoint."""
    pytest.importorskip("moto")
    from s3server import s3_server

    with s3_server() as proxy:
        objstore.reset()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield proxy
        finally:
            ray.shutdown()
            objstore.reset()


@pytest.fixture(scope="module")
def raw(real_videos_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("ray_raw")
    make_ucf101(root, real_videos_dir)  # 8 clips, broken files and a missing one
    return root


def _cfg(root, out, **kw) -> PreprocessConfig:
    return PreprocessConfig(dataset="ucf101", root=str(root), out=str(out), short_side=32, workers=2,
                            shard_size=1_500_000, **kw)


@pytest.fixture(scope="module")
def local_run(raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("ray_local") / "d"
    preprocess(_cfg(raw, out), quiet=True)
    return out


def _same_dataset(a, b) -> None:
    info_a, info_b = read_info(a), read_info(b)
    assert info_a["splits"] == info_b["splits"] and info_a["counts"] == info_b["counts"]
    for split in info_a["splits"]:
        assert read_manifest(a, split).equals(read_manifest(b, split))
    assert read_errors(a).equals(read_errors(b))


def test_ray_engine_writes_the_local_engines_shards_manifests_and_errors(ray_s3, raw, local_run, tmp_path):
    out = tmp_path / "ray"
    summary = preprocess(_cfg(raw, out, engine="ray"), quiet=True)
    _same_dataset(local_run, out)
    tars = sorted(p.name for p in (local_run / "shards").glob("*.tar"))
    assert len(tars) >= 3 and tars == sorted(p.name for p in (out / "shards").glob("*.tar"))
    for name in tars:
        assert (out / "shards" / name).read_bytes() == (local_run / "shards" / name).read_bytes()
    assert verify(out) == []
    assert summary["failed"] > 0 and len(read_errors(out)) == summary["failed"] + summary["missing"]


def test_ray_rerun_redoes_only_the_shards_without_a_record(ray_s3, raw, local_run, tmp_path):
    out = tmp_path / "ray"
    preprocess(_cfg(raw, out, engine="ray"), quiet=True)
    records = sorted(p for p in parts_dir(out).glob("train-*.parquet"))
    lost = records[1]  # as if its task died between writing the tar and recording it
    lost.unlink()
    kept = {p: os.stat(p).st_mtime_ns for p in (out / "shards").glob("*.tar") if p.stem != lost.stem}
    preprocess(_cfg(raw, out, engine="ray"), quiet=True)
    assert lost.is_file()
    assert {p: os.stat(p).st_mtime_ns for p in kept} == kept  # finished shards were not rewritten
    _same_dataset(local_run, out)


def test_ray_engine_uploads_to_s3_with_the_same_bytes(ray_s3, raw, local_run):
    url = "s3://bkt/ray"
    preprocess(dataclasses.replace(_cfg(raw, url, engine="ray")), quiet=True)
    objstore.reset()
    _same_dataset(local_run, url)
    for tar in (local_run / "shards").glob("*.tar"):
        assert objstore.read_all(f"{url}/shards/{tar.name}") == tar.read_bytes()
    assert verify(url) == []


def test_ray_engine_without_ray_writes_nothing(raw, tmp_path, monkeypatch):
    """The missing-Ray error came after the output folder and the part's config were written."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    out = tmp_path / "never"
    with pytest.raises(MoquadError, match=r"engine='ray' needs Ray: pip install 'moquad\[ray\]' \(or use engine='local'\)"):
        preprocess(_cfg(raw, out, engine="ray"), quiet=True)
    assert not out.exists()


def test_shards_the_engine_wrote_where_this_node_cannot_see_are_an_error(raw, tmp_path, monkeypatch):
    """Ray tasks on other nodes writing into an --out that is not shared: their records never arrive here."""
    import moquad.preprocess.run as run

    monkeypatch.setitem(run.ENGINES, "ray", lambda plans, *a: None)  # every task 'succeeded' somewhere else
    out = tmp_path / "d"
    with pytest.raises(MoquadError, match=r"^(\d+) of \1 planned shards have no record in .*/d/manifests/_parts after "
                                          r"the ray engine finished \(first: test-000-000000\).*every node mounts"):
        preprocess(_cfg(raw, out, engine="ray"), quiet=True)
    assert not (out / "dataset.json").exists()
