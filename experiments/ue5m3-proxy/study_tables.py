"""RESULTS.md's tables and plots, from the committed data/ of the UE5M3 proxy
study (study.py tables). Reads only data/<part>/*.csv; writes the tables into
RESULTS.md between its two table markers (or prints them when it has none)
and the plots beside it.

Statistics: every comparison is paired by seed (the seed fixes the initial
weights and the data order, so two recipes of one seed differ only by the
recipe). For n seeds the difference d_s = x_s(recipe) - x_s(other) has mean
d and sample standard deviation s; the 95% interval is d ± t(0.975, n-1)·s/√n
(Student t), and next to it the paired bootstrap interval (percentiles of
the mean over 20,000 resamplings of the seeds, fixed generator seed). An
ordering is "resolved" when the t interval excludes 0.
"""
import csv
import math
import random
from collections import defaultdict
from pathlib import Path

RECIPES = ["bf16", "te-nvfp4", "te-nvfp4-grouped", "nvfp4-no-rht-all", "nvfp4-no-rht-all-grouped", "ue5m3-b16",
           "ue5m3-b16-fp32gemm", "ue5m3-b32", "ue5m3-te-settings", "mxfp4"]
ROLES = ["fprop-x", "fprop-w", "dgrad-dy", "dgrad-w", "wgrad-dy", "wgrad-x"]
POLICIES = ["current", "replay:8", "calibrated:64", "checkpoint"]
# The paper's 8B training losses (Hu, Luschi, Balanca: Nemotron-H 8B, final
# training loss) and the proxy recipe that emulates each: the paper's NVFP4
# baselines ran on GB200 tensor cores, so their proxy is the grouped (native
# GEMM) variant.
PAPER = [("bf16", "bf16", 2.2651), ("ue5m3-te-settings", "ue5m3-te-settings", 2.2902),
         ("ue5m3-b16", "ue5m3-b16", 2.3090), ("ue5m3-b16-fp32gemm", "ue5m3-b16-fp32gemm", 2.3157),
         ("ue5m3-b32", "ue5m3-b32", 2.3241), ("te-nvfp4", "te-nvfp4-grouped", 2.3474),
         ("nvfp4-no-rht-all", "nvfp4-no-rht-all-grouped", 2.4420)]
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def read(path):
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def f(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def mean(v):
    return sum(v) / len(v) if v else float("nan")


def sd(v):
    if len(v) < 2:
        return float("nan")
    m = mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def paired(d):
    """(mean, t-interval half width, bootstrap (lo, hi), positives) of paired differences d."""
    n = len(d)
    if n == 0:
        return None
    m = mean(d)
    hw = T975.get(n - 1, 1.96) * sd(d) / math.sqrt(n) if n > 1 else float("nan")
    rng = random.Random(12345)
    boots = sorted(mean([d[rng.randrange(n)] for _ in range(n)]) for _ in range(20000))
    return m, hw, (boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]), sum(1 for x in d if x > 0)


def fmt_ci(p, scale=1.0, digits=4):
    if p is None:
        return "—"
    m, hw, (lo, hi), _ = p
    if math.isnan(hw):
        return f"{m * scale:+.{digits}f}"
    return f"{m * scale:+.{digits}f} ± {hw * scale:.{digits}f} [{lo * scale:+.{digits}f}, {hi * scale:+.{digits}f}]"


def resolved(p):
    return p is not None and not math.isnan(p[1]) and abs(p[0]) > p[1]


