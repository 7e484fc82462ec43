"""Rank-0 run logging: one JSON line per step in ``RUN/log.jsonl`` and the same scalars in ``RUN/tb``.

On resume the log is cut back to the checkpoint's step (steps a killed run did after its last
checkpoint are redone; the cut log replaces the old one atomically), and TensorBoard purges them too, so
curves have no duplicates.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from moquad.io import atomic_write_text

# record fields that are not curves: ``time`` (the Unix time of the record: TensorBoard's wall time, which a float32
# scalar would round to minutes) and ``steps`` (how many steps the record's means cover)
NOT_SCALARS = ("step", "time", "steps")


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """All records of a ``log.jsonl`` (a torn last line from a killed run is skipped)."""
    records = []
    path = Path(path)
    if not path.is_file():
        return records
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class RunLogger:
    """JSONL + TensorBoard writer; ``start_step`` > 0 drops records of later steps (redone after resume).

    A record's ``step`` is the number of optimizer steps done when it was written.
    """

    def __init__(self, run_dir: str | Path, start_step: int = 0, tensorboard: bool = True):
        self.path = Path(run_dir) / "log.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_log(self.path) if r.get("step", -1) <= start_step] if start_step else []
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))  # a crash here keeps the old log
        self._f = open(self.path, "a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(
                str(Path(run_dir) / "tb"), purge_step=start_step + 1 if start_step else None
            )

    def log(self, step: int, values: dict[str, Any]) -> None:
        """Write one record; non-finite numbers become null in JSON and are skipped in TensorBoard."""
        rec: dict[str, Any] = {"step": step}
        for k, v in values.items():
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            rec[k] = v
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()
        if self._tb is not None:
            walltime = rec["time"] if isinstance(rec.get("time"), float) else None
            for k, v in rec.items():
                if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"train/{k}", v, step, walltime=walltime)

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()
