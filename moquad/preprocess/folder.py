"""The ``folder`` adapter: class sub-folders (optionally under train/val/test) or a CSV/TSV list.

Ids are relative paths with extension; each real file is listed once (another path to it is a
``duplicate of …`` row); symlink loops are not followed. A split is drawn, when asked, by
:mod:`moquad.preprocess.splits`.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

from moquad.preprocess.listing import Listing, Video, first_paths, walk_videos


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