def tables(data, here, plots=True):
    out = []
    main = data / "main"
    runs = [r for r in read(main / "runs.csv")]
    by = {(r["recipe"], int(r["seed"])): r for r in runs}
    evals = defaultdict(dict)
    for e in read(main / "evals.csv"):
        evals[e["name"]][(e["recipe"], e["policy"])] = f(e["loss"])
    seeds = sorted({s for (_, s) in by})
    recipes = [r for r in RECIPES if any((r, s) in by for s in seeds)]

    def metric(recipe, seed, key):
        r = by.get((recipe, seed))
        if r is None:
            return None
        if key == "val_bf16":
            return evals[r["name"]].get(("bf16", "current"))
        if key.startswith("eval:"):
            return evals[r["name"]].get((recipe, key[5:]))
        return f(r[key])

    def diffs(recipe, other, key, okey=None):
        d = []
        for s in seeds:
            a, b = metric(recipe, s, key), metric(other, s, okey or key)
            if a is not None and b is not None and not math.isnan(a) and not math.isnan(b):
                d.append(a - b)
        return d

    done = len(runs)
    out.append(f"Runs in data/main: {done} of {len(RECIPES) * 5}; seeds with results: "
               f"{', '.join(str(s) for s in seeds)}.\n")

    # -- losses
    out.append("### Losses, and paired differences to bf16 and to ue5m3-b16\n")
    out.append("Final-window train loss: mean of the last 10% of the steps' losses (25 of 250). Validation NLL: "
               "the trainer's at the last step (the recipe's quantized forward with the training's tensor "
               "references) on the fixed held-out set of base.ini. Differences: mean ± 95% t half-width "
               "[paired bootstrap 95%], in nats/token; positive = worse than the other recipe.\n")
    out.append("| recipe | seeds | final-window train loss | validation NLL | Δ train vs bf16 | Δ val vs bf16 | "
               "Δ val vs ue5m3-b16 | non-finite | tokens/s |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for rc in recipes:
        tl = [metric(rc, s, "final_window_train_loss") for s in seeds if (rc, s) in by]
        vl = [metric(rc, s, "final_val_loss") for s in seeds if (rc, s) in by]
        tps = [f(by[(rc, s)]["tokens"]) / f(by[(rc, s)]["train_s"]) for s in seeds if (rc, s) in by]
        nf = sum(1 for s in seeds if (rc, s) in by and by[(rc, s)]["finite"] != "1")
        dt = paired(diffs(rc, "bf16", "final_window_train_loss")) if rc != "bf16" else None
        dv = paired(diffs(rc, "bf16", "final_val_loss")) if rc != "bf16" else None
        du = paired(diffs(rc, "ue5m3-b16", "final_val_loss")) if rc != "ue5m3-b16" else None
        out.append(f"| {rc} | {len(tl)} | {mean(tl):.4f} ± {sd(tl):.4f} | {mean(vl):.4f} ± {sd(vl):.4f} | "
                   f"{fmt_ci(dt)} | {fmt_ci(dv)} | {fmt_ci(du)} | {nf} | {mean(tps):.0f} |")
    out.append("\n(loss columns: mean ± sample standard deviation over seeds; tokens/s: one thread, two runs "
               "sharing the machine's two cores.)\n")

    # -- resolved orderings
    out.append("### Which orderings the data resolve (validation NLL, paired by seed)\n")
    res, unres = [], 0
    for i, a in enumerate(recipes):
        for b in recipes[i + 1:]:
            d = diffs(a, b, "final_val_loss")
            p = paired(d)
            if p is None:
                continue
            if resolved(p):
                lo, hi = (b, a) if p[0] > 0 else (a, b)
                same = p[3] if p[0] > 0 else sum(1 for x in d if x < 0)
                res.append(f"* {lo} < {hi}: Δ = {abs(p[0]):.4f} ± {p[1]:.4f} ({same} of {len(d)} seeds)")
            else:
                unres += 1
    out.append(f"{len(res)} of {len(res) + unres} pairs are resolved at 95%; the other {unres} are not:\n")
    out += res
    out.append("")

    # -- paper side by side
    out.append("### Side by side with the paper, on the same metric (training loss, gap to BF16)\n")
    out.append("| paper recipe | proxy recipe | paper 8B train loss | paper Δ to bf16 | proxy Δ final-window train "
               "loss to bf16 | paper rank | proxy rank |")
    out.append("|---|---|---|---|---|---|---|")
    prox = {}
    for _, pr, _ in PAPER:
        d = diffs(pr, "bf16", "final_window_train_loss") if pr != "bf16" else [0.0] * len(seeds)
        prox[pr] = paired(d) if d else None
    prank = {pr: k + 1 for k, (_, pr, _) in enumerate(sorted(PAPER, key=lambda x: x[2]))}
    have = [pr for _, pr, _ in PAPER if prox[pr] is not None]
    xrank = {pr: k + 1 for k, pr in enumerate(sorted(have, key=lambda x: prox[x][0]))}
    for paper_name, pr, loss in PAPER:
        out.append(f"| {paper_name} | {pr} | {loss:.4f} | {loss - PAPER[0][2]:+.4f} | "
                   f"{fmt_ci(prox[pr]) if pr != 'bf16' else '0'} | {prank[pr]} | {xrank.get(pr, '—')} |")
    out.append("")

    # -- quantized inference
    out.append("### Quantized-inference validation NLL (exmy eval, the same held-out set)\n")
    out.append("Each run evaluated with its own recipe's forward under every policy (docs/eval.md), and with no "
               "linear quantized (bf16). Cells: mean over seeds of the difference to the bf16 run of the same "
               "seed (nats/token).\n")
    out.append("| recipe | trainer's (training references) | " + " | ".join(POLICIES) +
               " | bf16 (unquantized) | checkpoint − current |")
    out.append("|---|---|" + "---|" * len(POLICIES) + "---|---|")
    for rc in recipes:
        if rc == "bf16":
            continue
        cells = [fmt_ci(paired(diffs(rc, "bf16", "final_val_loss")))]
        for pol in POLICIES:
            p = paired(diffs(rc, "bf16", "eval:" + pol, "final_val_loss"))
            cells.append(f"{p[0]:+.4f}" if p else "—")
        p = paired(diffs(rc, "bf16", "val_bf16", "final_val_loss"))
        cells.append(f"{p[0]:+.4f}" if p else "—")
        cells.append(fmt_ci(paired(diffs(rc, rc, "eval:checkpoint", "eval:current"))))
        out.append(f"| {rc} | " + " | ".join(cells) + " |")
    out.append("")

    # -- per-role statistics
    stats = defaultdict(lambda: defaultdict(list))
    name_recipe = {r["name"]: r["recipe"] for r in runs}
    for s in read(main / "stats.csv"):
        rc = name_recipe.get(s["name"])
        if rc is None or int(s["step"]) == 1:
            continue
        stats[(rc, s["operand"])]["u"].append(f(s["underflow"]))
        stats[(rc, s["operand"])]["s"].append(f(s["saturated"]))
        stats[(rc, s["operand"])]["su"].append(f(s["scale_underflow"]))
        stats[(rc, s["operand"])]["ss"].append(f(s["scale_saturated"]))
        stats[(rc, s["operand"])]["q"].append(f(s["sqnr_db"]))
        stats[(rc, s["operand"])]["r"].append(f(s["stale_ratio_max"]))
    out.append("### Per-role operand statistics\n")
    out.append("Per statistics step (every 25 steps, step 1 left out) the counts of all layers of a role are "
               "summed; the table is the mean over those steps and the seeds. Stale ratio: the largest ρ = "
               "amax / held reference of any layer, mean over steps (1 for current scaling).\n")
    out.append("| recipe | role | underflow | saturated | scale underflow | scale saturated | SQNR dB | stale ρ max |")
    out.append("|---|---|---|---|---|---|---|---|")
    for rc in recipes:
        for role in ROLES:
            v = stats.get((rc, role))
            if not v:
                continue
            r = [x for x in v["r"] if not math.isnan(x)]
            out.append(f"| {rc} | {role} | {100 * mean(v['u']):.2f}% | {100 * mean(v['s']):.2f}% | "
                       f"{100 * mean(v['su']):.3f}% | {100 * mean(v['ss']):.3f}% | {mean(v['q']):.2f} | "
                       f"{mean(r):.3f} |" if r else
                       f"| {rc} | {role} | {100 * mean(v['u']):.2f}% | {100 * mean(v['s']):.2f}% | "
                       f"{100 * mean(v['su']):.3f}% | {100 * mean(v['ss']):.3f}% | {mean(v['q']):.2f} | — |")
    out.append("")

    # -- GEMM bias
    gm = defaultdict(lambda: defaultdict(list))
    for g in read(main / "gemm.csv"):
        rc = name_recipe.get(g["name"])
        if rc is None or int(g["step"]) == 1:
            continue
        seed = int(by_name(runs, g["name"])["seed"])
        gm[(rc, g["gemm"])][seed].append((f(g["gain_minus_1"]), f(g["relative_error"])))
    out.append("### GEMM output against the unquantized GEMM of the same operands\n")
    out.append("gain − 1 (gain = Σŷy/Σy², docs/recipes.md §7: the multiplicative bias), mean over layers and "
               "statistics steps per seed, then mean ± 95% t half-width over seeds; relative error "
               "‖ŷ − y‖/‖y‖ likewise (mean).\n")
    out.append("| recipe | fprop gain − 1 | dgrad gain − 1 | wgrad gain − 1 | wgrad relative error |")
    out.append("|---|---|---|---|---|")
    for rc in recipes:
        cells = []
        for gemm in ("fprop", "dgrad", "wgrad"):
            per_seed = [mean([x[0] for x in v]) for v in gm[(rc, gemm)].values()]
            cells.append(fmt_ci(paired(per_seed), 100, 3) + "%" if per_seed else "—")
        rel = [mean([x[1] for x in v]) for v in gm[(rc, "wgrad")].values()]
        cells.append(f"{100 * mean(rel):.2f}%" if rel else "—")
        if any(c != "—" for c in cells):
            out.append(f"| {rc} | " + " | ".join(cells) + " |")
    out.append("")

    # -- long horizon
    long_runs = read(data / "long" / "runs.csv")
    if long_runs:
        out.append("### Long horizon (3000 steps of 8 x 128 tokens, seed 1)\n")
        out.append("A spike: a step whose loss exceeds the mean of the 50 steps before it by more than 5 of their "
                   "standard deviations. Largest rise: the largest such excess, in nats.\n")
        out.append("| recipe | final-window train loss | Δ to bf16 | validation NLL | spikes | largest rise | "
                   "non-finite |")
        out.append("|---|---|---|---|---|---|---|")
        lc = defaultdict(dict)
        for c in read(data / "long" / "curves.csv"):
            if c["kind"] == "train":
                lc[c["name"]][int(c["step"])] = f(c["loss"])
        ref = next((f(r["final_window_train_loss"]) for r in long_runs if r["recipe"] == "bf16"), float("nan"))
        for r in sorted(long_runs, key=lambda r: RECIPES.index(r["recipe"])):
            ys = [lc[r["name"]][k] for k in sorted(lc[r["name"]])]
            spikes, rise = spikes_of(ys)
            out.append(f"| {r['recipe']} | {f(r['final_window_train_loss']):.4f} | "
                       f"{f(r['final_window_train_loss']) - ref:+.4f} | {f(r['final_val_loss']):.4f} | {len(spikes)}"
                       f"{' (steps ' + ', '.join(str(k + 1) for k in spikes[:8]) + ')' if spikes else ''} | "
                       f"{rise:.3f} | {'no' if r['finite'] == '1' else 'yes'} |")
        out.append("")
        out += gap_windows_table(long_runs, lc)
        out += precursor_table(data, long_runs, lc)
        if plots:
            long_plots(data, here, long_runs, lc)

    # -- timing
    out.append("### Machine time\n")
    out.append("| part | runs | training wall time (sum) | CPUs |")
    out.append("|---|---|---|---|")
    for part in ("main", "long"):
        rr = read(data / part / "runs.csv")
        if rr:
            tot = sum(f(r["wall_s"]) for r in rr)
            cpus = sorted({r["cpu"] for r in rr})
            out.append(f"| {part} | {len(rr)} | {tot / 3600:.2f} h (two at a time: {tot / 7200:.2f} h of the "
                       f"machine) | {'; '.join(cpus)} |")
    out.append("")
    text = "\n".join(out) + "\n"
    results = here / "RESULTS.md"
    begin, end = "<!-- tables: made by study.py tables from data/ -->", "<!-- end of tables -->"
    doc = results.read_text() if results.exists() else ""
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        results.write_text(head + begin + "\n\n" + text + "\n" + end + rest.split(end, 1)[1])
    else:
        print("\n".join(out))
    if plots:
        make_plots(data, here, runs, recipes, seeds, diffs, paired, stats)


def by_name(runs, name):
    for r in runs:
        if r["name"] == name:
            return r
    return {}


def make_plots(data, here, runs, recipes, seeds, diffs, paired_fn, stats):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # 1. paired gaps to bf16 with intervals
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    rs = [r for r in recipes if r != "bf16"]
    for ax, key, title in ((axes[0], "final_window_train_loss", "final-window train loss"),
                           (axes[1], "final_val_loss", "validation NLL")):
        for k, rc in enumerate(rs):
            d = diffs(rc, "bf16", key)
            p = paired_fn(d)
            if p is None:
                continue
            ax.errorbar([p[0]], [k], xerr=[[p[1] if not math.isnan(p[1]) else 0]], fmt="o", color="C0", capsize=3)
            ax.scatter(d, [k] * len(d), s=10, color="C1", alpha=0.6, zorder=3)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(f"{title}: recipe − bf16, same seed")
        ax.set_xlabel("nats/token (dot: mean, bar: 95% t; small: seeds)")
        ax.set_yticks(range(len(rs)))
        ax.set_yticklabels(rs)
    fig.tight_layout()
    fig.savefig(here / "gaps_to_bf16.png", dpi=110)
    plt.close(fig)

    # 2. per-role statistics
    metrics = [("u", "element underflow %", 100), ("s", "element saturation %", 100),
               ("su", "scale underflow %", 100), ("q", "SQNR dB", 1)]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.8), sharey=True)
    qr = [r for r in recipes if r != "bf16"]
    for ax, (m, title, sc) in zip(axes, metrics):
        for j, role in enumerate(ROLES):
            vals = [sc * mean(stats[(rc, role)][m]) if stats.get((rc, role)) else float("nan") for rc in qr]
            ax.barh([k + (j - 2.5) * 0.13 for k in range(len(qr))], vals, height=0.13, label=role)
        ax.set_title(title)
        ax.set_yticks(range(len(qr)))
        ax.set_yticklabels(qr)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(here / "role_statistics.png", dpi=110)
    plt.close(fig)

    # 3. loss difference curves, mean over seeds, against bf16 of the same seed
    curves = defaultdict(dict)
    for c in read(data / "main" / "curves.csv"):
        if c["kind"] == "train":
            curves[c["name"]][int(c["step"])] = f(c["loss"])
    names = {(r["recipe"], int(r["seed"])): r["name"] for r in runs}
    fig, ax = plt.subplots(figsize=(9, 5))
    for rc in rs:
        acc = defaultdict(list)
        for s in seeds:
            a, b = names.get((rc, s)), names.get(("bf16", s))
            if not a or not b:
                continue
            for st, v in curves[a].items():
                if st in curves[b]:
                    acc[st].append(v - curves[b][st])
        steps = sorted(acc)
        if not steps:
            continue
        y = [mean(acc[s]) for s in steps]
        w = 25
        ys = [mean(y[max(0, i - w + 1):i + 1]) for i in range(len(y))]
        ax.plot(steps, ys, label=rc, lw=1.2)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss − bf16, nats/token")
    ax.set_title("training loss minus bf16 of the same seed (mean over seeds, 25-step running mean)")
    ax.set_ylim(-0.02, 0.06)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(here / "loss_gap_curves.png", dpi=110)
    plt.close(fig)


