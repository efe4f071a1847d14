#!/usr/bin/env python3
"""The UE5M3 proxy study, second edition: train, evaluate, extract, tabulate.

Run with Debian's /usr/bin/python3 (python3-h5py, python3-numpy,
python3-matplotlib) from the repository root:

    study.py build                 # the study's portable build (build-study/exmy)
    study.py run --part main       # train + evaluate + extract what data/ lacks
    study.py run --part long       # the long-horizon subset
    study.py extract --part main   # (re)extract the finished runs of runs/
    study.py tables                # RESULTS.md's tables and plots from data/
    study.py selftest              # the tables' statistics against hand computations

The runs live in runs/ue5m3-proxy-2/<part>/ (not committed); what the
results are made from is committed under experiments/ue5m3-proxy/data/:
one summary row, the evaluations, the loss curve, per-step statistics and a
digest per run. A run whose digest is in data/ is done: `run` skips it, so
the study can be carried on over several machines and sessions (the build
is portable, x86-64-v3 without -march=native, so every machine computes the
same bits; each run records the CPU it ran on). `run` trains two runs at a
time, one thread each (--jobs), and can be stopped at any point: a run cut
short resumes from its last checkpoint when its directory is still there.
"""
import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
EXMY = ROOT / "build-study" / "exmy"
RUNS = ROOT / "runs" / "ue5m3-proxy-2"
PARTS = {"main": HERE / "sweep.ini", "long": HERE / "long.ini"}

# exmy eval: the quantized-inference policies every quantized run is evaluated
# under, on the study's fixed validation set (base.ini: 24 batches of 16).
POLICIES = ["current", "replay:8", "calibrated:64", "checkpoint"]
EVAL_BATCHES = 24


def sh(cmd, log=None):
    with open(log, "a") if log else open(os.devnull, "w") as out:
        out.write("$ " + " ".join(str(c) for c in cmd) + "\n")
        out.flush()
        return subprocess.run([str(c) for c in cmd], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode


def cpu_name():
    """The CPU as /proc/cpuinfo names it, with its family/model and widest vector unit."""
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    except OSError:
        return "unknown"
    flags = info.get("flags", "").split()
    width = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model {info.get('model', '?')}, {width})"


def group_digests(lines):
    """One line per file and top-level group: the SHA-256 of its dataset digests (run_digest.py lines)."""
    groups, order, fname = {}, [], "?"
    for line in lines:
        if line.startswith("# "):
            fname = line[2:].split(":", 1)[0]
            continue
        top = line.split("/", 2)[1].split(" ", 1)[0]
        key = f"{fname}:/{top}"
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(line)
    return [f"{k} {len(groups[k])} {hashlib.sha256(chr(10).join(groups[k]).encode()).hexdigest()}" for k in order]


