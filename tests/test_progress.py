"""The progress bar says which loss a run trains (issue 20: a SimCLR run never shows "moquad loss")."""

from __future__ import annotations

import pytest
from test_loop import fake_loader, make_cfg, train


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("method, want", [("simclr", ["appearance", "simclr"]), ("simclr_classic", ["simclr", "simclr"]),
                                          ("moquad", ["appearance", "moquad"])])
def test_progress_bar_names_the_loss_of_the_method(tmp_path, monkeypatch, method, want):
    from rich.progress import Progress

    seen = []
    real = Progress.update
    monkeypatch.setattr(Progress, "update", lambda self, task, **kw: (seen.append(kw.get("info", "")),
                                                                      real(self, task, **kw))[1])
    train(make_cfg(tmp_path / "p", method=method, epochs=2, steps_per_epoch=1, warmup_ratio=0.5), fake_loader, tensorboard=False)
    assert [s.split(" loss ")[0] for s in seen if s] == want