def spikes_of(ys, window=50, k=5.0):
    """Indices of steps whose loss exceeds the mean of the previous `window` by k of their standard deviations,
    and the largest excess over that mean."""
    spikes, rise = [], 0.0
    for i in range(window, len(ys)):
        prev = ys[i - window:i]
        m, s = mean(prev), sd(prev)
        if ys[i] - m > k * s:
            spikes.append(i)
        rise = max(rise, ys[i] - m)
    return spikes, rise


def gap_windows_table(long_runs, lc, width=500):
    """The mean per-step training-loss gap to the bf16 run (same seed, same batches) over windows of `width`
    steps: does the gap grow with the horizon?"""
    ref = next((r["name"] for r in long_runs if r["recipe"] == "bf16"), None)
    if ref is None:
        return []
    last = max(lc[ref])
    wins = [(lo, min(lo + width - 1, last)) for lo in range(1, last + 1, width)]
    out = [f"Training-loss gap to bf16, the mean of the per-step differences over windows of {width} steps:\n",
           "| recipe | " + " | ".join(f"{lo}–{hi}" for lo, hi in wins) + " |",
           "|---|" + "---|" * len(wins)]
    for r in sorted(long_runs, key=lambda r: RECIPES.index(r["recipe"])):
        if r["name"] == ref:
            continue
        c = lc[r["name"]]
        cells = []
        for lo, hi in wins:
            d = [c[k] - lc[ref][k] for k in range(lo, hi + 1) if k in c and k in lc[ref]]
            cells.append(f"{mean(d):+.4f}" if d else "—")
        out.append(f"| {r['recipe']} | " + " | ".join(cells) + " |")
    return out + [""]


