"""Train/val/test splits for datasets that come without one (``preprocess folder --split-ratios``).

The split is drawn once per listing, seeded, and stratified by class:

- without ``--group-by``, every class's split sizes are ``floor`` or ``ceil`` of ``n_class * ratio``
  (so within one video of the ratio in every class); a class's extra videos go first to splits that
  have none of it yet (a class of 3 at 0.7,0.3 is 2/1, not 3/0: evaluation needs it in test), then
  to the split furthest behind its share of the whole dataset;
- with ``--group-by REGEX``, the unit is a group (the regex's first group, or its whole match, on
  the file name, e.g. UCF101's ``_g(\\d+)_``): a group never straddles two splits. Groups are
  placed largest first, each where it lowers the per-class squared distance to the targets the most.
  A file the regex does not match is a group of its own (counted as ``unmatched``).

Only the videos found on disk take part. The same files, ratios, seed and regex always give the
same split, whatever order the disk lists them in.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from moquad.errors import MoquadError
from moquad.preprocess.listing import Listing, Video

# what to do about a dataset whose videos are all in train (said by preprocessing, and again by an evaluation)
NO_TEST_SPLIT_FIX = "preprocess again into a new --out with --split-ratios 0.8,0.2"
DRAWN_SPLITS = {2: ("train", "test"), 3: ("train", "val", "test")}  # number of --split-ratios shares -> split names


def parse_ratios(text: str) -> tuple[float, ...]:
    """``"0.8,0.2"`` -> ``(0.8, 0.2)``; checked by :func:`check`."""
    try:
        ratios = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--split-ratios {text!r}: expected numbers separated by commas, e.g. 0.8,0.2 "
                         "(train,test) or 0.7,0.1,0.2 (train,val,test)") from None
    check(ratios, None)
    return ratios


def check(ratios: tuple[float, ...] | None, group_by: str | None) -> None:
    """Reject ratios that are not 2 or 3 positive shares summing to 1, and a bad or orphan regex."""
    if ratios is not None:
        text = ",".join(f"{r:g}" for r in ratios)
        if len(ratios) not in DRAWN_SPLITS:
            raise ValueError(f"--split-ratios {text}: give 2 shares (train,test) or 3 (train,val,test)")
        if min(ratios) <= 0 or abs(sum(ratios) - 1) > 1e-6:
            raise ValueError(f"--split-ratios {text}: shares must be positive and sum to 1, e.g. 0.8,0.2")
    if group_by is not None:
        if ratios is None:
            raise ValueError("--group-by only applies when drawing a split; add --split-ratios, e.g. 0.8,0.2")
        try:
            re.compile(group_by)
        except re.error as e:
            raise ValueError(f"--group-by {group_by!r} is not a valid regular expression ({e})") from None


def group_key(name: str, pattern: re.Pattern[str]) -> str | None:
    """The regex's first group (or whole match) in a file name; None when it does not match."""
    m = pattern.search(name)
    if m is None:
        return None
    return m.group(1) if pattern.groups else m.group(0)


def _exact(ratios: tuple[float, ...]) -> list[Fraction]:
    shares = [Fraction(str(r)) for r in ratios]
    return [s / sum(shares) for s in shares]


def _class_counts(sizes: dict[int, int], shares: list[Fraction], rng: random.Random) -> dict[int, list[int]]:
    """Per class, how many videos each split gets: floor or ceil of n * share; every split, then totals first."""
    total = sum(sizes.values())
    counts = {c: [math.floor(n * r) for r in shares] for c, n in sizes.items()}
    given = [sum(cs[s] for cs in counts.values()) for s in range(len(shares))]
    order = sorted(sizes)
    rng.shuffle(order)
    for c in order:
        left = sizes[c] - sum(counts[c])
        can = [s for s in range(len(shares)) if sizes[c] * shares[s] > counts[c][s]]
        can.sort(key=lambda s: (counts[c][s] > 0, given[s] - total * shares[s], s))
        for s in can[:left]:
            counts[c][s] += 1
            given[s] += 1
    return counts


