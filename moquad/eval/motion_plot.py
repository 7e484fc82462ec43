"""The motion report's figure (:mod:`moquad.eval.motion`): four panels a reader understands without the README."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _panel(ax: Any, k: int, result: dict[str, Any]) -> None:
    title, line, ylabel, groups, chance = PANELS[k]
    names = list(result["encoders"])
    width = 0.8 / max(1, len(names))
    scale = 100 if k in PERCENT else 1
    drawn = False
    for i, name in enumerate(names):
        vals = [fn(result["encoders"][name]) for _, fn in groups]
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        keep = [(x, v * scale) for x, v in zip(xs, vals) if v is not None]
        drawn |= bool(keep)
        bars = ax.bar([x for x, _ in keep], [v for _, v in keep], width, label=name, color=f"C{i}")
        ax.bar_label(bars, fmt="%.0f" if scale == 100 else "%.2f", fontsize=7)
    for g, c in enumerate(chance):
        if c is not None and drawn:
            ax.hlines(c * scale, g - 0.45, g + 0.45, colors="grey", linestyles="--", lw=1,
                      label="chance / reference" if g == 0 else None)
    if not drawn:
        ax.text(0.5, 0.5, "no labelled direction pairs in this split", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="grey")
    ax.set_xticks(range(len(groups)), [g for g, _ in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n{line}", fontsize=9)
    if scale == 100:
        ax.set_ylim(0, 110)
    elif k == 2:
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.1)


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Write the 2 x 2 figure (one bar per encoder in each panel, chance or the crop reference dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for k, ax in enumerate(axes.flat):
        _panel(ax, k, result)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=9)
    d, p = result["data"], result["protocol"]
    fig.suptitle(f"Motion report: does each frozen encoder react to motion or only to appearance?\n"
                 f"{d['videos']} videos of split '{d['split']}' ({Path(d['dir']).name}); one {p['frames']}-frame clip "
                 f"at {p['size']} px per video", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
