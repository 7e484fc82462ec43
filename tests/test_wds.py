"""moquad.wds.stream: a split's shards through webdataset give every video's frames and label, as the
offset reader (moquad.data.store.Split) reads them from the manifest."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_features import make_tiny_dataset

from moquad.data.store import Split, read_manifest
from moquad.wds import shard_urls, stream


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_tiny_dataset(tmp_path_factory.mktemp("wds") / "data", {"train": 7, "test": 4}, frames=8)


def _reference(data, split, pick):
    ref, labels = Split(data, split), read_manifest(data, split).column("label").to_pylist()
    return [(ref.read_frames(i, list(pick(int(ref.num_frames[i])))), labels[i]) for i in range(len(ref))]


def _key(frames_label):
    frames, label = frames_label
    return (label, frames.shape, frames.tobytes())


@pytest.mark.parametrize("split", ["train", "test"])
def test_stream_equals_the_offset_reader(data, split):
    got = list(stream(data, split))
    want = _reference(data, split, range)
    assert len(got) == len(want) == read_manifest(data, split).num_rows
    assert sorted(map(_key, got)) == sorted(map(_key, want))
    assert all(f.dtype == np.uint8 and f.ndim == 4 and f.shape[-1] == 3 for f, _ in got)
    assert len(shard_urls(data, split)) == 2  # both shards the manifest names, nothing else


def test_frames_selection_and_seeded_shuffle(data):
    pick = lambda n: [0, n - 1, 0]  # noqa: E731 - any order, repeats allowed
    got = list(stream(data, "train", frames=pick))
    assert sorted(map(_key, got)) == sorted(map(_key, _reference(data, "train", pick)))
    assert all(f.shape[0] == 3 and np.array_equal(f[0], f[2]) for f, _ in got)
    plain = [_key(x) for x in stream(data, "train")]
    a = [_key(x) for x in stream(data, "train", shuffle=4, seed=1)]
    assert a == [_key(x) for x in stream(data, "train", shuffle=4, seed=1)]  # the same order on every run
    assert sorted(a) == sorted(plain) and a != plain
    with pytest.raises(ValueError, match="shuffle=-1"):
        stream(data, "train", shuffle=-1)


def test_dataloader_workers_split_the_shards(data):
    import torch

    loader = torch.utils.data.DataLoader(stream(data, "train"), batch_size=None, num_workers=2)
    got = [(f.numpy(), int(label)) for f, label in loader]
    assert sorted(map(_key, got)) == sorted(map(_key, _reference(data, "train", range)))  # each video once


def _centred(count):
    """frames=count by a direct formula: start (n - count) // 2, consecutive; shorter: round(linspace) stretch."""
    def pick(n):
        if n < count:
            return np.rint(np.linspace(0, n - 1, count)).astype(int).tolist()
        return list(range((n - count) // 2, (n - count) // 2 + count))
    return pick


@pytest.mark.parametrize("count", [1, 5, 8, 11])  # videos have 8, 5 and 2 frames: fits, fits some, stretches all
def test_frames_int_is_the_centred_clip(data, count):
    got = list(stream(data, "train", frames=count))
    assert sorted(map(_key, got)) == sorted(map(_key, _reference(data, "train", _centred(count))))
    assert all(f.shape[0] == count for f, _ in got)  # every sample the same length: batchable


@pytest.mark.parametrize("bad", [0, -3, True, "8", 8.0, int])
def test_a_wrong_frames_is_one_clear_error_at_the_call(data, bad):
    with pytest.raises(ValueError, match=r"frames=.*give a number of frames \(frames=16"):
        stream(data, "train", frames=bad)


def _documented_calls():
    """Every ``wds.stream(...)`` / ``stream(...)`` call the README, the docs pages and the module docstring show."""
    from pathlib import Path

    import moquad.wds

    root = Path(__file__).resolve().parent.parent
    texts = [p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]
    calls = []
    for text in [*texts, moquad.wds.__doc__]:
        for m in re.finditer(r"\bstream\(", text):  # the balanced call, across line breaks
            depth, i = 0, m.end() - 1
            while True:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
                if depth == 0:
                    break
            calls.append(" ".join(text[m.start():i].split()))
    return [c for c in calls if re.match(r'stream\([^,()]+,\s*"\w+"', c)]  # examples name their split; prose: stream(...)


def test_the_documented_stream_examples_run(data):
    """The README's example (`moquad.wds.stream(DIR, "train", frames=..., shuffle=1000, seed=0)`, its `...` a
    number of frames) and the module docstring's, run on a real split, so they cannot rot."""
    calls = _documented_calls()
    assert any("frames=..." in c for c in calls) or any("frames=16" in c for c in calls), calls
    for call in calls:
        code = re.sub(r"^stream\(\s*[^,]+,", "stream(DIR,", call.replace("moquad.wds.stream", "stream"))  # any folder
        code = code.replace("frames=...", "frames=4")
        pipe = eval(code, {"stream": stream, "DIR": str(data), "range": range, "min": min})  # noqa: S307
        items, split = list(pipe), re.match(r'stream\(DIR,\s*"(\w+)"', code)[1]
        assert len(items) == read_manifest(data, split).num_rows and all(f.dtype == np.uint8 and f.ndim == 4 and f.shape[-1] == 3 for f, _ in items)
        assert all(isinstance(label, int) and 0 <= label for _, label in items)