def departure(series, step, window=10):
    """The last value of a statistic logged before `step`, as standard deviations (z) away from the mean of the
    `window` values logged before it: (logged step, z), or None with fewer values. Equal to a constant window:
    z = 0; different from one: z = inf."""
    before = sorted(k for k in series if k < step)
    if len(before) < window + 1:
        return None
    k = before[-1]
    prev = [series[j] for j in before[-1 - window:-1]]
    m, s = mean(prev), sd(prev)
    if s == 0:
        return k, 0.0 if series[k] == m else math.inf
    return k, (series[k] - m) / s


STAT_KEYS = {"underflow": "underflow", "saturated": "saturation", "scale_underflow": "scale underflow",
             "scale_saturated": "scale saturation", "sqnr_db": "SQNR", "stale_ratio_max": "ρ max"}


def long_series(data):
    """Every logged statistic of the long runs: {name: {label: {step: value}}}, per role and per GEMM; series
    constant over the whole run (nothing to depart from, e.g. ρ under current scaling) left out."""
    out = defaultdict(lambda: defaultdict(dict))
    for s in read(data / "long" / "stats.csv"):
        for k, label in STAT_KEYS.items():
            out[s["name"]][f"{s['operand']} {label}"][int(s["step"])] = f(s[k])
    for g in read(data / "long" / "gemm.csv"):
        out[g["name"]][f"{g['gemm']} gain − 1"][int(g["step"])] = f(g["gain_minus_1"])
    return {n: {lb: v for lb, v in ser.items() if len(set(v.values())) > 1} for n, ser in out.items()}


