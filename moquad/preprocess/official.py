"""Adapters of the official datasets: UCF101, HMDB51 (official splits 1-3), Kinetics-400, SSv2.

Each reads its dataset's own annotation files into a :class:`Listing`; the layouts they expect are
written once, beside each adapter, in :data:`moquad.preprocess.datasets.DATASETS`.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from moquad.preprocess.listing import (
    SPLIT_NAMES,
    LayoutError,
    Listing,
    Video,
    add,
    index_videos,
    pick,
    require_dir,
)

# ---------------------------------------------------------------- UCF101


def list_ucf101(root: Path, official_split: int) -> Listing:
    """UCF101 with official train/test split ``official_split`` (1, 2 or 3; checked by ``list_dataset``)."""
    lists = require_dir(root / "ucfTrainTestlist", "ucfTrainTestlist/ (the official split files)")
    video_root = root / "UCF-101" if (root / "UCF-101").is_dir() else root
    class_ind = lists / "classInd.txt"
    if not class_ind.is_file():
        raise LayoutError(f"{class_ind} not found (download ucfTrainTestlist from the UCF101 site)")
    classes = []
    for line in class_ind.read_text().splitlines():
        if line.strip():
            idx, name = line.split()
            if int(idx) != len(classes) + 1:
                raise ValueError(f"{class_ind}: class indices must run 1..101 in order; found {idx}")
            classes.append(name)
    by_lower = {c.lower(): i for i, c in enumerate(classes)}
    index = index_videos(video_root)
    listing = Listing("ucf101", classes)
    for split_name, fname in (("train", f"trainlist0{official_split}.txt"), ("test", f"testlist0{official_split}.txt")):
        fpath = lists / fname
        if not fpath.is_file():
            raise LayoutError(f"{fpath} not found (ucfTrainTestlist/ must hold the official split files)")
        for line in fpath.read_text().splitlines():
            if not line.strip():
                continue
            rel = line.split()[0]
            cls_dir, fname_ = rel.split("/", 1) if "/" in rel else ("", rel)
            label = by_lower.get(cls_dir.lower(), -1)
            stem = Path(fname_).stem
            direct = video_root / rel
            path = direct if direct.is_file() else pick(index.get(stem.lower()))
            add(listing, Video(stem, path, split_name, label, classes[label] if label >= 0 else cls_dir))
    return listing


# ---------------------------------------------------------------- HMDB51

_HMDB_SPLIT = re.compile(r"^(?P<cls>.+)_test_split(?P<n>[123])\.txt$")


def list_hmdb51(root: Path, official_split: int) -> Listing:
    """HMDB51 with official split ``official_split``: in its files 1 = train, 2 = test, 0 = unused (skipped)."""
    split_dir = require_dir(root / "testTrainMulti_7030_splits", "testTrainMulti_7030_splits/ (official split files)")
    files = {}
    for f in split_dir.iterdir():
        m = _HMDB_SPLIT.match(f.name)
        if m and int(m["n"]) == official_split:
            files[m["cls"]] = f
    if not files:
        raise LayoutError(f"no *_test_split{official_split}.txt files in {split_dir}")
    classes = sorted(files)
    index = index_videos(root)
    listing = Listing("hmdb51", classes)
    for label, cls in enumerate(classes):
        for line in files[cls].read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) < 2 or parts[1] not in ("1", "2"):
                continue
            stem = Path(parts[0]).stem
            direct = root / cls / parts[0]
            path = direct if direct.is_file() else pick(index.get(stem.lower()), prefer=cls)
            add(listing, Video(stem, path, "train" if parts[1] == "1" else "test", label, cls))
    return listing


# ---------------------------------------------------------------- Kinetics-400


def _k400_csvs(root: Path) -> dict[str, Path]:
    out = {}
    for base in (root, root / "annotations"):
        for split in ("train", "val", "validate", "validation", "test"):
            f = base / f"{split}.csv"
            name = "val" if split.startswith("valid") else split
            if f.is_file() and name not in out:
                out[name] = f
    return out


def list_k400(root: Path) -> Listing:
    """Kinetics-400 from the official CSVs; listed-but-absent videos go to ``missing``."""
    csvs = _k400_csvs(root)
    if not csvs:
        raise LayoutError(f"no train.csv/val.csv/test.csv in {root} or {root / 'annotations'} "
                          "(put the official Kinetics-400 CSVs there)")
    rows: dict[str, list[dict]] = {}
    for split, f in csvs.items():
        with open(f, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.DictReader(fh)
            need = {"youtube_id", "time_start", "time_end"}
            if not reader.fieldnames or not need <= set(reader.fieldnames):
                raise LayoutError(f"{f}: expected columns label,youtube_id,time_start,time_end,split")
            rows[split] = list(reader)
    labelled = rows.get("train") or next(iter(rows.values()))
    classes = sorted({r["label"].strip() for r in labelled if r.get("label", "").strip()})
    by_name = {c: i for i, c in enumerate(classes)}
    index = index_videos(root)
    listing = Listing("k400", classes)
    for split in SPLIT_NAMES:
        for line, r in enumerate(rows.get(split, []), start=2):
            try:
                vid = f"{r['youtube_id'].strip()}_{int(float(r['time_start'])):06d}_{int(float(r['time_end'])):06d}"
            except (TypeError, ValueError, AttributeError):
                raise ValueError(f"{csvs[split]} line {line}: expected youtube_id,time_start,time_end values, got "
                                 f"{r!r}; fix or delete that line") from None
            name = (r.get("label") or "").strip()
            label = by_name.get(name, -1)
            path = pick(index.get(vid.lower()), prefer=split)
            add(listing, Video(vid, path, split, label, name if label >= 0 else ""))
    return listing


# ---------------------------------------------------------------- Something-Something v2


def ssv2_label_name(template: str) -> str:
    """Official normalisation: 'Putting [something] on [something]' -> 'Putting something on something'."""
    return template.replace("[", "").replace("]", "")


def _find_file(root: Path, name: str) -> Path | None:
    for base in (root, root / "labels", root / "annotations"):
        if (base / name).is_file():
            return base / name
    return None


def list_ssv2(root: Path) -> Listing:
    """Something-Something v2 (``train`` / ``val`` / ``test``) from the official JSON files."""
    labels_file = _find_file(root, "something-something-v2-labels.json")
    if labels_file is None:
        raise LayoutError(f"something-something-v2-labels.json not found in {root} (or labels/); "
                          "put the official SSv2 label files there")
    with open(labels_file, encoding="utf-8") as f:
        label_map = {k: int(v) for k, v in json.load(f).items()}
    classes = [""] * len(label_map)
    for name, idx in label_map.items():
        if not 0 <= idx < len(classes):
            raise ValueError(f"{labels_file}: label ids must be 0..{len(classes) - 1}; found {idx}")
        classes[idx] = name
    index = index_videos(root)
    listing = Listing("ssv2", classes)
    found_any = False
    for split, stem in (("train", "train"), ("val", "validation"), ("test", "test")):
        f = _find_file(root, f"something-something-v2-{stem}.json")
        if f is None:
            continue
        found_any = True
        with open(f, encoding="utf-8") as fh:
            entries = json.load(fh)
        for e in entries:
            vid = str(e["id"])
            template = e.get("template")
            name = ssv2_label_name(template) if template else ""
            label = label_map.get(name, -1)
            add(listing, Video(vid, pick(index.get(vid.lower())), split, label, name if label >= 0 else ""))
    if not found_any:
        raise LayoutError(f"no something-something-v2-{{train,validation}}.json in {root}")
    return listing
