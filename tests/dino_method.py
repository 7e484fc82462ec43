"""A DINO-style method written as a user would add one: this module is its new code, ONE table entry
(:data:`ENTRY`) is all the trainer needs (``tests/test_methods_extension.py`` adds it). The student (the online
network) sees the anchor and the positive; the teacher (the momentum encoder) sees both too; each student view
matches the teacher's distribution of the OTHER view: the teacher's output is centred (minus an EMA of its batch
means, the centre: state the checkpoint keeps) and sharpened (a low temperature), the student's softened.
DINO's own hyperparameters come from the row (``params``), not from the run's ``temperature``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moquad import dist
from moquad.data import views
from moquad.train.methods import Method, Momentum, Stage

PARTNER = {"anchor": "positive", "positive": "anchor"}


class DinoLoss:
    """Cross-entropy of the sharpened, centred teacher and the student, with the EMA centre as state."""

    def __init__(self) -> None:
        self.center: torch.Tensor | None = None  # (D,), made at the first step (the size is the projection's)

    def __call__(self, p, *, student_temp: float, teacher_temp: float, center_momentum: float):
        teacher = p.keys.float()  # (B, W, D), no gradient
        if self.center is None:
            self.center = teacher.new_zeros(teacher.shape[-1])
        self.center = self.center.to(teacher.device)
        targets = F.softmax((teacher - self.center) / teacher_temp, dim=-1)
        terms = []
        for j, role in enumerate(p.roles):
            log_student = F.log_softmax(p.z[:, j].float() / student_temp, dim=-1)
            terms.append(-(targets[:, p.key_roles.index(PARTNER[role])] * log_student).sum(-1).mean())
        batch_mean = teacher.mean(dim=(0, 1))
        if dist.is_dist():
            batch_mean = dist.all_reduce(batch_mean, "mean")
        self.center = self.center * center_momentum + batch_mean * (1 - center_momentum)
        loss = torch.stack(terms).mean()
        nan = loss.new_tensor(float("nan"))
        return loss, {"rank_pos": nan, "rank_intra_neg": nan}

    def state_dict(self) -> dict:
        return {"center": self.center.cpu() if self.center is not None else torch.zeros(0)}

    def load_state_dict(self, state: dict) -> None:
        self.center = state["center"].clone() if state["center"].numel() else None


ENTRY = Method((Stage("dino", views.quadruple, DinoLoss, "dino", {"ad_pos": True, "intra_neg": False,
                                                                  "ad_intra_neg": False},
                      params=lambda cfg: {"student_temp": 0.1, "teacher_temp": 0.04, "center_momentum": 0.9}),),
               Momentum(online=("anchor", "positive"), keys=("anchor", "positive"), queue=()),
               summary="DINO-style: a centred, sharpened teacher")