def precursors(series, spike_steps, z=3.0):
    """For one run: ([(label, logged step, spike step, z)] of statistics whose last value before a spike departs
    by more than z, pairs checked), and the same count over every logged step (the base rate)."""
    hits, pairs = [], 0
    for label, v in series.items():
        for sp in spike_steps:
            d = departure(v, sp)
            if d is not None:
                pairs += 1
                if abs(d[1]) > z:
                    hits.append((label, d[0], sp, d[1]))
    base_hits = base_pairs = 0
    for v in series.values():
        for k in sorted(v):
            d = departure(v, k + 1)
            if d is not None and d[0] == k:
                base_pairs += 1
                base_hits += abs(d[1]) > z
    return hits, pairs, base_hits, base_pairs


def precursor_table(data, long_runs, lc):
    series = long_series(data)
    rows = []
    for r in sorted(long_runs, key=lambda r: RECIPES.index(r["recipe"])):
        if r["name"] not in series:
            continue
        st = sorted(lc[r["name"]])
        spike_steps = [st[i] for i in spikes_of([lc[r["name"]][k] for k in st])[0]]
        hits, pairs, bh, bp = precursors(series[r["name"]], spike_steps)
        hits.sort(key=lambda h: -abs(h[3]))
        listed = "; ".join(f"{lb} {zz:+.1f} (step {k}, spike {sp})" for lb, k, sp, zz in hits[:6])
        rows.append(f"| {r['recipe']} | {len(series[r['name']])} | {len(spike_steps)} | {len(hits)} of {pairs} "
                    f"({100 * len(hits) / max(pairs, 1):.1f}%) | {bh} of {bp} ({100 * bh / max(bp, 1):.1f}%) | "
                    f"{listed or '—'}{' ...' if len(hits) > 6 else ''} |")
    if not rows:
        return []
    return ["Statistics before the spikes: each statistic's last value logged before a spike (every 50 steps, so "
            "3 to 49 steps before it) as standard deviations z from the mean of its 10 values logged before "
            "that, against the same measure at every logged step (the base rate). Statistics: per role "
            "underflow, saturation, scale underflow, scale saturation, SQNR and ρ max, per GEMM gain − 1 "
            "(aggregated over the quantized layers), those constant over the run left out.\n",
            "| recipe | statistics | spikes | beyond 3 sd before a spike | beyond 3 sd at any logged step | "
            "largest departures before a spike |",
            "|---|---|---|---|---|---|", *rows, ""]


