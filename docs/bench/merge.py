#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/merge.py: one sweep JSON out of several runs.

    merge.py OUT.json BASE.json RUN.json[:MODE] ... [--note TEXT]

Starts from BASE's records and, file by file, adds each RUN's records (only its MODE ones, fwd, bwd or
decode, when given), a record replacing any earlier one that measured the same thing (sweep.py's
record_key: name, variant, stage flags, d, N, causal, mode, and B, Hkv, Nq, which tell decode points
apart), as sweep.py --append does. Each added record keeps its run as `run`: "DATE build GIT", which
plot.py prints under the figure (records without one are BASE's own run). Every RUN must come from BASE's GPU. Merge
whole comparisons: a stage and the peers it is compared with should come from the same run
(docs/conventions.md); the note says which run each part came from.
"""
import argparse
import json
import sys

from sweep import record_key as key  # one definition of "the same measurement"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("out")
    ap.add_argument("base")
    ap.add_argument("runs", nargs="+", metavar="RUN.json[:MODE]")
    ap.add_argument("--note", default="", help="the provenance note stored in the output")
    a = ap.parse_args()
    with open(a.base) as f:
        result = json.load(f)
    records = {key(r): r for r in result["records"]}
    for spec in a.runs:
        path, _, mode = spec.partition(":")
        with open(path) as f:
            run = json.load(f)
        if run["gpu"] != result["gpu"]:
            sys.exit(f"merge.py: {path} was measured on {run['gpu']}, {a.base} on {result['gpu']}")
        build = run.get("build_git") or run.get("git")
        for r in run["records"]:
            if not mode or r["mode"] == mode:
                records[key(r)] = dict(r, run=f"{run['date']} build {build}")
    result["records"] = list(records.values())
    if a.note:
        result["note"] = a.note
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {a.out}: {len(result['records'])} records")


if __name__ == "__main__":
    main()
