"""moquad.data.epoch_plan: separate random streams per kind, and spares that do not repeat their own batch's views."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_pipeline import _damage
from video_fixtures import coded_dataset

from moquad.config import LoaderConfig
from moquad.data.epoch_plan import STREAMS, EpochPlan, stream
from moquad.data.pipeline import make_loader


def test_numpy_ignores_trailing_zeros_so_streams_are_tagged():
    """The collision the tags prevent: SeedSequence([s, e]) is SeedSequence([s, e, 0])."""
    s, e = 3, 5
    assert np.random.default_rng([s, e]).random() == np.random.default_rng([s, e, 0]).random()  # numpy's rule
    draws = {kind: stream(kind, s, e).random(4).tolist() for kind in STREAMS}
    draws["views of video 0"] = stream("views", s, e, 0, 0).random(4).tolist()
    draws["views of video 0, as a spare in batch 0"] = stream("views", s, e, 0, 1).random(4).tolist()
    assert len({tuple(v) for v in draws.values()}) == len(draws)  # all different
    assert len(set(STREAMS.values())) == len(STREAMS)
    # the epoch permutation is the tagged stream's (an independent formula), not video 0's views
    plan = EpochPlan(10, 2, 1, s, e)
    assert plan.order.tolist() == np.random.default_rng([STREAMS["permutation"], s, e]).permutation(10).tolist()
    assert plan.order.tolist() != np.random.default_rng([s, e]).permutation(10).tolist()


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    root = coded_dataset(tmp_path_factory.mktemp("spare"), num_videos=16, num_frames=20, videos_per_shard=4)
    plan = EpochPlan(16, 4, 1, 0, 0)
    _damage(root, f"v{int(plan.order[0]):02d}")  # batch 0's first video: its spare comes from batch 1
    return root, plan


def test_a_spare_from_a_later_batch_gets_new_views(damaged):
    root, plan = damaged
    cfg = LoaderConfig(frames=4, size=32, workers=0)
    batches = list(make_loader(root, cfg, batch_size=4))
    spare = int(plan.order[4])  # no left-overs (16 = 4 x 4): the first spare is batch 1's first video
    assert batches[0]["bad"] and batches[0]["index"].tolist()[0] == spare
    assert batches[1]["index"].tolist()[0] == spare  # ... which also fills its own slot
    assert batches[0]["view_names"][0] == "anchor"  # no donors in it: equal views would mean equal parameters
    a, b = batches[0]["views"][0, 0], batches[1]["views"][0, 0]
    assert a.shape == b.shape and not torch.equal(a, b)
    # the other videos of both batches are their own slots: views as drawn for (seed, epoch, video, 0)
    again = list(make_loader(root, cfg, batch_size=4, start=1))
    assert torch.equal(again[0]["views"], batches[1]["views"])


def test_at_most_once_in_its_own_slot():
    plan = EpochPlan(23, 3, 2, 7, 1)
    own = np.concatenate([plan.batch(j, r) for j in range(plan.num_batches) for r in range(2)])
    assert len(own) == len(set(own.tolist())) == 23 // 6 * 6
    for j in range(plan.num_batches):
        for r in range(2):
            spares = list(plan.spares(j, r))
            assert not set(spares) & set(np.concatenate([plan.batch(j, q) for q in range(2)]).tolist())
            assert len(spares) == len(set(spares))
    assert not set(plan.spares(0, 0)) & set(plan.spares(0, 1))  # ranks never share a spare
