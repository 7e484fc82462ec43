"""A BYOL-style method written as a user would add one: this module is its new code (a loss over roles: the
online anchor, through a predictor, regresses the momentum encoder's projection of the positive; no negatives),
and ONE table entry (:data:`ENTRY`) is all the trainer needs (``tests/test_methods_extension.py`` adds it)."""

from __future__ import annotations

import torch.nn.functional as F

from moquad.data import views
from moquad.train.methods import Method, Momentum, Stage


def byol_loss(p, *, tau: float, hard_beta: float, hard_alpha: float):
    """BYOL's ``2 - 2 cos(prediction, target)`` of each anchor's prediction and its positive's momentum key."""
    pos = p.key_roles.index("positive")
    cos = (F.normalize(p.z[:, 0].float(), dim=-1) * F.normalize(p.keys[:, pos].float(), dim=-1)).sum(-1)
    loss = (2 - 2 * cos).mean()
    nan = loss.new_tensor(float("nan"))
    return loss, {"rank_pos": nan, "rank_intra_neg": nan}


ENTRY = Method((Stage("byol", views.quadruple, byol_loss, "byol", {"ad_pos": True, "intra_neg": False,
                                                                   "ad_intra_neg": False}),),
               Momentum(queue=False, predictor=True))
