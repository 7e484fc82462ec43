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


SPLIT_FOLDERS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}  # any case


def _check_split_folders(root: Path, split_dirs: list[tuple[str, Path]]) -> None:
    """A folder named like a split (``test``) is read as a split whose sub-folders are the classes. When that
    cannot be what the user meant, say so instead of skipping videos: other folders of ROOT hold videos too (a
    class named ``test`` beside ``cats`` and ``dogs``), or a split folder holds videos directly."""
    from moquad.preprocess.transcode import VIDEO_EXTENSIONS

    named = ", ".join(d.name for _, d in split_dirs)
    others = [d.name for d in sorted(root.iterdir()) if d.is_dir() and d.name.lower() not in SPLIT_FOLDERS
              and not d.name.startswith(".") and walk_videos(d, root)]
    if others:
        raise ValueError(f"{root} holds split folders ({named}) beside class folders ({', '.join(others[:5])}"
                         f"{', ...' if len(others) > 5 else ''}): a folder named train, val or test is read as a "
                         f"split whose sub-folders are the classes; if {named} is a class, rename it (e.g. "
                         f"{split_dirs[0][1].name}_class), else move every class folder into the split folders")
    for _, d in split_dirs:
        if any(f.is_file() and f.suffix.lower() in VIDEO_EXTENSIONS for f in d.iterdir()):
            raise ValueError(f"{d} holds videos directly, but a folder named {d.name} is read as a split whose "
                             f"sub-folders are the classes; if {d.name} is a class, rename it (e.g. {d.name}_class), "
                             "else put its videos in class sub-folders")


def list_folder(root: Path) -> Listing:
    """Class sub-folders (optionally under train/val/test) or a CSV/TSV list ``path,label[,split]``."""
    if root.is_file():
        if root.suffix.lower() not in (".csv", ".tsv", ".tab", ".txt"):
            raise ValueError(f"{root} is a file, not a folder or a .csv/.tsv list; pass a folder of class "
                             "sub-folders or a CSV/TSV with rows path,label[,split]")
        return _list_table(root)
    split_dirs = sorted((SPLIT_FOLDERS[d.name.lower()], d) for d in root.iterdir()
                        if d.is_dir() and d.name.lower() in SPLIT_FOLDERS)
    if split_dirs:
        _check_split_folders(root, split_dirs)
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
