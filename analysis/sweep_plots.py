#!/usr/bin/python3
"""Plots of an exmy sweep directory (docs/sweeps.md).

    /usr/bin/python3 analysis/sweep_plots.py DIR

`exmy sweep` runs this after writing DIR/summary.csv (and with --summarize).
It reads DIR/index.json (axes and runs), DIR/summary.csv (the figures) and
each run's DIR/<run>/run.h5 (loss curves), and writes PNG files to DIR/plots/:

    loss_curves.png                  training loss of every run against the step
                                     (validation losses as dots in the same colour)
    <metric>_by_<axis>.png           final_window_train_loss, final_val_loss and, with a
                                     reference, gap_val of every finished run against
                                     each axis (one point per run; runs that share
                                     every other axis value joined by a line)

Run files are opened with SWMR read, so a sweep still running can be
plotted; of each group only the first len(step) rows are used. Needs
Debian's python3-h5py and python3-matplotlib; runs with /usr/bin/python3.
"""

import csv
import json
import math
import os
import re
import sys

try:
    import h5py
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # one line, like exmy's own errors
    sys.exit(f"sweep_plots.py: error: {e} (install python3-h5py and python3-matplotlib)")


def fail(msg):
    sys.exit(f"sweep_plots.py: error: {msg}")


def number(s):
    try:
        v = float(s)
    except (TypeError, ValueError):
        return math.nan
    return v


def read_curve(path):
    """(steps, losses, eval steps, eval losses) of a run file; empty lists when unreadable."""
    try:
        try:
            f = h5py.File(path, "r", swmr=True)
        except Exception:
            f = h5py.File(path, "r")
    except Exception:
        return [], [], [], []
    with f:
        def group(g, col):
            if g not in f or "step" not in f[g] or col not in f[g]:
                return [], []
            step = f[g]["step"][()]
            val = f[g][col][()]
            n = min(len(step), len(val))
            return list(step[:n]), list(val[:n])

        s, l = group("train", "loss")
        es, el = group("eval", "loss")
    return s, l, es, el


def safe(name):
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", name).strip("-") or "axis"


def main():
    if len(sys.argv) != 2:
        fail("usage: sweep_plots.py SWEEP_DIR")
    out = sys.argv[1]
    try:
        with open(os.path.join(out, "index.json")) as fh:
            index = json.load(fh)
    except (OSError, ValueError) as e:
        fail(f"cannot read {os.path.join(out, 'index.json')}: {e}")
    try:
        with open(os.path.join(out, "summary.csv"), newline="") as fh:
            rows = {int(r["index"]): r for r in csv.DictReader(fh)}
    except (OSError, ValueError, KeyError) as e:
        fail(f"cannot read {os.path.join(out, 'summary.csv')}: {e}")
    runs = index["runs"]
    axes = index["axes"]
    plots = os.path.join(out, "plots")
    os.makedirs(plots, exist_ok=True)
    written = []

    # Loss curves of every run.
    fig, ax = plt.subplots(figsize=(9, 5.5))
    cmap = plt.get_cmap("tab20" if len(runs) > 10 else "tab10")
    drawn = 0
    for i, r in enumerate(runs):
        s, l, es, el = read_curve(os.path.join(out, r["dir"], "run.h5"))
        if not s:
            continue
        colour = cmap(i % cmap.N)
        label = r["name"] if len(runs) <= 24 else None
        ax.plot(s, l, color=colour, linewidth=1.1, label=label)
        if es:
            ax.plot(es, el, "o", color=colour, markersize=3.5)
        drawn += 1
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token); dots: validation")
    ax.set_title(f"sweep {index.get('sweep', '')}: {drawn} of {len(runs)} runs")
    ax.grid(alpha=0.3)
    if drawn and len(runs) <= 24:
        ax.legend(fontsize=7, ncol=2 if len(runs) > 8 else 1)
    fig.tight_layout()
    p = os.path.join(plots, "loss_curves.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    # Each summary metric against each axis.
    metrics = ["final_window_train_loss", "final_val_loss"]
    if any(r.get("reference") not in (None, "") for r in runs):
        metrics.append("gap_val")
    for a, axis in enumerate(axes):
        labels = ["/".join(axis["values"][k][p] for k in range(len(axis["keys"])))
                  for p in range(len(axis["values"][0]))]
        axis_label = axis["name"] if len(axis["keys"]) == 1 else f"{axis['name']} ({', '.join(axis['keys'])})"
        for metric in metrics:
            # Lines join runs that agree on every other axis.
            lines = {}
            for r in runs:
                row = rows.get(r["index"])
                if row is None or row.get("status") != "done":
                    continue
                y = number(row.get(metric))
                if not math.isfinite(y):
                    continue
                x = labels.index("/".join(r["values"][k] for k in axis["keys"]))
                key = tuple(f"{k.split('.')[-1]}={r['values'][k]}"
                            for b, other in enumerate(axes) if b != a for k in other["keys"])
                lines.setdefault(key, []).append((x, y))
            if not lines:
                continue
            fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels) + 2.5), 4.2))
            for key, pts in lines.items():
                pts.sort()
                lab = ", ".join(key) if len(lines) <= 12 else None
                ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", linewidth=1, markersize=4, label=lab)
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30 if max(len(s) for s in labels) > 8 else 0, ha="right"
                               if max(len(s) for s in labels) > 8 else "center", fontsize=8)
            ax.set_xlabel(axis_label)
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
            if len(lines) > 1 and len(lines) <= 12:
                ax.legend(fontsize=7)
            fig.tight_layout()
            p = os.path.join(plots, f"{metric}_by_{safe(axis['name'])}.png")
            fig.savefig(p, dpi=110)
            plt.close(fig)
            written.append(p)
    print(f"plots: {len(written)} files in {plots}")


if __name__ == "__main__":
    main()
