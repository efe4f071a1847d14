#!/usr/bin/env python3
"""Tables of the UE5M3 proxy study (RESULTS.md) from a sweep directory.

    build/exmy sweep experiments/ue5m3-proxy/sweep.ini --out runs/ue5m3-proxy --summarize
    /usr/bin/python3 experiments/ue5m3-proxy/make_tables.py runs/ue5m3-proxy > runs/ue5m3-proxy/tables.md

Reads the sweep's summary.csv and summary_roles.csv (written by
`exmy sweep --summarize`) and prints Markdown: the loss table per recipe
(mean and spread over the finished seeds), the ordering next to the UE5M3
paper's 8B table, and the per-role statistics that explain the differences.
Only finished runs (status done or diverged) enter the tables; the others
are listed as missing. Standard library only.
"""
import csv
import math
import os
import sys

# The order of the paper's table, with its 8B final losses (lower is better).
PAPER = [
    ("bf16", 2.2651),
    ("ue5m3-te-settings", 2.2902),
    ("ue5m3-b16", 2.3090),
    ("ue5m3-b16-fp32gemm", 2.3157),
    ("ue5m3-b32", 2.3241),
    ("te-nvfp4", 2.3474),
    ("nvfp4-no-rht-all", 2.4420),
    ("mxfp4", None),  # not in the paper's table
]
ROLES = ["fprop-x", "fprop-w", "dgrad-dy", "dgrad-w", "wgrad-dy", "wgrad-x"]


def fail(msg):
    sys.exit(f"make_tables.py: error: {msg}")


def read_csv(path):
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return math.nan


def mean_spread(xs):
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan, 0
    m = sum(xs) / len(xs)
    return m, (max(xs) - min(xs)) / 2 if len(xs) > 1 else math.nan, len(xs)


def fmt(m, s, n, digits=4):
    if n == 0 or math.isnan(m):
        return "—"
    if n == 1 or math.isnan(s):
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def pct(x):
    return "—" if math.isnan(x) else f"{100 * x:.2f}%"


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    d = sys.argv[1]
    runs = read_csv(os.path.join(d, "summary.csv"))
    roles = read_csv(os.path.join(d, "summary_roles.csv"))
    finished = [r for r in runs if r["status"] in ("done", "diverged")]
    missing = [r["name"] for r in runs if r["status"] not in ("done", "diverged")]
    seeds = sorted({r["train.seed"] for r in finished}, key=int)

    # bf16 of the same seed, for paired gaps.
    bf16 = {r["train.seed"]: r for r in finished if r["train.recipe"] == "bf16"}

    print(f"Finished runs: {len(finished)} of {len(runs)}; seeds with results: {', '.join(seeds) or 'none'}.\n")
    print("| recipe | seeds | final-window train loss | validation loss | val gap to bf16 (same seed) | diverged | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    gap_means, gap_counts = {}, {}
    for name, _ in PAPER:
        rs = [r for r in finished if r["train.recipe"] == name]
        tr = mean_spread([num(r.get("final_window_train_loss", r.get("final_train_loss"))) for r in rs])
        va = mean_spread([num(r["final_val_loss"]) for r in rs])
        gaps = mean_spread([num(r["final_val_loss"]) - num(bf16[r["train.seed"]]["final_val_loss"])
                            for r in rs if r["train.seed"] in bf16])
        tps = mean_spread([num(r["tokens_per_s"]) for r in rs])
        div = sum(1 for r in rs if r["status"] == "diverged" or r["diverged"] in ("1", "true"))
        gap_means[name], gap_counts[name] = gaps[0], gaps[2]
        print(f"| {name} | {len(rs)} | {fmt(*tr)} | {fmt(*va)} | {fmt(*gaps)} | {div} | "
              f"{'—' if tps[2] == 0 else f'{tps[0]:.0f}'} |")
    print("\n(mean ± half the range over seeds; one seed: the value.)\n")

    print("Ordering by the validation-loss gap to bf16 of the same seed (mean over the seeds a recipe has; "
          "lower is better), next to the paper's 8B order:\n")
    have = sorted([n for n, _ in PAPER if not math.isnan(gap_means.get(n, math.nan))], key=lambda n: gap_means[n])
    print("| rank | proxy (this study) | val gap | seeds | paper 8B | paper loss |")
    print("|---|---|---|---|---|---|")
    paper = [(n, v) for n, v in PAPER if v is not None]
    for i in range(max(len(have), len(paper))):
        a = f"{have[i]} | {gap_means[have[i]]:+.4f} | {gap_counts[have[i]]}" if i < len(have) else "— | — | —"
        b = f"{paper[i][0]} | {paper[i][1]:.4f}" if i < len(paper) else "— | —"
        print(f"| {i + 1} | {a} | {b} |")

    print("\nPer-role operand statistics, mean over the sampled steps and layers "
          "(first finished seed of each recipe):\n")
    print("| recipe | role | underflow | saturated | scale underflow | scale saturated | SQNR dB |")
    print("|---|---|---|---|---|---|---|")
    first_seed = {}
    for r in finished:
        first_seed.setdefault(r["train.recipe"], r["index"])
    for name, _ in PAPER:
        if name not in first_seed:
            continue
        for role in ROLES:
            row = [x for x in roles if x["index"] == first_seed[name] and x["kind"] == "operand" and x["role"] == role]
            if not row:
                continue
            x = row[0]
            print(f"| {name} | {role} | {pct(num(x['underflow_mean']))} | {pct(num(x['saturated_mean']))} | "
                  f"{pct(num(x['scale_underflow_mean']))} | {pct(num(x['scale_saturated_mean']))} | "
                  f"{num(x['sqnr_db_mean']):.2f} |")

    print("\nGEMM output against the unquantized GEMM of the same operands (mean over sampled steps and layers; "
          "the magnitude bias is not the gradient bias; gain - 1 is):\n")
    print("| recipe | GEMM | magnitude bias | relative error |")
    print("|---|---|---|---|")
    for name, _ in PAPER:
        if name not in first_seed:
            continue
        for g in ("fprop", "dgrad", "wgrad"):
            row = [x for x in roles if x["index"] == first_seed[name] and x["kind"] == "gemm" and x["role"] == g]
            if row:
                x = row[0]
                print(f"| {name} | {g} | {100 * num(x['magnitude_bias_mean']):+.3f}% | "
                      f"{100 * num(x['relative_error_mean']):.2f}% |")
    if missing:
        print("\nNot finished yet: " + ", ".join(missing) + ".")


if __name__ == "__main__":
    main()
