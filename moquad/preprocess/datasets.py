"""Dataset adapters: each dataset's own layout and annotation files -> one list of videos.

Every adapter returns a :class:`Listing` (classes in label order, the videos found, and the
videos the annotations list but the disk lacks). Nothing here opens a video.

Layouts (ROOT is what the user passes):
- ``k400``: ``{train,val,test}.csv`` (``label,youtube_id,time_start,time_end,split``) in ROOT or
  ROOT/annotations; videos ``{youtube_id}_{start:06d}_{end:06d}.<ext>`` anywhere under ROOT
  (flat per split or in class folders).
- ``ucf101``: ``UCF-101/<Class>/*.avi`` (or class folders directly in ROOT) and
  ``ucfTrainTestlist/{classInd,trainlist0N,testlist0N}.txt``.
- ``hmdb51``: ``<class>/*.avi`` and ``testTrainMulti_7030_splits/<class>_test_split{N}.txt``
  (1 = train, 2 = test, 0 = unused).
- ``ssv2``: ``<id>.webm`` and ``something-something-v2-{train,validation,test}.json`` plus
  ``something-something-v2-labels.json``; templates are normalised as the official code does.
- ``folder``: ``ROOT/<class>/**`` (split ``train``, or drawn: :mod:`moquad.preprocess.splits`),
  ``ROOT/{train,val,test}/<class>/**`` (any case; ``validation`` too), or a CSV/TSV file ``path,label[,split]`` (paths
  relative to its folder); ids are relative paths with extension. Each real file is listed once
  (another path to it is a ``duplicate of …`` error row); symlink loops are not followed.
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from moquad.preprocess.transcode import VIDEO_EXTENSIONS

DATASETS = ("k400", "ucf101", "hmdb51", "ssv2", "folder")
SPLIT_NAMES = ("train", "val", "test")


@dataclass
class Video:
    """One annotated video; ``path`` is None when the annotation names a file that is not on disk."""

    video_id: str
    path: Path | None
    split: str
    label: int
    class_name: str


@dataclass
class Listing:
    name: str
    classes: list[str]
    videos: list[Video] = field(default_factory=list)
    missing: list[Video] = field(default_factory=list)
    # inputs left out, with the reason: repeated ids in the annotations, a second path to one file
    duplicates: list[tuple[Video, str]] = field(default_factory=list)
    split_given: bool = False  # the layout or list names each video's split (no --split-ratios then)


def walk_videos(top: Path, root: Path | None = None) -> list[tuple[Path, int]]:
    """``(path, links)`` of the videos under ``top``, ``links`` = folder symlinks crossed; links are followed
    (datasets link to other disks), never into a folder on the current path nor into ``root`` or above
    (a loop such as ``walk/up -> ..``)."""
    stop = os.path.realpath(root if root is not None else top)
    state = {str(top): (int(os.path.islink(top)), (os.path.realpath(top),))}
    found: list[tuple[Path, int]] = []
    for dirpath, dirnames, filenames in os.walk(str(top), followlinks=True):
        links, chain = state.pop(dirpath)
        keep = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            real = os.path.realpath(full)
            if real in chain or real == stop or stop.startswith(real.rstrip(os.sep) + os.sep):
                continue  # a loop: it leads back to a folder being walked
            keep.append(d)
            state[full] = (links + os.path.islink(full), (*chain, real))
        dirnames[:] = keep
        found += [(Path(dirpath) / name, links) for name in sorted(filenames)
                  if os.path.splitext(name)[1].lower() in VIDEO_EXTENSIONS]
    return found


def first_paths(found: list[tuple[Path, int]]) -> dict[str, Path]:
    """Real path -> the path that represents it: fewest folder symlinks crossed, then sort order."""
    best: dict[str, Path] = {}
    for path, _ in sorted(found, key=lambda t: (t[1], str(t[0]))):
        best.setdefault(os.path.realpath(path), path)
    return best


def index_videos(root: Path) -> dict[str, list[Path]]:
    """Map lowercased stem -> video paths under ``root``; a name reached twice (links) is kept once."""
    found: dict[str, list[Path]] = {}
    seen: set[tuple[str, str]] = set()
    for path, _ in sorted(walk_videos(root), key=lambda t: (t[1], str(t[0]))):
        if (path.name, os.path.realpath(path)) not in seen:
            seen.add((path.name, os.path.realpath(path)))
            found.setdefault(path.stem.lower(), []).append(path)
    return found


def _pick(candidates: list[Path] | None, prefer: str | None = None) -> Path | None:
    if not candidates:
        return None
    if prefer:
        for p in candidates:
            if prefer in p.parts:
                return p
    return candidates[0]


def _add(listing: Listing, video: Video) -> None:
    (listing.videos if video.path is not None else listing.missing).append(video)


def _require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise FileNotFoundError(f"{what} not found at {path}; check ROOT and the dataset layout (see `moquad preprocess --help`)")
    return path


# ---------------------------------------------------------------- UCF101


def list_ucf101(root: Path, split: int = 1) -> Listing:
    """UCF101 with official train/test split ``split`` (1, 2 or 3)."""
    if split not in (1, 2, 3):
        raise ValueError(f"ucf101 has splits 1, 2, 3; got --split {split}")
    lists = _require_dir(root / "ucfTrainTestlist", "ucfTrainTestlist/ (the official split files)")
    video_root = root / "UCF-101" if (root / "UCF-101").is_dir() else root
    class_ind = lists / "classInd.txt"
    if not class_ind.is_file():
        raise FileNotFoundError(f"{class_ind} not found; download ucfTrainTestlist from the UCF101 site")
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
    for split_name, fname in (("train", f"trainlist0{split}.txt"), ("test", f"testlist0{split}.txt")):
        fpath = lists / fname
        if not fpath.is_file():
            raise FileNotFoundError(f"{fpath} not found; ucfTrainTestlist/ must hold the official split files")
        for line in fpath.read_text().splitlines():
            if not line.strip():
                continue
            rel = line.split()[0]
            cls_dir, fname_ = rel.split("/", 1) if "/" in rel else ("", rel)
            label = by_lower.get(cls_dir.lower(), -1)
            stem = Path(fname_).stem
            direct = video_root / rel
            path = direct if direct.is_file() else _pick(index.get(stem.lower()))
            _add(listing, Video(stem, path, split_name, label, classes[label] if label >= 0 else cls_dir))
    return listing


# ---------------------------------------------------------------- HMDB51

_HMDB_SPLIT = re.compile(r"^(?P<cls>.+)_test_split(?P<n>[123])\.txt$")


def list_hmdb51(root: Path, split: int = 1) -> Listing:
    """HMDB51 with official split ``split``: 1 = train, 2 = test, 0 = unused (skipped)."""
    if split not in (1, 2, 3):
        raise ValueError(f"hmdb51 has splits 1, 2, 3; got --split {split}")
    split_dir = _require_dir(root / "testTrainMulti_7030_splits", "testTrainMulti_7030_splits/ (official split files)")
    files = {}
    for f in split_dir.iterdir():
        m = _HMDB_SPLIT.match(f.name)
        if m and int(m["n"]) == split:
            files[m["cls"]] = f
    if not files:
        raise ValueError(f"no *_test_split{split}.txt files in {split_dir}")
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
            path = direct if direct.is_file() else _pick(index.get(stem.lower()), prefer=cls)
            _add(listing, Video(stem, path, "train" if parts[1] == "1" else "test", label, cls))
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
        raise FileNotFoundError(f"no train.csv/val.csv/test.csv in {root} or {root / 'annotations'}; "
                                "put the official Kinetics-400 CSVs there")
    rows: dict[str, list[dict]] = {}
    for split, f in csvs.items():
        with open(f, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.DictReader(fh)
            need = {"youtube_id", "time_start", "time_end"}
            if not reader.fieldnames or not need <= set(reader.fieldnames):
                raise ValueError(f"{f}: expected columns label,youtube_id,time_start,time_end,split")
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
            path = _pick(index.get(vid.lower()), prefer=split)
            _add(listing, Video(vid, path, split, label, name if label >= 0 else ""))
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
        raise FileNotFoundError(f"something-something-v2-labels.json not found in {root} (or labels/); "
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
            _add(listing, Video(vid, _pick(index.get(vid.lower())), split, label, name if label >= 0 else ""))
    if not found_any:
        raise FileNotFoundError(f"no something-something-v2-{{train,validation}}.json in {root}")
    return listing


# ---------------------------------------------------------------- generic folder / CSV


def _class_order(names: set[str]) -> list[str]:
    if names and all(re.fullmatch(r"-?\d+", n) for n in names):
        return sorted(names, key=int)
    return sorted(names)


def _folder_vid(path: Path, base: Path) -> str:
    """Relative path with extension: ``a/x.mp4`` and ``a/x.avi`` are different videos."""
    return path.relative_to(base).as_posix()


def list_folder(root: Path) -> Listing:
    """Class sub-folders (optionally under train/val/test) or a CSV/TSV list ``path,label[,split]``."""
    if root.is_file():
        if root.suffix.lower() not in (".csv", ".tsv", ".tab", ".txt"):
            raise ValueError(f"{root} is a file, not a folder or a .csv/.tsv list; pass a folder of class "
                             "sub-folders or a CSV/TSV with rows path,label[,split]")
        return _list_table(root)
    named = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}  # any case
    split_dirs = sorted((named[d.name.lower()], d) for d in root.iterdir() if d.is_dir() and d.name.lower() in named)
    bases = split_dirs or [("train", root)]
    walked = [(p, links, split, c.name) for split, base in bases for c in sorted(d for d in base.iterdir() if d.is_dir())
              for p, links in walk_videos(c, root)]
    where = {p: (split, cls) for p, _, split, cls in walked}  # path -> (split, class)
    found = [(p, links) for p, links, _, _ in walked]
    first = first_paths(found)
    by_name = {c: i for i, c in enumerate(_class_order({where[p][1] for p in first.values()}))}

    def video(p: Path) -> Video:
        return Video(_folder_vid(p, root), p, where[p][0], by_name.get(where[p][1], -1), where[p][1])

    listing = Listing(root.name or "folder", list(by_name), split_given=bool(split_dirs))
    listing.videos = [video(p) for p in sorted(first.values(), key=str)]
    listing.duplicates = [(video(p), f"duplicate of {first[os.path.realpath(p)]}") for p, _ in found
                          if first[os.path.realpath(p)] != p]
    return listing


def _list_table(table: Path) -> Listing:
    delim = "\t" if table.suffix.lower() in (".tsv", ".tab") else ","
    with open(table, newline="", encoding="utf-8", errors="replace") as f:
        rows = [r for r in csv.reader(f, delimiter=delim) if r and any(c.strip() for c in r)]
    if rows and rows[0][0].strip().lower() in ("path", "video", "file", "filename"):
        rows = rows[1:]
    if not rows:
        raise ValueError(f"{table} lists no videos; expected rows 'path,label[,split]'")
    for i, r in enumerate(rows):
        if len(r) < 2 or not r[1].strip():
            raise ValueError(f"{table} line {i + 1}: expected 'path,label[,split]', got {delim.join(r)!r}")
    classes = _class_order({r[1].strip() for r in rows})
    by_name = {c: i for i, c in enumerate(classes)}
    listing = Listing(table.stem, classes, split_given=any(len(r) > 2 and r[2].strip() for r in rows))
    base = table.absolute().parent  # relative paths resolve against the list's folder, not the cwd
    first: dict[str, Path] = {}
    for r in rows:
        rel = r[0].strip()
        split = r[2].strip() if len(r) > 2 and r[2].strip() else "train"
        p = Path(rel).expanduser() if Path(rel).expanduser().is_absolute() else base / rel
        video = Video(Path(rel).as_posix().lstrip("/"), p if p.is_file() else None, split, by_name[r[1].strip()],
                      r[1].strip())
        if video.path is None:
            listing.missing.append(video)
        elif first.setdefault(os.path.realpath(p), p) != p:
            listing.duplicates.append((video, f"duplicate of {first[os.path.realpath(p)]}"))
        else:
            listing.videos.append(video)
    return listing


def list_dataset(dataset: str, root: str | Path, split: int = 1) -> Listing:
    """Dispatch on ``dataset`` (one of :data:`DATASETS`) and check the result is not empty."""
    root = Path(root).expanduser().absolute()
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    if not root.exists():
        raise FileNotFoundError(f"dataset root {root} does not exist; pass the folder that holds the {dataset} files")
    if dataset == "ucf101":
        listing = list_ucf101(root, split)
    elif dataset == "hmdb51":
        listing = list_hmdb51(root, split)
    elif dataset == "k400":
        listing = list_k400(root)
    elif dataset == "ssv2":
        listing = list_ssv2(root)
    else:
        listing = list_folder(root)
    if not listing.videos and not listing.missing:
        expected = {"ucf101": "UCF-101/<Class>/*.avi and ucfTrainTestlist/",
                    "hmdb51": "<class>/*.avi and testTrainMulti_7030_splits/",
                    "k400": "{train,val,test}.csv (or annotations/) and the videos, flat or in class folders",
                    "ssv2": "<id>.webm and something-something-v2-{train,validation,labels}.json",
                    }.get(dataset, "class sub-folders <class>/<video>, or a CSV/TSV list path,label[,split]")
        raise ValueError(f"no videos found for {dataset} under {root}; expected {expected}")
    for split in {v.split for v in listing.videos + listing.missing}:
        if not re.fullmatch(r"[a-z0-9_]+", split) or split == "errors":
            raise ValueError(f"split name {split!r} in {root} is not usable; use lowercase letters, digits and _ "
                             "(e.g. train, val, test), not 'errors'")
    ids: set[str] = set()
    for kind in ("videos", "missing"):
        kept = []
        for v in getattr(listing, kind):
            if v.video_id in ids:
                listing.duplicates.append((v, "duplicate: video id listed more than once in the annotations"))
            else:
                kept.append(v)
            ids.add(v.video_id)
        setattr(listing, kind, kept)
    return listing
