"""Fine-tuning: training runs and learns, the multi-view test averages softmax per video, outputs are complete."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from moquad.data.augment import normalize
from moquad.data.sampling import uniform_clips
from moquad.eval.clips import spatial_crops
from moquad.eval.finetune import finetune, load_classifier


def test_finetune_end_to_end(tmp_path):
    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    data = make_tiny_dataset(tmp_path / "data", {"train": 12, "test": 6}, frames=8)
    ckpt = make_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    cfg = eval_cfg(data, ckpt, tmp_path / "out", epochs=4, batch_size=4, lr=0.05, optimizer="sgd", num_clips=2,
                   crops=3)
    res = finetune(cfg)
    out = tmp_path / "out"
    for name in ("finetune.json", "finetune.txt", "finetune_confusion.png", "finetune_model.pt"):
        assert (out / name).is_file(), name
    assert (out / "finetune_confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "finetune.json").read_text())
    assert saved["top1"] == res["top1"] and saved["protocol"]["test"].startswith("2 clips x 3 crops")
    assert len(res["train_loss_per_epoch"]) == 4 and res["train_loss_per_epoch"][-1] < res["train_loss_per_epoch"][0]
    conf = np.array(res["confusion"])
    assert conf.sum() == 6 and np.trace(conf) / 6 == pytest.approx(res["top1"])
    assert [r["pred"] for r in res["predictions"]] == [r["pred"] for r in saved["predictions"]]

    # independent reference for one test video: 2 clips x 3 crops from raw frames, softmax averaged
    import pyarrow.parquet as pq

    from moquad.data.store import Split

    net, meta = load_classifier(out / "finetune_model.pt")
    assert meta["classes"] == ["Red", "Green", "Blue"]
    row = pq.read_table(data / "manifests" / "test.parquet").to_pylist()[2]
    idx = uniform_clips(row["num_frames"], 4, 2, 2)
    views = [spatial_crops(torch.from_numpy(Split(data, "test").read_frames(2, list(c))), 32, 3) for c in idx]
    with torch.no_grad():
        probs = net(normalize(torch.cat(views), torch.device("cpu"))).softmax(1).mean(0)
    pred = next(p for p in res["predictions"] if p["video_id"] == row["video_id"])
    assert pred["pred"] == int(probs.argmax())
    assert sum(r["videos"] for r in res["per_class"]) == 6


def test_finetune_rejects_bad_settings(tmp_path):
    from test_features import eval_cfg, make_checkpoint, make_tiny_dataset

    data = make_tiny_dataset(tmp_path / "data", {"train": 2, "test": 1}, frames=8)
    ckpt = make_checkpoint(tmp_path / "c.pt")
    with pytest.raises(ValueError, match="test_crops"):
        finetune(eval_cfg(data, ckpt, tmp_path), test_crops=2)
    with pytest.raises(ValueError, match="optimizer"):
        finetune(eval_cfg(data, ckpt, tmp_path, optimizer="adam9", epochs=1))


def _ddp_worker(rank, world, port, cfg, result):
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    try:
        res = finetune(cfg)
        (result / f"rank{rank}.json").write_text(json.dumps({"top1": res["top1"], "ranks": res["protocol"]["ranks"],
                                                              "preds": res["predictions"]}))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_finetune_on_two_ranks_predicts_every_video_once(tmp_path):
    import torch.multiprocessing as mp
    from test_features import _free_port, eval_cfg, make_checkpoint, make_tiny_dataset

    data = make_tiny_dataset(tmp_path / "data", {"train": 6, "test": 5}, frames=8)
    ckpt = make_checkpoint(tmp_path / "c.pt")
    cfg = eval_cfg(data, ckpt, tmp_path / "out", epochs=1, batch_size=4, optimizer="lars", num_clips=1)
    mp.spawn(_ddp_worker, args=(2, _free_port(), cfg, tmp_path), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0 == r1 and r0["ranks"] == 2  # both ranks report the same gathered result
    import pyarrow.parquet as pq

    ids = pq.read_table(data / "manifests" / "test.parquet").column("video_id").to_pylist()
    assert [p["video_id"] for p in r0["preds"]] == ids  # odd count, manifest order, no padding
    saved = json.loads((tmp_path / "out" / "finetune.json").read_text())
    assert saved["videos"] == 5 and np.sum(saved["confusion"]) == 5