def long_plots(data, here, long_runs, lc):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {r["name"]: r["recipe"] for r in sorted(long_runs, key=lambda r: RECIPES.index(r["recipe"]))}
    color = {rc: f"C{i}" for i, rc in enumerate(RECIPES)}  # one colour per recipe in every panel
    stats = defaultdict(lambda: defaultdict(list))
    for s in read(data / "long" / "stats.csv"):
        stats[(s["name"], s["operand"])]["step"].append(int(s["step"]))
        for k in ("underflow", "saturated", "scale_underflow", "scale_saturated", "sqnr_db", "stale_ratio_max"):
            stats[(s["name"], s["operand"])][k].append(f(s[k]))
    gm = defaultdict(lambda: defaultdict(list))
    for g in read(data / "long" / "gemm.csv"):
        gm[(g["name"], g["gemm"])]["step"].append(int(g["step"]))
        gm[(g["name"], g["gemm"])]["bias"].append(f(g["gain_minus_1"]))
    fig, axes = plt.subplots(3, 2, figsize=(13, 11))
    ax = axes[0][0]
    for n, rc in names.items():
        st = sorted(lc[n])
        y = [lc[n][k] for k in st]
        w = 25
        ys = [mean(y[max(0, i - w + 1):i + 1]) for i in range(len(y))]
        ax.plot(st, ys, label=rc, lw=1, color=color[rc])
    ax.set_title("train loss (25-step running mean)")
    ax.set_ylim(1.2, 2.2)
    ax.legend(fontsize=8)
    panels = [(axes[0][1], "scale_underflow", "wgrad-x", "scale underflow, wgrad-x (fraction of blocks)"),
              (axes[1][0], "scale_saturated", "fprop-x", "scale saturation, fprop-x (fraction of blocks)"),
              (axes[1][1], "stale_ratio_max", "fprop-x", "stale ratio ρ max, fprop-x"),
              (axes[2][0], "sqnr_db", "wgrad-dy", "SQNR wgrad-dy (dB)")]
    for ax, key, role, title in panels:
        for n, rc in names.items():
            v = stats.get((n, role))
            if v:
                ax.plot(v["step"], v[key], label=rc, lw=1, color=color[rc])
        ax.set_title(title)
    ax = axes[2][1]
    for n, rc in names.items():
        v = gm.get((n, "wgrad"))
        if v:
            ax.plot(v["step"], [100 * b for b in v["bias"]], label=rc, lw=1, color=color[rc])
    ax.axhline(0, color="k", lw=0.6)
    ax.set_title("wgrad gain − 1 (%), mean over layers")
    for a in axes.flat:
        a.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(here / "long_horizon.png", dpi=110)
    plt.close(fig)


