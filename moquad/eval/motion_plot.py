"""The motion report's figure (:mod:`moquad.eval.motion`): the panels a reader understands without the README.

Accuracies carry their n (test clips) and a Wilson 95 % interval (:func:`wilson`); a panel no encoder has a
value for (the direction pairs of a split without labelled pairs) is left out, not drawn empty.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile: two-sided 95 %

# panel -> (title, the one-line explanation under it, y label, [(bar group, value of one encoder's result)], chance)
PANELS: list[tuple[str, str, str, list[tuple[str, Any]], list[float | None]]] = [
    ("Arrow of time and speed", "linear classifier on held-out videos: clip vs reversed; 1x vs 2x vs 4x",
     "top-1 accuracy (%)", [("forward vs\nreversed", lambda r: r["arrow_of_time_top1"]),
                            ("speed\n1x / 2x / 4x", lambda r: r["speed_top1"])], [0.5, 1 / 3]),
    ("Feature change, relative to another crop", "distance clip <-> variant / clip <-> another crop (1 = as a crop)",
     "distance ratio", [("reversed", lambda r: r["ratio_to_crop"]["reversed"]),
                        ("2x speed", lambda r: r["ratio_to_crop"]["speed2"]),
                        ("4x speed", lambda r: r["ratio_to_crop"]["speed4"]),
                        ("mirrored", lambda r: r["ratio_to_crop"]["mirror"]),
                        ("still", lambda r: r["ratio_to_crop"]["still"])], [1.0] * 5),
    ("Appearance share", "cosine of a clip and its middle frame repeated (1 = sees only one frame)",
     "cosine similarity", [("clip vs still", lambda r: r["appearance_share"])], [None]),
    ("Direction pairs", "kNN votes for the partner class of pairs differing only by direction (50% = blind)",
     "pair confusion (%)", [("mean over pairs", lambda r: (r.get("direction_pairs") or {}).get("mean"))], [0.5]),
]
PERCENT = {0, 3}  # panels drawn in %
CLASSES = {0: [2, 3]}  # panel -> classes of each group's held-out classifier (clip / reversed; 1x / 2x / 4x)


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``p`` observed on ``n`` trials (95 % by default). It holds ``p``: at p = 0
    or 1 rounding can put a bound 1e-16 on the wrong side (an error bar of negative length, which matplotlib
    refuses), so the bounds are clamped to ``p``."""
    if n <= 0:
        return (0.0, 1.0)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half)))


def held_out_clips(videos: int, classes: int) -> int:
    """The test clips of :func:`moquad.eval.motion.held_out_accuracy` on ``videos`` videos: the half it does not
    train on (``videos - max(1, videos // 2)``), one clip per class each."""
    return (videos - max(1, videos // 2)) * classes


def _panel(ax: Any, k: int, result: dict[str, Any]) -> None:
    title, line, ylabel, groups, chance = PANELS[k]
    names = list(result["encoders"])
    width = 0.8 / max(1, len(names))
    scale = 100 if k in PERCENT else 1
    ns = [held_out_clips(result["data"]["videos"], c) for c in CLASSES.get(k, [])]
    for i, name in enumerate(names):
        vals = [fn(result["encoders"][name]) for _, fn in groups]
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        keep = [(g, x, v) for g, (x, v) in enumerate(zip(xs, vals)) if v is not None]
        err = None
        if ns:  # Wilson 95 % interval of each accuracy, as (below, above) the bar
            ci = [wilson(v, ns[g]) for g, _, v in keep]
            err = [[scale * (v - lo) for (_, _, v), (lo, _) in zip(keep, ci)],
                   [scale * (hi - v) for (_, _, v), (_, hi) in zip(keep, ci)]]
        bars = ax.bar([x for _, x, _ in keep], [v * scale for _, _, v in keep], width, label=name, color=f"C{i}",
                      yerr=err, capsize=3, error_kw={"lw": 1, "ecolor": "black"})
        if err is None:
            ax.bar_label(bars, fmt="%.0f" if scale == 100 else "%.2f", fontsize=7)
        else:  # the value above its whisker
            for (_, x, v), up in zip(keep, err[1]):
                ax.text(x, scale * v + up + 1.5, f"{scale * v:.0f}", ha="center", va="bottom", fontsize=7)
    for g, c in enumerate(chance):
        if c is not None:
            ax.hlines(c * scale, g - 0.45, g + 0.45, colors="grey", linestyles="--", lw=1,
                      label="chance / reference" if g == 0 else None)
    labels = [f"{label}\nn = {ns[g]} test clips" if ns else label for g, (label, _) in enumerate(groups)]
    ax.set_xticks(range(len(groups)), labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n{line}" + ("\nerror bars: Wilson 95 % intervals" if ns else ""), fontsize=9)
    if scale == 100:
        ax.set_ylim(0, 115)
    elif k == 2:
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.1)


def drawn_panels(result: dict[str, Any]) -> list[int]:
    """The panels some encoder has a value for (an empty one is left out)."""
    return [k for k, (_, _, _, groups, _) in enumerate(PANELS)
            if any(fn(r) is not None for r in result["encoders"].values() for _, fn in groups)]


def figure(result: dict[str, Any]) -> Any:
    """The figure: one bar per encoder in each drawn panel, chance or the crop reference dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = drawn_panels(result)
    rows, cols = (2, 2) if len(panels) == 4 else (1, len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.3 * rows + 1.2), squeeze=False)
    for k, ax in zip(panels, axes.flat):
        _panel(ax, k, result)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=9)
    d, p = result["data"], result["protocol"]
    left_out = "" if 3 in panels else "\nno direction-pair panel: no labelled direction pairs (moquad motion --pair A,B)"
    fig.suptitle(f"Motion report: does each frozen encoder react to motion or only to appearance?\n"
                 f"n = {d['videos']} videos of split '{d['split']}' ({Path(d['dir']).name}); one {p['frames']}-frame "
                 f"clip at {p['size']} px per video; distances and shares are means over the n videos{left_out}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Write :func:`figure` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
