"""The attentive probe: a frozen encoder's tokens, pooled by a learnt query, as V-JEPA 2 evaluates encoders.

The classifier is V-JEPA 2's (facebookresearch/vjepa2, ``src/models/attentive_pooler.py``, ``AttentiveClassifier``):
one learnable query token; ``depth - 1`` pre-norm transformer blocks over the encoder's tokens; one cross-attention
block in which the query attends to the (LayerNorm-ed) tokens, without an output projection, then an MLP, both
residual; a linear layer on the query. Initialisation as there (truncated normal 0.02, the blocks' output layers
scaled by ``1 / sqrt(2 * layer)``).

The protocol follows ``evals/video_classification_frozen`` of the same repository, on tokens extracted ONCE: each
video gives ``num_clips`` uniformly spaced clips x ``crops`` spatial crops (:func:`moquad.eval.clips.eval_clips`,
the test views of every moquad protocol); the tokens of a crop's clips are concatenated into one sequence (V-JEPA 2
concatenates its temporal segments the same way); a training sample is one (video, crop); at test time the
softmax is averaged over a video's crops. Tokens: :meth:`moquad.eval.encoders.Encoder.tokens` (a transformer's last
patch tokens, a CNN's last feature map), flattened. Training: AdamW (``cfg.attentive``), half-period cosine to 0
without warm-up, cross-entropy; no augmentation (the tokens are computed once, as the fast linear probe's
features), the tokens standardised per channel with the training tokens' mean and std (V-JEPA 2's encoders end in a
LayerNorm; a CNN's map does not, and a random CNN's tokens are ~0.02 in scale: without this the pooler's
self-attention blocks drown them). V-JEPA 2 trains a grid of 20 (lr, weight decay) probes and reports the best;
moquad trains one.

Tokens are kept in a float32 ``.npy`` per split under ``OUT/tokens/`` (memory-mapped while training).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import Progress
from torch import nn

from moquad.config import AttentiveConfig, EvalConfig
from moquad.data.store import Split
from moquad.errors import MoquadError
from moquad.eval.encoders import Encoder

# ----------------------------------------------------------------------------- the classifier


class MLP(nn.Module):
    """fc1 -> GELU -> fc2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, C) -> (B, heads, L, C / heads)."""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


class SelfBlock(nn.Module):
    """A pre-norm transformer block: ``x + proj(attn(norm1(x)))``, then ``+ mlp(norm2(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2, self.mlp = nn.LayerNorm(dim), MLP(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (_heads(t, self.heads) for t in self.qkv(self.norm1(x)).chunk(3, -1))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
        return x + self.mlp(self.norm2(x))


class CrossBlock(nn.Module):
    """The query attends to the normalised tokens (no output projection): ``q + attn(q, norm1(x))``, then
    ``+ mlp(norm2(q))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1, self.q, self.kv = nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Linear(dim, 2 * dim)
        self.norm2, self.mlp = nn.LayerNorm(dim), MLP(dim, int(dim * mlp_ratio))

    def forward(self, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        k, v = (_heads(t, self.heads) for t in self.kv(self.norm1(x)).chunk(2, -1))
        q = q + F.scaled_dot_product_attention(_heads(self.q(q), self.heads), k, v).transpose(1, 2).flatten(2)
        return q + self.mlp(self.norm2(q))


def _check_heads(width: int, heads: int) -> None:
    if width % heads:
        divisors = [h for h in (1, 2, 3, 4, 6, 8, 12, 16) if width % h == 0]
        raise MoquadError(f"the attentive probe's heads ({heads}) must divide the token width ({width}); pass "
                          f"--heads N with N one of {', '.join(map(str, divisors))} (--set attentive.heads=N)")


class AttentiveClassifier(nn.Module):
    """Tokens (B, L, C) -> class logits (B, classes): V-JEPA 2's attentive pooler (one query) and a linear layer.
    The tokens are first standardised per channel (``shift`` / ``scale`` buffers: the training tokens' mean and
    std, set by :func:`fit_attentive`; identity until then)."""

    def __init__(self, dim: int, classes: int, depth: int = 4, heads: int = 16, mlp_ratio: float = 4.0,
                 init_std: float = 0.02):
        super().__init__()
        _check_heads(dim, heads)
        self.register_buffer("shift", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))
        self.query = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(SelfBlock(dim, heads, mlp_ratio) for _ in range(depth - 1))
        self.cross = CrossBlock(dim, heads, mlp_ratio)
        nn.init.trunc_normal_(self.query, std=init_std)
        for m in self.modules():  # the pooler's linear layers; the classifier keeps torch's default, as there
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=init_std)
                nn.init.zeros_(m.bias)
        with torch.no_grad():  # V-JEPA 2's _rescale_blocks
            for i, b in enumerate(self.blocks, 1):
                b.proj.weight.div_(math.sqrt(2.0 * i))
                b.mlp.fc2.weight.div_(math.sqrt(2.0 * i))
            self.cross.mlp.fc2.weight.div_(math.sqrt(2.0 * max(1, len(self.blocks))))
        self.linear = nn.Linear(dim, classes)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, L, C) -> the query after the cross-attention block (B, C)."""
        x = (x - self.shift) / self.scale
        for b in self.blocks:
            x = b(x)
        return self.cross(self.query.expand(len(x), -1, -1), x)[:, 0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.pool(x))


# ----------------------------------------------------------------------------- tokens, extracted once


def flat_tokens(grid: torch.Tensor) -> torch.Tensor:
    """Token grid (N, C, t, h, w) -> tokens (N, t * h * w, C), time-major."""
    return grid.flatten(2).transpose(1, 2)


@torch.inference_mode()
def video_tokens(encoder: Encoder, views: torch.Tensor, num_clips: int, batch_size: int,
                 device: torch.device | str) -> torch.Tensor:
    """All test views of one video, uint8 (num_clips * crops, 3, T, S, S) clip-major -> (crops, num_clips * L, C):
    per crop, its clips' tokens one after another."""
    out = [flat_tokens(encoder.tokens(encoder.normalize(views[s : s + batch_size], device))).float().cpu()
           for s in range(0, len(views), batch_size)]
    tok = torch.cat(out)  # (clips * crops, L, C)
    crops = len(tok) // num_clips
    return tok.unflatten(0, (num_clips, crops)).transpose(0, 1).flatten(1, 2)


def extract_tokens(encoder: Encoder, split: Split, rows: np.ndarray, cfg: EvalConfig, path: Path,
                   show: bool = False) -> np.ndarray:
    """The tokens of videos ``rows`` of ``split`` at ``cfg``'s clip and views -> float32 (videos, crops, L, C),
    written to ``path`` (``.npy``, atomically) and returned memory-mapped from it."""
    from moquad.eval.clips import TestViews
    from moquad.eval.common import resolve_device

    device = resolve_device(cfg.device)
    encoder = encoder.to(device).eval()
    views = TestViews(split, rows, cfg.frames, cfg.dilation, cfg.num_clips, cfg.size, cfg.crops,
                      encoder.framing)
    loader = torch.utils.data.DataLoader(views, batch_size=None, shuffle=False, num_workers=cfg.workers)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}.npy")
    out = None
    with Progress(disable=not show, transient=True) as progress:
        task = progress.add_task(f"tokens of {split.split}", total=len(rows))
        for k, (_, v) in enumerate(loader):
            tok = video_tokens(encoder, v, cfg.num_clips, cfg.batch_size, device).numpy()
            if out is None:
                out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(len(rows), *tok.shape))
            out[k] = tok
            progress.advance(task)
    if out is None:
        raise MoquadError(f"split {split.split!r} has no labelled videos to extract tokens of")
    out.flush()
    del out
    os.replace(tmp, path)
    return np.load(path, mmap_mode="r")


# ----------------------------------------------------------------------------- training and testing


def token_stats(tokens: np.ndarray, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std (+1e-6) of ``tokens`` (..., C), in float64, read ``chunk`` videos at a time."""
    dim = tokens.shape[-1]
    total, sq, count = np.zeros(dim), np.zeros(dim), 0
    for s in range(0, len(tokens), chunk):
        x = np.asarray(tokens[s : s + chunk], dtype=np.float64).reshape(-1, dim)
        total, sq, count = total + x.sum(0), sq + (x * x).sum(0), count + len(x)
    mean = total / count
    std = np.sqrt(np.maximum(sq / count - mean * mean, 0)) + 1e-6
    return torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)


def fit_attentive(tokens: np.ndarray, labels: np.ndarray, classes: int, ac: AttentiveConfig, seed: int,
                  device: torch.device | str = "cpu", show: bool = False) -> AttentiveClassifier:
    """Train the attentive classifier on ``tokens`` (videos, crops, L, C) of videos labelled ``labels``: tokens
    standardised per channel with their own mean / std (the linear probe standardises its features so: an encoder's
    token scale, e.g. a random CNN's 0.02, must not decide what the pooler's blocks can add to it), every (video,
    crop) a sample, AdamW, half-period cosine to 0 per step, ``ac.epochs`` epochs of shuffled batches."""
    from moquad.eval.linear import cosine
    from moquad.train.optimizers import make_optimizer

    torch.manual_seed(seed)
    n, crops = tokens.shape[:2]
    clf = AttentiveClassifier(tokens.shape[-1], classes, ac.depth, ac.heads, ac.mlp_ratio)
    clf.shift, clf.scale = token_stats(tokens)
    clf = clf.to(device)
    opt = make_optimizer(clf, ac.optimizer, ac.lr, ac.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    steps = math.ceil(n * crops / ac.batch_size)
    lrs = cosine(ac.lr, ac.epochs * steps)
    y = torch.as_tensor(labels, dtype=torch.long)
    clf.train()
    with Progress(disable=not show, transient=True) as progress:
        task = progress.add_task("attentive probe", total=len(lrs))
        for step, lr in enumerate(lrs):
            if step % steps == 0:
                order = torch.randperm(n * crops, generator=gen)
            idx = order[(step % steps) * ac.batch_size:][: ac.batch_size].sort().values
            v, c = (idx // crops).numpy(), (idx % crops).numpy()
            x = torch.from_numpy(np.array(tokens[v, c])).to(device)
            for g in opt.param_groups:
                g["lr"] = lr
            loss = F.cross_entropy(clf(x), y[idx // crops].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            progress.advance(task)
    return clf.eval()


@torch.no_grad()
def predict(clf: AttentiveClassifier, tokens: np.ndarray, batch_size: int = 64,
            device: torch.device | str = "cpu") -> np.ndarray:
    """Softmax averaged over each video's crops -> (videos, classes)."""
    out = []
    for s in range(0, len(tokens), batch_size):
        x = torch.from_numpy(np.array(tokens[s : s + batch_size])).to(device)  # (b, crops, L, C); a copy
        p = clf(x.flatten(0, 1)).float().softmax(-1).unflatten(0, x.shape[:2]).mean(1)
        out.append(p.cpu().numpy())
    return np.concatenate(out)


# ----------------------------------------------------------------------------- the protocol


def _protocol(cfg: EvalConfig, encoder: Encoder, length: int) -> dict[str, Any]:
    ac = cfg.attentive
    return {"variant": "attentive probe (V-JEPA 2: facebookresearch/vjepa2 src/models/attentive_pooler.py, "
                       "evals/video_classification_frozen)",
            "encoder": f"{encoder.label} ({encoder.family.description}); tokens: its last layer's grid "
                       "(moquad.eval.encoders)",
            "tokens": f"{cfg.num_clips} clips of {cfg.frames} frames at dilation {cfg.dilation}, {cfg.size} px; per "
                      f"crop the clips' tokens concatenated: {length} tokens; extracted once, eval mode, no grad",
            "train": "every (video, crop) of the train split's test views a sample; no augmentation; tokens "
                     "standardised per channel with the train tokens' mean / std",
            "test": f"{cfg.num_clips} clip{'s' * (cfg.num_clips != 1)} x {cfg.crops} crop{'s' * (cfg.crops != 1)}: "
                    "softmax averaged over crops",
            "pooler": f"1 query, {ac.depth - 1} self-attention block(s) + 1 cross-attention block, {ac.heads} "
                      f"heads, mlp ratio {ac.mlp_ratio}; linear classifier",
            "optimizer": ac.optimizer, "lr": ac.lr, "weight_decay": ac.weight_decay, "epochs": ac.epochs,
            "batch_size": ac.batch_size, "schedule": "half-period cosine to 0, no warm-up", "seed": cfg.seed,
            "backbone_check": "weights and buffers compared bit-for-bit after extraction"}


def attentive(cfg: EvalConfig, *, encoder: Encoder | None = None, json_path: str | Path | None = None,
              quiet: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """The attentive probe trained on ``cfg.train_split``, tested on ``cfg.test_split``; ``encoder``: any
    :func:`moquad.eval.encoders.load_encoder` result (default: the one ``cfg.checkpoint`` names, ``moquad
    attentive``'s). Writes ``attentive.json`` (+ the tables) to ``out_dir(cfg)`` and the tokens to ``OUT/tokens``; a
    copy of the JSON to ``json_path``. A result already there is an error unless ``overwrite`` (the command passes
    it); ``quiet``: print no table."""
    from moquad.data import store
    from moquad.eval.clips import labelled
    from moquad.eval.common import (
        check_unchanged,
        out_dir,
        resolve_device,
        snapshot,
        start,
    )
    from moquad.eval.report import (
        accuracy_report,
        accuracy_tables,
        finish,
        protocol_table,
        provenance,
    )

    begun = start(cfg, encoder, "attentive.json", overwrite, "the attentive probe")
    cfg, encoder, train, test = begun.cfg, begun.encoder, begun.train, begun.test
    with torch.inference_mode():  # the token width, before a pass over the data
        width = encoder.tokens(torch.zeros(1, 3, cfg.frames, cfg.size, cfg.size)).shape[1]
    _check_heads(width, cfg.attentive.heads)
    classes = store.classes(cfg.data)
    before = snapshot(encoder)
    tokens = {s.split: extract_tokens(encoder, s, labelled(s), cfg, out_dir(cfg) / "tokens" / f"{s.split}.npy",
                                      show=True) for s in (train, test)}
    check_unchanged(encoder, before, f"encoder {encoder.label}")
    device = resolve_device(cfg.device)
    ytr = train.label[labelled(train)]
    clf = fit_attentive(tokens[train.split], ytr, max(len(classes), int(ytr.max()) + 1), cfg.attentive, cfg.seed,
                        device, show=True)
    probs = predict(clf, tokens[test.split], device=device)
    report = accuracy_report(probs, test.label[labelled(test)], classes)
    result = provenance(cfg, train, test, encoder)
    result.update(task="attentive", protocol=_protocol(cfg, encoder, tokens[test.split].shape[2]), **report)
    finish(result, cfg, encoder, begun.path, lambda r: [*accuracy_tables("attentive probe", report),
                                                         protocol_table("protocol", r)], json_path, quiet)
    return result