def sweep_runs(part):
    """(index, name, recipe, seed) of every run of the part's sweep file."""
    out = subprocess.run([str(EXMY), "sweep", str(PARTS[part]), "--list"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    runs = []
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) >= 2 and f[0].isdigit():
            name = f[1]
            kv = dict(p.split("=", 1) for p in name.split("_")[1:] if "=" in p)
            runs.append((int(f[0]), name, kv.get("recipe", ""), int(kv.get("seed", "0"))))
    return runs


def part_dir(part):
    return DATA / part


def digest_path(part, name):
    return part_dir(part) / "digests" / f"{name}.txt"


# ---------------------------------------------------------------------------
# Extraction: what a finished run contributes to data/
# ---------------------------------------------------------------------------


def newest_checkpoint(run_dir):
    cks = sorted((run_dir / "checkpoints").glob("step_*.h5"))
    return cks[-1] if cks else None


def quant_roles(f):
    """{(layer, gemm, operand): group} of the run file's /quant."""
    out = {}
    if "quant" not in f:
        return out
    for layer, lg in f["quant"].items():
        for gemm, gg in lg.items():
            for op, og in gg.items():
                out[(layer, gemm, op)] = og
    return out


def extract_run(part, index, name, recipe, seed, elapsed_wall):
    import h5py
    import numpy as np

    run_dir = RUNS / part / name
    d = part_dir(part)
    (d / "digests").mkdir(parents=True, exist_ok=True)
    rows = {}
    with h5py.File(run_dir / "run.h5", "r") as f:
        cfg = f.attrs.get("git_commit", b"")
        commit = cfg.decode() if isinstance(cfg, bytes) else str(cfg)
        steps = f["/step_loss/step"][()]
        losses = f["/step_loss/loss"][()]
        ev_step = f["/eval/step"][()] if "/eval/step" in f else np.array([])
        ev_loss = f["/eval/loss"][()] if "/eval/loss" in f else np.array([])
        n = len(losses)
        window = max(1, int(round(n / 10)))
        tr = f["/train"]
        tokens = int(tr["tokens"][-1]) if "tokens" in tr else 0
        elapsed = float(tr["elapsed_s"][-1]) if "elapsed_s" in tr else float("nan")
        finite = bool(np.all(np.isfinite(losses)))
        rows["run"] = {
            "part": part, "index": index, "name": name, "recipe": recipe, "seed": seed, "steps": n,
            "final_window_steps": window, "final_window_train_loss": repr(float(np.mean(losses[-window:]))),
            "final_val_loss": repr(float(ev_loss[-1])) if len(ev_loss) else "", "finite": int(finite),
            "tokens": tokens, "train_s": repr(elapsed), "wall_s": repr(elapsed_wall), "commit": commit,
            "cpu": cpu_name(),
        }
        rows["curve"] = [(name, int(s), "train", repr(float(l))) for s, l in zip(steps, losses)]
        rows["curve"] += [(name, int(s), "val", repr(float(l))) for s, l in zip(ev_step, ev_loss)]
        evals = []
        if "eval" in f:
            for rname, rg in f["eval"].items():
                if not isinstance(rg, h5py.Group):
                    continue
                for pol, pg in rg.items():
                    for k in range(len(pg["loss"])):
                        evals.append((name, rname, pol, int(pg["step"][k]), int(pg["batches"][k]),
                                      repr(float(pg["loss"][k]))))
        rows["evals"] = evals
        # per statistics step and role: the operand statistics summed over the layers
        stats = {}
        for (layer, gemm, op), g in quant_roles(f).items():
            st = g["step"][()]
            mb = g["micro_batch"][()]
            cols = {k: g[k][()] for k in ("nonzero", "underflow", "saturated", "elements", "blocks", "scale_underflow",
                                          "scale_saturated", "sum_sq", "sum_sq_err")}
            stale = g["stale_ratio"][()] if "stale_ratio" in g else None
            for i in range(len(st)):
                if mb[i] != 0:
                    continue
                key = (int(st[i]), op)
                a = stats.setdefault(key, dict(nonzero=0, underflow=0, saturated=0, elements=0, blocks=0,
                                               scale_underflow=0, scale_saturated=0, sum_sq=0.0, sum_sq_err=0.0,
                                               stale_max=float("nan")))
                for k, v in cols.items():
                    a[k] += v[i]
                if stale is not None and np.isfinite(stale[i]):
                    a["stale_max"] = float(stale[i]) if not np.isfinite(a["stale_max"]) else max(a["stale_max"],
                                                                                                  float(stale[i]))
        srows = []
        for (st, op), a in sorted(stats.items()):
            sq = a["sum_sq"] / a["sum_sq_err"] if a["sum_sq_err"] > 0 else float("inf")
            srows.append((name, st, op, a["underflow"] / max(1, a["nonzero"]), a["saturated"] / max(1, a["elements"]),
                          a["scale_underflow"] / max(1, a["blocks"]), a["scale_saturated"] / max(1, a["blocks"]),
                          10 * np.log10(sq) if np.isfinite(sq) else float("inf"), a["stale_max"]))
        rows["stats"] = srows
        # per statistics step and GEMM: the recipe's multiplicative bias (gain - 1), mean over layers
        gemms = {}
        if "gemm" in f:
            for layer, lg in f["gemm"].items():
                for gemm, gg in lg.items():
                    if "gain" not in gg:
                        continue
                    st, mb, gain = gg["step"][()], gg["micro_batch"][()], gg["gain"][()]
                    rel = gg["relative_error"][()] if "relative_error" in gg else None
                    for i in range(len(st)):
                        if mb[i] != 0:
                            continue
                        a = gemms.setdefault((int(st[i]), gemm), [0.0, 0, 0.0])
                        a[0] += float(gain[i]) - 1.0
                        a[1] += 1
                        a[2] += float(rel[i]) if rel is not None else float("nan")
        rows["gemm"] = [(name, st, g, a[0] / a[1], a[2] / a[1]) for (st, g), a in sorted(gemms.items())]
    files = [run_dir / "run.h5"]
    ck = newest_checkpoint(run_dir)
    if ck:
        files.append(ck)
    dg = subprocess.run([sys.executable, str(ROOT / "analysis" / "run_digest.py"), "--skip-timing"] +
                        [str(p) for p in files], capture_output=True, text=True, check=True).stdout
    # the digest names files by their basename; exmy eval's rows are left out
    # (they are in evals.csv and are not the training's bits). What is kept is
    # one line per file and group (the group's datasets' digests hashed):
    # `analysis/run_digest.py --skip-timing` of a rerun's files, put through
    # group_digests(), must give the same lines.
    lines = [l for l in dg.splitlines() if not l.startswith("/eval/") or l.startswith("/eval/loss ")
             or l.startswith("/eval/step ")]
    whole = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    rows["run"]["digest"] = whole
    return rows, group_digests(lines)


CSV_COLS = {
    "runs.csv": ["part", "index", "name", "recipe", "seed", "steps", "final_window_steps", "final_window_train_loss",
                 "final_val_loss", "finite", "tokens", "train_s", "wall_s", "digest", "commit", "cpu"],
    "curves.csv": ["name", "step", "kind", "loss"],
    "evals.csv": ["name", "recipe", "policy", "step", "batches", "loss"],
    "stats.csv": ["name", "step", "operand", "underflow", "saturated", "scale_underflow", "scale_saturated", "sqnr_db",
                  "stale_ratio_max"],
    "gemm.csv": ["name", "step", "gemm", "gain_minus_1", "relative_error"],
}


def read_csv(path):
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def store(part, name, rows, lines):
    """Replaces every row of run NAME in data/<part>/*.csv; writes its digest last."""
    d = part_dir(part)
    d.mkdir(parents=True, exist_ok=True)
    new = {"runs.csv": [rows["run"]], "curves.csv": rows["curve"], "evals.csv": rows["evals"],
           "stats.csv": rows["stats"], "gemm.csv": rows["gemm"]}
    for fn, cols in CSV_COLS.items():
        old = [r for r in read_csv(d / fn) if r["name"] != name]
        add = [r if isinstance(r, dict) else dict(zip(cols, r)) for r in new[fn]]
        tmp = d / (fn + ".tmp")
        with open(tmp, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, lineterminator="\n")
            w.writeheader()
            for r in old + add:
                w.writerow({k: r.get(k, "") for k in cols})
        os.replace(tmp, d / fn)
    dp = digest_path(part, name)
    dp.parent.mkdir(parents=True, exist_ok=True)
    dp.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------


STOP = []  # set on an interrupted run: the workers take no new runs


def run_one(part, index, name, recipe, seed, lock):
    if STOP:
        return f"{name}: not started (stopping)"
    log = RUNS / part / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rc = sh([EXMY, "sweep", PARTS[part], "--out", RUNS / part, "--run", index, "--threads", 1, "--no-summary"], log)
    if rc != 0:
        if rc in (130, 143, -2, -15):
            STOP.append(name)
        return f"{name}: training failed (rc {rc}, {log})"
    t1 = time.time()
    run_dir = RUNS / part / name
    rc = 0
    if recipe != "bf16":
        cmd = [EXMY, "eval", run_dir, "--recipe", recipe, "--batches", EVAL_BATCHES, "--set", "train.threads=1"]
        for p in POLICIES:
            cmd += ["--policy", p]
        rc = sh(cmd, log)
    if rc == 0:
        # the same weights with no linear quantized (BF16, the bf16 runs'
        # own evaluation): what the recipe did to the weights alone
        rc = sh([EXMY, "eval", run_dir, "--recipe", "bf16", "--name", "bf16", "--policy", "current", "--batches",
                 EVAL_BATCHES, "--set", "train.threads=1"], log)
    if rc != 0:
        return f"{name}: evaluation failed (rc {rc}, {log})"
    t2 = time.time()
    rows, lines = extract_run(part, index, name, recipe, seed, t1 - t0)
    with lock:
        store(part, name, rows, lines)
    return f"{name}: done (train {t1 - t0:.0f}s, eval {t2 - t1:.0f}s, val {rows['run']['final_val_loss'][:7]})"


def cmd_run(a):
    import threading

    if not EXMY.exists():
        sys.exit("study: build-study/exmy is missing: run `study.py build` first")
    runs = sweep_runs(a.part)
    todo = [r for r in runs if not digest_path(a.part, r[1]).exists()]
    done = len(runs) - len(todo)
    if a.only:
        todo = [r for r in todo if r[0] in set(int(x) for x in a.only.split(","))]
    if a.limit:
        todo = todo[:a.limit]
    print(f"study: {a.part}: {done} of {len(runs)} runs in data/, {len(todo)} to run now", flush=True)
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=a.jobs) as ex:
        for msg in ex.map(lambda r: run_one(a.part, *r, lock), todo):
            print(time.strftime("%H:%M:%S"), msg, flush=True)


