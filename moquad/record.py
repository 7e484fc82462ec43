"""The results record of a benchmark or an evidence run: its tables and figures, the command, the machine, the load
average, the date and the commit, in one JSON file (``docs/results/NAME.json``). The documentation renders its
results tables from these files (``docs/hooks.py``), so a table on a page is the table a command printed.

    rec = Record("bench_loader")            # the date, the command and the load average at the start
    rec.table("main", ["path", "q/s"], rows, title="...")   # prints the table and keeps it
    rec.figures["checksum cost"] = 0.011     # raw numbers, for anyone who reads the file
    rec.write(args.record)                   # atomic; the load average at the end

The scripts of ``benchmarks/`` and ``experiments/`` import it from the package (``from moquad.record import Record``);
they run from a checkout, whose root is :data:`ROOT`.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the checkout the scripts run from
RESULTS = ROOT / "docs" / "results"  # where the records the documentation renders live
CODE = ("moquad", "benchmarks", "experiments")  # the folders whose uncommitted changes make a record "dirty"
LOCK = ROOT / "requirements-lock.txt"  # every package pinned (make setup installs it, make lock writes it)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit() -> dict[str, Any]:
    """The checkout's commit, and whether its code differs from it (``MOQUAD_COMMIT`` where a copy has no ``.git``)."""
    sha = _git("rev-parse", "HEAD")
    if sha is None:
        return {"commit": os.environ.get("MOQUAD_COMMIT"), "dirty": None}
    return {"commit": sha, "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", *CODE))}


def machine() -> dict[str, Any]:
    """The CPU model, its cores, the memory, the OS, Python, and torch / the GPU when this process imported torch."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info: dict[str, Any] = {"cpu": cpu, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                            else os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
                            "python": platform.python_version()}
    try:
        kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
        info["memory_gib"] = round(kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpus"] = torch.cuda.device_count()
    return info


def _locked(text: str) -> dict[str, str]:
    """The lock's pins that apply to this interpreter: normalised name -> version (markers evaluated)."""
    from packaging.markers import Marker
    from packaging.utils import canonicalize_name

    pins = {}
    for line in text.splitlines():
        if not line[:1].isalnum() or "==" not in line:
            continue  # hash lines, comments
        req, _, marker = line.rstrip(" \\").partition(";")
        if marker.strip() and not Marker(marker.strip()).evaluate():
            continue
        name, _, version = req.strip().partition("==")
        pins[canonicalize_name(name)] = version.strip()
    return pins


def _installed() -> dict[str, str]:
    """What is installed in this environment, as pip freeze sees it: the ``NAME-VERSION.dist-info`` folders of its
    site-packages (their names, not their metadata: a few ms), not every folder on sys.path (a package may put
    vendored copies there, as Ray does with its thirdparty_files). Normalised name -> version."""
    from packaging.utils import canonicalize_name

    out = {}
    for folder in dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")):
        for info in Path(folder).glob("*.dist-info"):
            name, _, version = info.name[:-len(".dist-info")].partition("-")
            if version:
                out[canonicalize_name(name)] = version
    return out


@functools.lru_cache(maxsize=1)
def lock() -> dict[str, Any]:
    """The lock this run was installed from: ``sha256`` (16 hex) of ``requirements-lock.txt`` and whether every
    installed package is at its pinned version (``matches``; ``differs`` lists the others, ``extra`` what the lock
    does not name). ``{"sha256": None}`` outside a checkout (a plain ``pip install``: ranges, no lock)."""
    import hashlib

    try:
        text = LOCK.read_text()
    except OSError:
        return {"sha256": None}
    out: dict[str, Any] = {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}
    try:
        from packaging.version import Version

        pins = _locked(text)
    except ImportError:  # packaging absent: the hash alone
        return out
    installed = _installed()
    skip = {"moquad", "pip", "setuptools", "wheel"}  # the package itself and the venv's own installers
    out["differs"] = sorted(f"{n}=={v} (lock {pins[n]})" for n, v in installed.items()
                            if n in pins and Version(v).public != Version(pins[n]).public)
    out["extra"] = sorted(f"{n}=={v}" for n, v in installed.items() if n not in pins and n not in skip)
    out["missing"] = sorted(n for n in pins if n not in installed)
    out["matches"] = not (out["differs"] or out["extra"] or out["missing"])
    return out