def _place_groups(groups: dict[str, list[Video]], shares: list[Fraction], rng: random.Random) -> dict[str, int]:
    """Split index of each group: largest first, where the per-class squared error grows least."""
    sizes = Counter(v.label for vids in groups.values() for v in vids)
    target = [{c: float(n * r) for c, n in sizes.items()} for r in shares]
    have: list[Counter[int]] = [Counter() for _ in shares]
    keys = sorted(groups)
    rng.shuffle(keys)
    keys.sort(key=lambda g: -len(groups[g]))  # stable: equal sizes keep the seeded order
    placed = {}
    for g in keys:
        comp = Counter(v.label for v in groups[g])

        def cost(s: int, comp: Counter[int] = comp) -> float:
            return sum(m * (2 * (have[s][c] - target[s][c]) + m) for c, m in comp.items())

        s = min(range(len(shares)), key=lambda s: (cost(s), s))
        placed[g] = s
        have[s].update(comp)
    return placed


def assign(listing: Listing, ratios: tuple[float, ...], seed: int, group_by: str | None = None) -> dict[str, Any]:
    """Set the split of every found video of ``listing``; return the record kept in dataset.json."""
    check(ratios, group_by)
    if listing.split_given:
        raise ValueError("the dataset already names its splits (train/val/test sub-folders or a split column); "
                         "drop --split-ratios to use them as given, or put the class folders directly in ROOT")
    names = DRAWN_SPLITS[len(ratios)]
    shares = _exact(ratios)
    rng = random.Random(f"split-{seed}")
    videos = sorted(listing.videos, key=lambda v: v.video_id)
    record: dict[str, Any] = {"method": "ratios", "ratios": list(ratios), "seed": seed, "group_by": group_by}
    if group_by is None:
        by_class: dict[int, list[Video]] = {}
        for v in videos:
            by_class.setdefault(v.label, []).append(v)
        counts = _class_counts({c: len(vs) for c, vs in by_class.items()}, shares, rng)
        for c in sorted(by_class):
            vs = by_class[c]
            rng.shuffle(vs)
            start = 0
            for name, n in zip(names, counts[c]):
                for v in vs[start : start + n]:
                    v.split = name
                start += n
    else:
        pattern = re.compile(group_by)
        groups: dict[str, list[Video]] = {}
        unmatched = 0
        for v in videos:
            key = group_key(v.path.name if v.path else v.video_id, pattern)
            unmatched += key is None
            groups.setdefault(f"g:{key}" if key is not None else f"v:{v.video_id}", []).append(v)
        placed = _place_groups(groups, shares, rng)
        for g, vs in groups.items():
            for v in vs:
                v.split = names[placed[g]]
        record["groups"] = {n: sum(placed[g] == i for g in groups) for i, n in enumerate(names)}
        record["unmatched"] = unmatched
    record["videos"] = {n: sum(v.split == n for v in videos) for n in names}
    return record


def describe(listing: Listing, dataset: str, official_split: int) -> dict[str, Any]:
    """The record of a split that was not drawn: official, given by the layout, or one ``train`` split."""
    from moquad.preprocess.datasets import DATASETS

    counts = dict(sorted(Counter(v.split for v in listing.videos).items()))
    if DATASETS[dataset].official_splits:
        return {"method": "official", "official_split": official_split, "videos": counts}
    if dataset != "folder":
        return {"method": "official", "videos": counts}
    return {"method": "given" if listing.split_given else "none", "videos": counts}


def check_unmoved(videos: list[Video], done: dict[str, str], out: Any) -> None:
    """Refuse to resume when a video already written (``done``: id -> split) would now go to another split."""
    moved = [(v, done[v.video_id]) for v in videos if v.video_id in done and done[v.video_id] != v.split]
    if moved:
        v, was = moved[0]
        raise MoquadError(f"{len(moved)} video(s) already in {out} would now go to another split (e.g. {v.video_id}: "
                          f"{was} -> {v.split}): the videos under ROOT changed since the split was drawn; "
                          "restore them, or preprocess into a new --out")