def cmd_extract(a):
    runs = sweep_runs(a.part)
    old = {r["name"]: r for r in read_csv(part_dir(a.part) / "runs.csv")}
    for index, name, recipe, seed in runs:
        run_dir = RUNS / a.part / name
        if not (run_dir / "run.h5").exists():
            continue
        rows, lines = extract_run(a.part, index, name, recipe, seed, float(old.get(name, {}).get("wall_s", "nan")))
        store(a.part, name, rows, lines)
        print(f"study: extracted {name}")


def cmd_build(_a):
    b = ROOT / "build-study"
    rc = sh(["cmake", "-S", ROOT, "-B", b, "-DCMAKE_BUILD_TYPE=Release", "-DEXMY_NATIVE=OFF",
             "-DCMAKE_CXX_FLAGS=-march=x86-64-v3", "-DEXMY_CUDA=OFF", "-DEXMY_BUILD_TESTS=OFF",
             "-DEXMY_BUILD_BENCH=OFF"])
    if rc == 0:
        rc = sh(["cmake", "--build", b, "-j", str(os.cpu_count() or 2), "--target", "exmy"])
    sys.exit(rc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--part", choices=PARTS, default="main")
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--limit", type=int, default=0, help="at most this many runs")
    r.add_argument("--only", default="", help="comma-separated run indices")
    e = sub.add_parser("extract")
    e.add_argument("--part", choices=PARTS, default="main")
    sub.add_parser("build")
    sub.add_parser("selftest", help="check the statistics of study_tables.py")
    t = sub.add_parser("tables")
    t.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    if a.cmd == "selftest":
        from study_tables import selftest
        selftest()
        return
    if a.cmd == "tables":
        from study_tables import tables
        tables(DATA, HERE, plots=not a.no_plots)
        return
    {"run": cmd_run, "extract": cmd_extract, "build": cmd_build}[a.cmd](a)


if __name__ == "__main__":
    main()
