"""Checks a run file against docs/hdf5-schema.md.

usage: check_schema.py SCHEMA.md RUN.h5 CONDITION[,CONDITION...]

Parses the document's dataset tables (header `| dataset | dtype | shape |
unit | when | meaning |`) and attribute tables (`| attribute | object |
dtype | when | meaning |`), then reads the run file with h5py:

* every dataset of the file matches exactly one documented path, with the
  documented dtype, rank and fixed dimensions; row datasets (first axis
  `rows`) are chunked, gzip-compressed and extendible along that axis;
* every documented dataset whose `when` is among CONDITIONS matches at
  least one dataset of the file;
* in a row group (a group with a `step` dataset) every dataset has as many
  rows as `step`;
* every group of the file holds a documented dataset below it;
* every attribute of the root and of every dataset is documented for that
  object with its dtype, and every documented attribute whose `when` is
  among CONDITIONS is present on every object it names.

Prints one line per problem and exits 1 if there is any; prints a summary
and exits 0 otherwise.
"""
import re
import sys

import h5py
import numpy as np

DATASET_HEADER = ["dataset", "dtype", "shape", "unit", "when", "meaning"]
ATTRIBUTE_HEADER = ["attribute", "object", "dtype", "when", "meaning"]
DTYPES = {"int64", "uint64", "float64", "float32", "string", "string[]"}
CONDITIONS = {"always", "quantized", "capture", "synthetic", "resumed", "eval"}
PLACEHOLDERS = {
    "<layer>": r"(?P<layer>[^/]+)",
    "<name>": r"(?P<name>[^/]+)",
    "<policy>": r"(?P<policy>[^/]+)",
    "<gemm>": r"(?P<gemm>fprop|dgrad|wgrad)",
    "<operand>": r"(?P<operand>(?:fprop|dgrad|wgrad)-(?:x|w|dy))",
    "<N>": r"(?P<N>[0-9]+)",
}


def cells(line):
    s = line.strip()
    assert s.startswith("|") and s.endswith("|"), line
    # Cells split at pipes that are not escaped (`\|` is a pipe inside a cell).
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", s[1:-1])]


def unquote(c):
    m = re.fullmatch(r"`([^`]+)`", c)
    if not m:
        raise ValueError("expected a `name` in backticks, got %r" % c)
    return m.group(1)


def pattern(path):
    rx = ""
    for part in re.split(r"(<[a-zA-Z]+>)", path):
        if part.startswith("<"):
            if part not in PLACEHOLDERS:
                raise ValueError("unknown placeholder %s in %s" % (part, path))
            rx += PLACEHOLDERS[part]
        else:
            rx += re.escape(part)
    return re.compile(rx + r"\Z")


def consistent(m):
    # <operand> must be a role of <gemm>.
    d = m.groupdict()
    return not (d.get("gemm") and d.get("operand")) or d["operand"].startswith(d["gemm"] + "-")


def parse(doc):
    datasets, attributes, problems = [], [], []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            head = cells(line)
            kind = "d" if head == DATASET_HEADER else "a" if head == ATTRIBUTE_HEADER else None
            i += 2  # the header and its |---| line
            while i < len(lines) and lines[i].startswith("|"):
                row = cells(lines[i])
                where = "docs line %d" % (i + 1)
                i += 1
                if kind is None:
                    continue
                try:
                    if kind == "d":
                        if len(row) != len(DATASET_HEADER):
                            raise ValueError("%d cells" % len(row))
                        path, dtype, shape, _unit, when, _ = row
                        path = unquote(path)
                        dims = re.fullmatch(r"\((.*)\)", shape)
                        if not dims:
                            raise ValueError("shape %r is not a tuple" % shape)
                        dims = [x.strip() for x in dims.group(1).split(",")]
                        if not all(re.fullmatch(r"[0-9]+|[A-Za-z]+", x) for x in dims):
                            raise ValueError("bad shape %r" % shape)
                        if dtype not in DTYPES or dtype == "string[]":
                            raise ValueError("bad dtype %r" % dtype)
                        if when not in CONDITIONS:
                            raise ValueError("bad condition %r" % when)
                        datasets.append(dict(path=path, rx=pattern(path), dtype=dtype, dims=dims, when=when,
                                             where=where, hits=0))
                    else:
                        if len(row) != len(ATTRIBUTE_HEADER):
                            raise ValueError("%d cells" % len(row))
                        name, obj, dtype, when, _ = row
                        name, obj = unquote(name), unquote(obj)
                        if dtype not in DTYPES:
                            raise ValueError("bad dtype %r" % dtype)
                        if when not in CONDITIONS:
                            raise ValueError("bad condition %r" % when)
                        attributes.append(dict(name=name, name_rx=pattern(name), object=obj,
                                               obj_rx=pattern(obj) if obj != "/" else None, dtype=dtype,
                                               when=when, where=where))
                except ValueError as e:
                    problems.append("%s: %s" % (where, e))
        else:
            i += 1
    return datasets, attributes, problems


