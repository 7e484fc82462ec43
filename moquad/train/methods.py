"""Pre-training methods (``cfg.method``): ONE table, each row a rung of the paper's Table 4 ladder or the classic
baseline. Imports no torch (``moquad.settings`` reads the table's names to check the setting).

  - ``moquad``: epochs ``e < warmup_ratio * epochs`` train the appearance task (Eq. 3, loader mode
    ``appearance``), the rest MoQuad's quadruple (Eq. 1 / Eq. 4, mode ``moquad``, the ablation switches
    ``loader.ad_pos / intra_neg / ad_intra_neg`` as configured);
  - ``simclr``: the SimCLR BASE of the ladder: exactly ``moquad`` with the three switches off (anchor +
    plain positive at the same random speed, the same one-directional loss, warm-up and mining), so each
    rung of the ladder changes one thing;
  - ``simclr_classic``: SimCLR as published: two clips at ``loader.simclr_dilation``, symmetric NT-Xent, no
    appearance warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_QUADRUPLE = {"ad_pos": False, "intra_neg": False, "ad_intra_neg": False}


@dataclass(frozen=True)
class Method:
    """What a method changes: its loader mode after the warm-up, the switches it forces there, whether it has the
    appearance warm-up, and what its loss is called in the progress bar."""

    mode: str
    switches: dict[str, bool] = field(default_factory=dict)
    warmup: bool = True
    label: str = "moquad"

    def loader_mode(self, stage: str) -> tuple[str, dict[str, bool]]:
        """(loader mode, forced switches) of an epoch in ``stage`` (``appearance`` or ``moquad``)."""
        return ("appearance", {}) if stage == "appearance" else (self.mode, self.switches)

    def loss_label(self, stage: str) -> str:
        """What the loss of an epoch in ``stage`` is called in the progress bar."""
        return "appearance" if stage == "appearance" else self.label


METHODS: dict[str, Method] = {
    "moquad": Method("moquad"),
    "simclr": Method("moquad", NO_QUADRUPLE, label="simclr"),
    "simclr_classic": Method("pair", warmup=False, label="simclr"),
}