def selftest():
    """The statistics above against hand computations (ctest study_tables.selftest)."""
    p = paired([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, s = sqrt(2.5), half width t(0.975, 4) s / sqrt(5) = 2.776 * 0.70711
    assert abs(p[0] - 3.0) < 1e-12 and abs(p[1] - 2.776 * math.sqrt(0.5)) < 1e-9, p
    assert 1.0 <= p[2][0] < 3.0 < p[2][1] <= 5.0 and p[3] == 5, p
    assert resolved(p)
    q = paired([-1.0, 1.0, -1.0, 1.0, 0.0])
    assert q[0] == 0.0 and not resolved(q) and q[3] == 2, q
    assert paired([]) is None and math.isnan(paired([0.5])[1])
    ys = [1.0 + 0.01 * ((k * 7919) % 13 - 6) for k in range(120)]
    ys[90] += 0.5
    sp, rise = spikes_of(ys)
    assert sp == [90] and abs(rise - (ys[90] - mean(ys[40:90]))) < 1e-12, (sp, rise)
    # a departure: the last value before the step against the 10 before it
    v = {50 * j: 1.0 + 0.1 * (j % 2) for j in range(12)}
    v[550] = 2.0
    k, zz = departure(v, 560)
    assert k == 550 and abs(zz - (2.0 - 1.05) / sd([1.0 + 0.1 * (j % 2) for j in range(1, 11)])) < 1e-12, zz
    assert departure(v, 500) is None and departure({j: 1.0 for j in range(12)}, 20) == (11, 0.0)
    hits, pairs, bh, bp = precursors({"s": v}, [560])
    assert [h[:3] for h in hits] == [("s", 550, 560)] and pairs == 1 and (bh, bp) == (1, 2), (hits, bh, bp)
    print("study_tables: selftest passed")
