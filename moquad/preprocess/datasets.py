"""The dataset-adapter table: name -> the function that lists a dataset's videos + the layout it expects.

Adding a dataset is one entry in :data:`DATASETS` (and its lister, here or in a module of its
own): ``PreprocessConfig.dataset``'s choices, the ``moquad preprocess`` help and the error shown
for a wrong layout all read this table. Listers: :mod:`moquad.preprocess.official` (k400, ucf101,
hmdb51, ssv2) and :mod:`moquad.preprocess.folder`; what they return: :mod:`moquad.preprocess.listing`.
Nothing here opens a video, and importing this module is cheap (the config imports it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moquad.errors import setting
from moquad.preprocess.folder import list_folder
from moquad.preprocess.listing import LayoutError, Listing, Video
from moquad.preprocess.official import list_hmdb51, list_k400, list_ssv2, list_ucf101, ssv2_label_name

__all__ = ["DATASETS", "Adapter", "LayoutError", "Listing", "Video", "list_dataset", "raw_layout", "list_hmdb51", "list_k400",
           "list_ssv2", "list_ucf101", "list_folder", "ssv2_label_name"]


@dataclass(frozen=True)
class Adapter:
    """``lister(root)``, or ``lister(root, official_split)`` for datasets with ``official_splits``."""

    lister: Callable[..., Listing]
    layout: str  # what ROOT must hold: shown by `moquad preprocess --help` and when ROOT does not match
    official_splits: tuple[int, ...] = ()  # the dataset's numbered train/test splits (--official-split)
    marks: tuple[str, ...] = ()  # globs under ROOT that only this dataset's raw layout has (raw_layout)


D6 = "[0-9]" * 6  # Kinetics' file names: {youtube_id}_{start:06d}_{end:06d}.<ext>
DATASETS: dict[str, Adapter] = {
    "k400": Adapter(list_k400, "{train,val,test}.csv (label,youtube_id,time_start,time_end,split) in ROOT or "
                    "ROOT/annotations; videos {youtube_id}_{start:06d}_{end:06d}.<ext> anywhere under ROOT "
                    "(flat per split or in class folders)",
                    marks=tuple(f"{d}*_{D6}_{D6}.*" for d in ("", "*/", "*/*/"))),
    "ucf101": Adapter(list_ucf101, "UCF-101/<Class>/*.avi (or the class folders directly in ROOT) and "
                      "ucfTrainTestlist/{classInd,trainlist0N,testlist0N}.txt", (1, 2, 3),
                      marks=("ucfTrainTestlist", "*/ucfTrainTestlist", "UCF-101", "*/v_*_g[0-9][0-9]_c[0-9][0-9].*",
                             "*/*/v_*_g[0-9][0-9]_c[0-9][0-9].*")),
    "hmdb51": Adapter(list_hmdb51, "<class>/*.avi and testTrainMulti_7030_splits/<class>_test_split{N}.txt "
                      "(1 = train, 2 = test, 0 = unused)", (1, 2, 3),
                      marks=("testTrainMulti_7030_splits", "*/testTrainMulti_7030_splits")),
    "ssv2": Adapter(list_ssv2, "<id>.webm and something-something-v2-{train,validation,test}.json plus "
                    "something-something-v2-labels.json (in ROOT, labels/ or annotations/)",
                    marks=tuple(f"{d}something-something-v2-labels.json" for d in ("", "*/"))),
    "folder": Adapter(list_folder, "ROOT/<class>/<video> (one split, train, or drawn with --split-ratios), "
                      "ROOT/{train,val,test}/<class>/<video>, or a CSV/TSV file of rows path,label[,split]"),
}


def raw_layout(root: str | Path) -> str | None:
    """The dataset whose raw layout folder ``root`` has (a row's ``marks``: UCF101's ``ucfTrainTestlist/`` or its
    ``v_<Class>_gNN_cNN`` videos, HMDB51's ``testTrainMulti_7030_splits/``, ...), so a raw folder given where shards
    are read names the right ``moquad preprocess`` command; None when no row's marks are there."""
    root = Path(root)
    return next((name for name, a in DATASETS.items() if any(next(root.glob(m), None) for m in a.marks)), None)


def _listing(dataset: str, root: Path, official_split: int | None) -> Listing:
    adapter = DATASETS[dataset]
    if not adapter.official_splits:
        return adapter.lister(root)
    if official_split not in adapter.official_splits:
        given = "none was given" if official_split is None else f"got {setting('official_split', official_split)}"
        raise ValueError(f"{dataset} has official splits {', '.join(map(str, adapter.official_splits))}; {given}")
    return adapter.lister(root, official_split)


def _check_splits(listing: Listing, root: Path) -> None:
    for split in {v.split for v in listing.videos + listing.missing}:
        if not re.fullmatch(r"[a-z0-9_]+", split) or split == "errors":
            raise ValueError(f"split name {split!r} in {root} is not usable; use lowercase letters, digits and _ "
                             "(e.g. train, val, test), not 'errors'")


def _drop_repeated_ids(listing: Listing) -> None:
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


def list_dataset(dataset: str, root: str | Path, official_split: int | None = None) -> Listing:
    """The videos of ``root`` read as ``dataset`` (a key of :data:`DATASETS`), checked not to be empty.

    ``official_split`` is required by datasets with official splits (ucf101, hmdb51) and unused by others.
    A root that does not match the layout raises :class:`LayoutError` naming the layout expected.
    """
    root = Path(root).expanduser().absolute()
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    if not root.exists():
        raise FileNotFoundError(f"dataset root {root} does not exist; pass the folder that holds the {dataset} files")
    layout = DATASETS[dataset].layout
    try:
        listing = _listing(dataset, root, official_split)
    except LayoutError as e:
        raise LayoutError(f"{e}; {dataset} expects {layout}") from None
    if not listing.videos and not listing.missing:
        raise LayoutError(f"no videos found for {dataset} under {root}; {dataset} expects {layout}")
    _check_splits(listing, root)
    _drop_repeated_ids(listing)
    return listing
