"""moquad.wds.stream: a split's shards through webdataset give every video's frames and label, as the
offset reader (moquad.data.store.Split) reads them from the manifest."""

from __future__ import annotations

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
