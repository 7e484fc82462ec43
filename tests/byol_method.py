"""A symmetric BYOL-style method written as a user would add one: this module is its new code (a loss over roles:
each of the anchor and the positive, through a predictor, regresses the momentum encoder's projection of the other;
no negatives, no queue), and ONE table entry (:data:`ENTRY`) is all the trainer needs
(``tests/test_methods_extension.py`` adds it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moquad.data import views
from moquad.train.methods import Method, Momentum, Stage

PARTNER = {"anchor": "positive", "positive": "anchor"}


def byol_loss(p):
    """BYOL's ``2 - 2 cos(prediction, target)`` of each online view's prediction and its partner's momentum key,
    the mean over both directions and the batch."""
    terms = []
    for j, role in enumerate(p.roles):
        target = p.keys[:, p.key_roles.index(PARTNER[role])]
        cos = (F.normalize(p.z[:, j].float(), dim=-1) * F.normalize(target.float(), dim=-1)).sum(-1)
        terms.append((2 - 2 * cos).mean())
    loss = torch.stack(terms).mean()
    nan = loss.new_tensor(float("nan"))
    return loss, {"rank_pos": nan, "rank_intra_neg": nan}


ENTRY = Method((Stage("byol", views.quadruple, byol_loss, "byol", {"ad_pos": True, "intra_neg": False,
                                                                   "ad_intra_neg": False}, params=lambda cfg: {}),),
               Momentum(online=("anchor", "positive"), keys=("anchor", "positive"), queue=(), predictor=True),
               summary="symmetric BYOL")