def dtype_name(dt, shape):
    if h5py.check_string_dtype(dt) is not None:
        return "string[]" if shape not in ((), None) and len(shape) == 1 else "string"
    if dt.kind in "iuf":
        return "%s%d" % ({"i": "int", "u": "uint", "f": "float"}[dt.kind], dt.itemsize * 8)
    return str(dt)


def main():
    doc_path, run_path, conds = sys.argv[1], sys.argv[2], set(sys.argv[3].split(","))
    unknown = conds - CONDITIONS
    if unknown:
        print("unknown conditions %s" % sorted(unknown))
        return 2
    with open(doc_path, encoding="utf-8") as fh:
        datasets, attributes, problems = parse(fh.read())
    if not datasets or not attributes:
        problems.append("no dataset or attribute tables found in %s" % doc_path)

    f = h5py.File(run_path, "r")
    found_ds, found_groups = {}, []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            found_ds["/" + name] = obj
        else:
            found_groups.append("/" + name)

    f.visititems(visit)

    def documented_attributes(objpath):
        if objpath == "/":
            return [a for a in attributes if a["obj_rx"] is None]
        return [a for a in attributes if a["obj_rx"] is not None and a["obj_rx"].match(objpath)
                and consistent(a["obj_rx"].match(objpath))]

    def check_attributes(objpath, obj):
        docs = documented_attributes(objpath)
        for name in obj.attrs:
            a = [d for d in docs if d["name_rx"].match(name)]
            if not a:
                problems.append("attribute %s of %s is not documented" % (name, objpath))
                continue
            aid = obj.attrs.get_id(name)
            got = dtype_name(aid.dtype, aid.shape)
            if got != a[0]["dtype"]:
                problems.append("attribute %s of %s: dtype %s, documented %s (%s)"
                                % (name, objpath, got, a[0]["dtype"], a[0]["where"]))
        for d in docs:
            if d["when"] in conds and "<" not in d["name"] and d["name"] not in obj.attrs:
                problems.append("attribute %s of %s is documented (%s, when %s) but missing"
                                % (d["name"], objpath, d["where"], d["when"]))

    check_attributes("/", f)
    rows_of = {}
    for path, ds in sorted(found_ds.items()):
        matches = [d for d in datasets if d["rx"].match(path) and consistent(d["rx"].match(path))]
        if len(matches) != 1:
            problems.append("dataset %s matches %d documented datasets%s"
                            % (path, len(matches), "" if matches else " (undocumented)"))
            continue
        d = matches[0]
        d["hits"] += 1
        got = dtype_name(ds.dtype, ds.shape)
        if got != d["dtype"]:
            problems.append("%s: dtype %s, documented %s (%s)" % (path, got, d["dtype"], d["where"]))
        if len(ds.shape) != len(d["dims"]):
            problems.append("%s: rank %d, documented %s (%s)" % (path, len(ds.shape), d["dims"], d["where"]))
        else:
            for k, (n, doc_n) in enumerate(zip(ds.shape, d["dims"])):
                if doc_n.isdigit() and n != int(doc_n):
                    problems.append("%s: dimension %d is %d, documented %s" % (path, k, n, doc_n))
        if d["dims"][0] == "rows":
            if ds.chunks is None or ds.compression != "gzip" or ds.maxshape[0] is not None:
                problems.append("%s: a row dataset must be chunked, gzip-compressed and extendible" % path)
            rows_of[path] = ds.shape[0]
        check_attributes(path, ds)

    for path, n in rows_of.items():
        group = path.rsplit("/", 1)[0]
        step = group + "/step"
        if step not in rows_of:
            problems.append("%s: its group has no step dataset" % path)
        elif rows_of[step] != n:
            problems.append("%s: %d rows, %s has %d" % (path, n, step, rows_of[step]))

    for g in found_groups:
        if not any(p.startswith(g + "/") for p in found_ds):
            problems.append("group %s holds no dataset" % g)

    for d in datasets:
        if d["when"] in conds and d["hits"] == 0:
            problems.append("documented dataset %s (%s, when %s) is not in the file" % (d["path"], d["where"], d["when"]))

    for p in problems[:40]:
        print(p)
    if len(problems) > 40:
        print("... and %d more problems" % (len(problems) - 40))
    if problems:
        return 1
    print("ok: %d datasets, %d groups, %d documented datasets, %d documented attributes"
          % (len(found_ds), len(found_groups), len(datasets), len(attributes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
