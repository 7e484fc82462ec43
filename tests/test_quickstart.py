"""The demo end to end at a token budget: every stage runs and the table, JSON and PNG are written."""

from __future__ import annotations

import json

import pytest

from moquad.quickstart import quickstart


def test_quickstart_writes_comparison(tmp_path):
    results = quickstart(tmp_path / "qs", epochs=2, classes=2, per_class=4, seed=1)
    assert list(results) == ["random init", "simclr", "moquad"]
    saved = json.loads((tmp_path / "qs" / "comparison.json").read_text())
    for method, r in results.items():
        assert saved[method]["top1"] == r["top1"]
        assert 0.0 <= r["top1"] <= r["top5"] <= r["top10"] <= 1.0
    assert (tmp_path / "qs" / "comparison.png").stat().st_size > 5000
    assert (tmp_path / "qs" / "moquad" / "curves.png").is_file()
    # a second call reuses data and finished runs instead of redoing them
    again = quickstart(tmp_path / "qs", epochs=2, classes=2, per_class=4, seed=1)
    assert {m: r["top1"] for m, r in again.items()} == {m: r["top1"] for m, r in results.items()}
    # ... and refuses to mix in data or runs made with other settings
    with pytest.raises(ValueError, match="other settings"):
        quickstart(tmp_path / "qs", epochs=3, classes=2, per_class=4, seed=1)
