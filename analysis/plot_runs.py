#!/usr/bin/python3
"""Plots of exmy run files: loss curves, layer x step heatmaps of underflow
and saturation per GEMM operand, and block-scale and block-range histograms.

    analysis/plot_runs.py RUN.h5 [RUN2.h5 ...] --out DIR

A run directory may stand for its run.h5. Writes PNG files to DIR:

    loss.png                         training and validation loss of every run
                                     (quantized evaluations /eval/NAME/POLICY dotted)
    <run>_underflow.png              layer x step heatmaps, one panel per GEMM operand:
                                     the fraction of non-zero inputs flushed to zero
    <run>_saturation.png             the same for the fraction of elements clamped
    <run>_scale_hist.png             block-scale histograms (log2 of the decoded scale)
                                     per GEMM operand, summed over layers, at the first
                                     and last sampled steps
    <run>_range_hist.png             the same for the blocks' dynamic range (log2 of the
                                     block amax over its smallest non-zero magnitude)

Runs without per-tensor statistics (/quant, /hist: fp32 or bf16 runs, or
statistics off) get the loss curves only. Files are opened with SWMR read,
so a run that is still writing can be plotted; of each group only the first
len(step) rows are used (docs/hdf5-schema.md).

Needs Debian's python3-h5py and python3-matplotlib (tools/setup.sh installs
them); runs with /usr/bin/python3.
"""

import argparse
import os
import re
import sys

try:
    import h5py
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np
except ImportError as e:  # one line, like exmy's own errors
    sys.exit(f"plot_runs.py: error: {e} (install python3-h5py and python3-matplotlib: tools/setup.sh)")

