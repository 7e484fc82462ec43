"""What a dataset adapter returns (:class:`Listing` of :class:`Video`) and the helpers adapters share:
finding video files under a root (symlinks followed, loops not), picking one path per file.

Nothing here opens a video. The adapters are :mod:`moquad.preprocess.official` and
:mod:`moquad.preprocess.folder`; their table is :data:`moquad.preprocess.datasets.DATASETS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from moquad.errors import MoquadError

SPLIT_NAMES = ("train", "val", "test")


class LayoutError(MoquadError, ValueError):
    """ROOT lacks what an adapter reads (a folder, an annotation file); the message gains the expected layout."""


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
    from moquad.preprocess.transcode import VIDEO_EXTENSIONS  # here: importing the table stays light

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


def pick(candidates: list[Path] | None, prefer: str | None = None) -> Path | None:
    if not candidates:
        return None
    if prefer:
        for p in candidates:
            if prefer in p.parts:
                return p
    return candidates[0]


def add(listing: Listing, video: Video) -> None:
    (listing.videos if video.path is not None else listing.missing).append(video)


def require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise LayoutError(f"{what} not found at {path}")
    return path
