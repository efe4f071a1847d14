#!/usr/bin/env python3
"""SHA-256 of every dataset in HDF5 files exmy wrote (run files, checkpoints).

Two runs of the same configuration and seed must agree bit for bit whatever
the thread count or machine: digest both and compare the lines.

    analysis/run_digest.py runs/a/run.h5 runs/a/checkpoints/step_00000250.h5 > a.txt
    analysis/run_digest.py runs/b/run.h5 runs/b/checkpoints/step_00000250.h5 > b.txt
    diff a.txt b.txt

One line per dataset: its path inside the file, shape, dtype and the digest
of its data in little-endian byte order. Wall-clock datasets (names holding
'time', 'per_s', 'seconds' or 'elapsed') differ between runs by nature; --skip-timing
leaves them out. Attributes are not digested (the configuration attribute
records the thread count, which may differ). Exit status 1 with a one-line
message when a file cannot be read.
"""
import argparse
import hashlib
import sys

TIMING = ("time", "per_s", "seconds", "elapsed")


def digest_file(path, skip_timing):
    import h5py
    import numpy as np

    lines = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            leaf = name.rsplit("/", 1)[-1]
            if skip_timing and any(t in leaf for t in TIMING):
                return
            data = obj[()]
            arr = np.asarray(data)
            if arr.dtype.kind in "iufb":
                arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
                raw = np.ascontiguousarray(arr).tobytes()
            else:
                raw = repr(data).encode()
            h = hashlib.sha256(raw).hexdigest()
            lines.append(f"/{name} {list(arr.shape)} {arr.dtype.str} {h}")

        f.visititems(visit)
    return sorted(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="HDF5 files (run.h5, checkpoints)")
    ap.add_argument("--skip-timing", action="store_true", help="leave out wall-clock datasets")
    a = ap.parse_args()
    for path in a.files:
        try:
            lines = digest_file(path, a.skip_timing)
        except Exception as e:  # noqa: BLE001 - one line for any unreadable file
            print(f"run_digest: cannot read '{path}': {e}", file=sys.stderr)
            return 1
        print(f"# {path.rsplit('/', 1)[-1]}: {len(lines)} datasets")
        for line in lines:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