def environment() -> dict[str, Any]:
    """What a result depends on besides its inputs: the commit, the lock and the machine (every result JSON of a
    command and every results record carries it)."""
    return {**commit(), "lock": lock(), "machine": machine()}


def command(argv: Sequence[str] | None = None) -> str:
    """This run's command line as a user types it from the repository root (``python benchmarks/x.py --flag``)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve() if argv else Path("?")
    shown = str(script.relative_to(ROOT)) if ROOT in script.parents else script.name
    args, i = [], 1
    while i < len(argv):  # where the record goes is not part of how it was measured
        if argv[i] == "--record":
            i += 2
            continue
        if not argv[i].startswith("--record="):
            args.append(argv[i])
        i += 1
    return shlex.join(["python", shown, *args])


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Where, when and how a result was measured: the fields every record (and every line of a JSONL) carries."""
    return {"command": command(argv), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **commit(), "lock": lock(), "machine": machine(), "load": [round(x, 2) for x in os.getloadavg()]}


def finite(value: Any) -> Any:
    """NaN and infinities as null, tuples as lists: a record is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    return [finite(v) for v in value] if isinstance(value, (list, tuple)) else value


def markdown(columns: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table; ``align``: one letter per column, ``l`` or ``r`` (default: the first left, the rest right)."""
    align = align or "l" + "r" * (len(columns) - 1)
    cells = [[str(c) for c in columns], *[["–" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    line = lambda r: "| " + " | ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 1) + ":" if a == "r" else "-" * (w + 2) for w, a in zip(widths, align)) + "|"
    return "\n".join([line(cells[0]), rule, *map(line, cells[1:])])


class Record:
    """One run's record; :meth:`write` saves it (``docs/results/NAME.json`` unless told otherwise)."""

    def __init__(self, name: str, argv: Sequence[str] | None = None) -> None:
        self.name, self.t0 = name, time.time()
        self.meta = provenance(argv)
        self.tables: dict[str, dict[str, Any]] = {}
        self.figures: dict[str, Any] = {}

    def table(self, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "",
              align: str | None = None, notes: Sequence[str] = (), show: bool = True) -> str:
        """Keep a table (cells as printed: strings or numbers) under ``key`` and print it with its title and notes."""
        align = align or "l" + "r" * (len(columns) - 1)
        rows = [["–" if c is None else c for c in row] for row in rows]
        self.tables[key] = {"title": title, "columns": list(columns), "align": align, "rows": rows,
                            "notes": list(notes)}
        text = markdown(columns, rows, align)
        if show:
            print("\n\n".join([title, text, *notes] if title else [text, *notes]) + "\n", flush=True)
        return text

    def write(self, path: str | Path | None = None) -> Path:
        """Write the record atomically (a cut run leaves the last whole file); returns its path."""
        path = Path(path) if path else RESULTS / f"{self.name}.json"
        rec = {"name": self.name, **self.meta, "load_end": [round(x, 2) for x in os.getloadavg()],
               "seconds": round(time.time() - self.t0, 1), "tables": self.tables, "figures": self.figures}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(finite(rec), indent=1, default=str) + "\n")
        tmp.replace(path)
        print(f"wrote {path}", flush=True)
        return path


def add_argument(parser: Any, name: str) -> None:
    """The ``--record PATH`` option every script has (default ``docs/results/NAME.json``)."""
    parser.add_argument("--record", default=str(RESULTS / f"{name}.json"), metavar="PATH",
                        help=f"write the results record here (default: docs/results/{name}.json, what the "
                             "documentation renders)")