ROLES = ["fprop-x", "fprop-w", "dgrad-dy", "dgrad-w", "wgrad-dy", "wgrad-x"]
GEMMS = ["fprop", "dgrad", "wgrad"]
KINDS = ["in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]


def natural_key(name):
    """layers.10 after layers.9; the linears of a block in forward order; lm_head last."""
    prefix, _, last = name.rpartition(".")
    parts = [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", prefix)]
    kind = KINDS.index(last) if last in KINDS else len(KINDS)
    return (name.startswith("lm_head"), parts, kind, name)


def fail(msg):
    sys.exit(f"plot_runs.py: error: {msg}")


def open_run(path):
    if os.path.isdir(path):
        path = os.path.join(path, "run.h5")
    if not os.path.exists(path):
        fail(f"run file '{path}' does not exist")
    try:
        f = h5py.File(path, "r", swmr=True)
    except OSError:
        try:
            f = h5py.File(path, "r")
        except OSError:
            fail(f"'{path}' is not an HDF5 file (or a killed run's: h5clear -s)")
    if "config" not in f.attrs or "schema_version" not in f.attrs:
        fail(f"'{path}' is not an exmy run file (no config and schema_version attributes)")
    return path, f


def rows(group, name):
    """Dataset `name` of a row group, cut to the rows its step column covers
    (None if absent); a step below 1 is a row a full disk cut off, and the
    rows end before it."""
    if name not in group or "step" not in group:
        return None
    step = np.asarray(group["step"][:])
    bad = np.flatnonzero(~(step >= 1))
    n = int(bad[0]) if bad.size else step.shape[0]
    return np.asarray(group[name][:n], dtype=np.float64)


def text_attr(f, name):
    v = f.attrs.get(name, "")
    return v.decode() if isinstance(v, bytes) else str(v)


def label_of(path, f):
    """Run directory and recipe; a run whose precision is bf16 and whose
    linears are not quantized (recipe fp32 or bf16) is labelled bf16."""
    d = os.path.basename(os.path.dirname(os.path.abspath(path)))
    recipe = text_attr(f, "recipe_name")
    if recipe == "fp32" and text_attr(f, "precision") == "bf16":
        recipe = "bf16"
    return f"{d} ({recipe})" if recipe else d


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "run"


def operand_groups(f, top):
    """{(layer, gemm, operand): group} for every row group /top/<layer>/<gemm>/<operand>."""
    out = {}
    if top not in f:
        return out

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and "step" in obj:
            parts = name.split("/")
            if len(parts) >= 3:
                out[(".".join(parts[:-2]), parts[-2], parts[-1])] = obj

    f[top].visititems(visit)
    return out


def per_step_max(steps, values):
    """Max over the rows of each step (micro-batches): (unique steps, values)."""
    us = np.unique(steps)
    v = np.full(len(us), np.nan)
    for i, s in enumerate(us):
        sel = values[steps == s]
        sel = sel[np.isfinite(sel)]
        if sel.size:
            v[i] = sel.max()
    return us, v


def plot_losses(runs, out):
    fig, ax = plt.subplots(figsize=(11, 5))
    markers = ["x", "+", "^", "v", "s", "d", "*", "<", ">"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    floor = None
    for i, (label, f) in enumerate(runs):
        c = colors[i % len(colors)]
        if "train" in f:
            s, l = rows(f["train"], "step"), rows(f["train"], "loss")
            if s is not None and l is not None:
                ax.plot(s, l, color=c, lw=1.2, label=f"{label} train")
                if len(l):
                    print(f"{label}: {len(l)} training rows, loss {l[0]:.4f} (step {int(s[0])}) -> "
                          f"{l[-1]:.4f} (step {int(s[-1])})")
        if "eval" in f:
            s, l = rows(f["eval"], "step"), rows(f["eval"], "loss")
            if s is not None and l is not None and len(s):
                ax.plot(s, l, color=c, lw=1.5, ls="--", marker="o", ms=4, label=f"{label} validation")
            # Quantized evaluations: /eval/<name>/<policy>/{step, loss}.
            k = 0
            for name in sorted(f["eval"]):
                g = f["eval"][name]
                if not isinstance(g, h5py.Group):
                    continue
                for policy in sorted(g):
                    q = g[policy]
                    if isinstance(q, h5py.Group):
                        s, l = rows(q, "step"), rows(q, "loss")
                        if s is not None and l is not None and len(s):
                            order = np.argsort(s, kind="stable")
                            ax.plot(s[order], l[order], color=c, lw=1, ls=":", marker=markers[k % len(markers)],
                                    ms=6, label=f"{label} eval {name} {policy}")
                            k += 1
        if "data_entropy_rate" in f.attrs:
            floor = float(f.attrs["data_entropy_rate"])
    if floor is not None:
        ax.axhline(floor, color="gray", lw=0.8, ls="-.", label=f"entropy rate {floor:.3f}")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("training and validation loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    path = os.path.join(out, "loss.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def stat_series(g, stat):
    """Per-row fraction of a /quant operand group: underflow or saturation."""
    if stat == "underflow":
        v = rows(g, "underflow_fraction")
        if v is None:
            num, den = rows(g, "underflow"), rows(g, "nonzero")
            v = None if num is None or den is None else np.where(den > 0, num / np.maximum(den, 1), np.nan)
    else:
        num, den = rows(g, "saturated"), rows(g, "elements")
        v = None if num is None or den is None else np.where(den > 0, num / np.maximum(den, 1), np.nan)
    return v


def plot_heatmaps(label, f, stat, out):
    groups = operand_groups(f, "quant")
    if not groups:
        return None
    roles = [r for r in ROLES if any(k[2] == r for k in groups)]
    roles += sorted({k[2] for k in groups} - set(roles))
    layers = sorted({k[0] for k in groups}, key=natural_key)
    steps = np.unique(np.concatenate([rows(g, "step") for g in groups.values()]))
    if not len(steps):
        return None
    ncol = 3 if len(roles) > 2 else len(roles)
    nrow = (len(roles) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol + 1, 0.22 * len(layers) * nrow + 2.2 * nrow),
                             squeeze=False)
    grids = {}
    for role in roles:
        grid = np.full((len(layers), len(steps)), np.nan)
        for (layer, gemm, operand), g in groups.items():
            if operand != role:
                continue
            v = stat_series(g, stat)
            if v is None:
                continue
            us, m = per_step_max(rows(g, "step"), v)
            grid[layers.index(layer), np.searchsorted(steps, us)] = m
        grids[role] = grid
    finite = [x for x in grids.values() if np.isfinite(x).any()]
    vmax = max((np.nanmax(x) for x in finite), default=0.0)
    # Where the largest value is (the first occurrence in role, layer, step order).
    where = ""
    for role in roles:
        grid = grids[role]
        if np.isfinite(grid).any() and np.nanmax(grid) == vmax:
            li, si = np.unravel_index(np.nanargmax(grid), grid.shape)
            where = f"{layers[li]} {role} step {int(steps[si])}"
            break
    summary = (f"{label}: {stat} heatmaps of {len(layers)} layers x {len(steps)} steps x {len(roles)} operands, "
               f"max {vmax * 100:.6g}% ({where})")
    vmax_pct = vmax * 100 if vmax > 0 else 1.0
    im = None
    for i, role in enumerate(roles):
        ax = axes[i // ncol][i % ncol]
        grid = grids[role] * 100
        im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest", cmap="viridis",
                       vmin=0, vmax=vmax_pct)
        ax.set_title(role, fontsize=9)
        ax.set_yticks(range(len(layers)))
        ax.set_yticklabels(layers if i % ncol == 0 else [""] * len(layers), fontsize=6)
        tick = max(1, len(steps) // 8)
        ax.set_xticks(range(0, len(steps), tick))
        ax.set_xticklabels([str(int(s)) for s in steps[::tick]], fontsize=7)
        ax.set_xlabel("step", fontsize=8)
    for j in range(len(roles), nrow * ncol):
        axes[j // ncol][j % ncol].axis("off")
    what = "non-zero inputs flushed to zero" if stat == "underflow" else "elements clamped at the format's maximum"
    fig.suptitle(f"{label}: {stat} (% of {what}; max over micro-batches)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.92, 0.95))
    cax = fig.add_axes((0.935, 0.15, 0.015, 0.7))
    fig.colorbar(im, cax=cax, label="%")
    path = os.path.join(out, f"{safe(label)}_{stat}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(summary)
    return path


def plot_scale_hist(label, f, out):
    return plot_hist(label, f, out, "counts", int(f.attrs.get("scale_hist_min_log2", -64)), "log2(block scale)",
                     "block-scale histograms", "scale_hist")


def plot_range_hist(label, f, out):
    return plot_hist(label, f, out, "range_counts", 0, "log2(block amax / smallest non-zero |x|)",
                     "block dynamic-range histograms", "range_hist")


def plot_hist(label, f, out, dataset, lo, xlabel, title, suffix):
    """Per role, the first and last statistics steps' histogram of /hist/.../<dataset>, all layers summed:
    bin k is the interval [lo + k, lo + k + 1) of the log2 axis."""
    groups = operand_groups(f, "hist")
    if not groups:
        return None
    roles = [r for r in ROLES if any(k[2] == r for k in groups)]
    roles += sorted({k[2] for k in groups} - set(roles))
    ncol = 3 if len(roles) > 2 else len(roles)
    nrow = (len(roles) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
    counted = []
    for i, role in enumerate(roles):
        ax = axes[i // ncol][i % ncol]
        sel = [g for k, g in groups.items() if k[2] == role and dataset in g]
        if not sel:
            ax.axis("off")
            continue
        steps = np.unique(np.concatenate([rows(g, "step") for g in sel]))
        width = sel[0][dataset].shape[1]
        shown = []
        for which, s in (("first", steps[0]), ("last", steps[-1])):
            if which == "last" and s == steps[0]:
                continue
            total = np.zeros(width)
            for g in sel:
                st = rows(g, "step")
                c = np.asarray(g[dataset][: len(st)], dtype=np.float64)
                total += c[st == s].sum(axis=0)
            shown.append((f"step {int(s)}", total))
        nz = np.nonzero(sum(t for _, t in shown))[0]
        if not nz.size:
            ax.set_title(f"{role} (no blocks)", fontsize=9)
            continue
        a, b = max(nz[0] - 2, 0), min(nz[-1] + 3, width)
        edges = np.arange(width + 1) + lo
        for name, t in shown:
            frac = t / max(t.sum(), 1)
            ax.stairs(frac[a:b], edges[a : b + 1], label=name)
            counted.append(f"{role} {name}: {int(t.sum())} blocks, mode 2^{int(np.argmax(t)) + lo}")
        ax.set_title(role, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel("fraction of blocks", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for j in range(len(roles), nrow * ncol):
        axes[j // ncol][j % ncol].axis("off")
    fig.suptitle(f"{label}: {title} (all layers)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path = os.path.join(out, f"{safe(label)}_{suffix}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"{label}: {title}, " + "; ".join(counted))
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run files (or run directories)")
    ap.add_argument("--out", required=True, help="folder for the PNG files (created if needed)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    runs, seen = [], {}
    for p in args.runs:
        path, f = open_run(p)
        if "train" not in f or rows(f["train"], "step") is None or len(rows(f["train"], "step")) == 0:
            fail(f"'{path}' has no training rows (the run stopped before its first logged step)")
        label = label_of(path, f)
        if label in seen:  # the same directory name twice: number them
            seen[label] += 1
            label = f"{label} #{seen[label]}"
        else:
            seen[label] = 1
        runs.append((label, f))

    written = [plot_losses(runs, args.out)]
    for label, f in runs:
        made = [plot_heatmaps(label, f, "underflow", args.out), plot_heatmaps(label, f, "saturation", args.out),
                plot_scale_hist(label, f, args.out), plot_range_hist(label, f, args.out)]
        if not any(made):
            print(f"{label}: no per-tensor statistics (/quant, /hist): loss curves only")
        written += [m for m in made if m]
    for w in written:
        print(w)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, KeyError, ValueError, RuntimeError) as e:  # a corrupt or truncated file, an unwritable --out
        fail(f"{type(e).__name__}: {e}".replace("\n", " "))
