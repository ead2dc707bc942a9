#!/usr/bin/env python3
"""FlashAttention, step by step — docs/bench/results_index.py: what docs/results holds, and who cites it.

    results_index.py            print every file under docs/results, whether it stays, and the pages that name it
    results_index.py --write    regenerate the table of docs/results/README.md (its descriptions are kept)
    results_index.py --check    exit 1 when the tree and the index disagree (the ctest test ResultsIndex)

Which pages cite a file. A page names a file by its file name (`sweep-h100-2026-11-24.json`), alone or
after a path (`docs/results/raw/NAME`, `../docs/results/NAME`, `raw/NAME`), or, for the few files of
BY_SUFFIX, by the part of the name that sets it apart from a sibling the page names in full ("its `-r2`
sibling"). The pages, in three kinds:
  path      the reader's path: README.md, step*/README.md and docs/*.md;
  log       the records beside the index, docs/results/*.md (structure.md; this index is not one; the
            optimisation logs that were here became the histories);
  history   the optimisation histories, docs/history/*.md.
The course's code cites a file too where it names it by its path from the root ("docs/results/NAME" in
a source, script or CMake file outside docs/results): a comment that sends the reader there, or a tool
that reads it.

Which files stay (the rest leave the tree: git keeps them, and a history or record that names one says how
to print it). A file stays when
  - a path page names it, or
  - the course's code names it by its path, or
  - it is the data a kept plot is drawn from: X-fwd.png and X-bwd.png from X.json (plot.py), X.png from
    X.json or X.jsonl beside it or in raw/ (plot_decode.py, plot_memory.py, plot_ablation.py).
The records (docs/results/*.md) stay by the first rule: a path page links them.

--check fails when
  - a file under docs/results stays by no rule above (git rm it, or cite it from a path page);
  - the table of docs/results/README.md is not the one --write would write, or a row's description is
    missing (--write leaves "TODO" for a new file: say in one line what it is);
  - a markdown link in README.md, step*/README.md or docs/**/*.md points into docs/results at a file
    that does not exist;
  - docs/results holds more than LIMIT_BYTES.
Standard library only.
"""
import argparse
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = "docs/results"
INDEX = "docs/results/README.md"
LIMIT_BYTES = 3 * 1024 * 1024
TABLE_BEGIN = "<!-- results-index:begin (docs/bench/results_index.py --write) -->"
TABLE_END = "<!-- results-index:end -->"
TODO = "TODO"
CODE = (".h", ".cuh", ".cu", ".cpp", ".py", ".sh", ".cmake")
KINDS = ["path", "code", "log", "history"]
# Files a path page names by their difference from a sibling it names in full: {file: (page, the words)}.
BY_SUFFIX = {
    f"{RESULTS}/raw/peer-lead-fwd-lead0-r2-h100-2026-11-23.json": ("docs/conventions.md", "`-r2`"),
    f"{RESULTS}/raw/peer-lead-fwd-lead500k-r1-h100-2026-11-23.json": ("docs/conventions.md", "`-lead500k-r1`"),
    f"{RESULTS}/raw/peer-lead-fwd-lead500k-r2-h100-2026-11-23.json": ("docs/conventions.md", "`-lead500k-r2`"),
    f"{RESULTS}/raw/peer-lead-decode-lead500k-h100-2026-11-23.json": ("docs/conventions.md", "`-lead500k-`"),
}


def rel(path):
    return os.path.relpath(path, ROOT).replace(os.sep, "/")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def pages():
    """{page: kind} of every page that may cite a file (kind: path, code, log, history)."""
    out = {}
    for pattern, kind in (("README.md", "path"), ("step*/README.md", "path"), ("docs/*.md", "path"),
                          ("docs/results/*.md", "log"), ("docs/history/*.md", "history")):
        for f in sorted(glob.glob(os.path.join(ROOT, pattern))):
            if rel(f) != INDEX:
                out[rel(f)] = kind
    for d, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(n for n in dirs if not n.startswith((".", "build")) and rel(os.path.join(d, n)) != RESULTS)
        for n in sorted(names):
            if n.endswith(CODE) or n == "CMakeLists.txt":
                out[rel(os.path.join(d, n))] = "code"
    return out


def results_files():
    """Every file under docs/results but the index, relative to the repository root, sorted."""
    out = []
    for d, _, names in os.walk(os.path.join(ROOT, RESULTS)):
        out += [rel(os.path.join(d, n)) for n in names]
    return sorted(f for f in out if f != INDEX)


def mentions(text, path, page):
    """Whether the text of page names the file path (docs/results/..., by its file name)."""
    name = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))  # "results" or "raw"
    if page == path:
        return False
    for m in re.finditer(r"(?<![\w.-])((?:[\w.-]*/)*)" + re.escape(name) + r"(?![\w-])", text):
        prefix = m.group(1)
        if prefix:
            if os.path.basename(prefix.rstrip("/")) == parent:
                return True
        elif parent == "raw" or not name.endswith(".md") or os.path.dirname(page) == os.path.dirname(path):
            # a bare name: raw files and result files have unique names; a bare "step4.md" is a log only
            # on a page beside it (docs/history has a step4.md too)
            return True
    return False


def code_names(text, path):
    return bool(re.search(r"(?<![\w./-])" + re.escape(path) + r"(?![\w-])", text))


def citations(files, page_kinds):
    """{file: [(page, kind), ...]}."""
    texts = {p: read(p) for p in page_kinds}
    out = {f: [] for f in files}
    for f in files:
        for p, kind in page_kinds.items():
            if kind == "code":
                if code_names(texts[p], f):
                    out[f].append((p, kind))
            elif mentions(texts[p], f, p) or (BY_SUFFIX.get(f, ("",))[0] == p and BY_SUFFIX[f][1] in texts[p]):
                out[f].append((p, kind))
    return out


def plot_sources(png, files):
    """The data files the plot png is drawn from, among files."""
    d, name = os.path.split(png)
    stem = name[:-len(".png")]
    stems = [stem] + [stem[:-len(s)] for s in ("-fwd", "-bwd") if stem.endswith(s)]
    out = []
    for s in stems:
        for where in (d, d + "/raw"):
            for ext in (".json", ".jsonl"):
                if f"{where}/{s}{ext}" in files:
                    out.append(f"{where}/{s}{ext}")
    return out


def decide(files, cites):
    """{file: reason it stays} for the files that stay."""
    stays = {}
    for f in files:
        kinds = {k for _, k in cites[f]}
        if "path" in kinds:
            stays[f] = "named by a page on the reader's path"
        elif "code" in kinds:
            stays[f] = "named by the code: " + ", ".join(p for p, k in cites[f] if k == "code")
    for png in [f for f in stays if f.endswith(".png")]:
        for src in plot_sources(png, set(files)):
            stays.setdefault(src, "the data of " + os.path.basename(png))
    return stays


def link(frm, to, text=None):
    return f"[{text or os.path.basename(to)}]({os.path.relpath(to, os.path.dirname(frm)).replace(os.sep, '/')})"


def descriptions():
    """{file: its description}, from the table of the index as it is."""
    out = {}
    if not os.path.isfile(os.path.join(ROOT, INDEX)):
        return out
    for line in read(INDEX).split("\n"):
        m = re.match(r"^\| \[[^\]]+\]\(([^)]+)\) \| (.*?) \| .* \|$", line)
        if m:
            out[os.path.normpath(os.path.join(RESULTS, m.group(1))).replace(os.sep, "/")] = m.group(2)
    return out


def table(files, cites, described):
    rows = ["| File | What it is | Cited by |", "|---|---|---|"]
    for f in files:
        pages_ = sorted({p for p, _ in cites[f]}, key=lambda p: (KINDS.index(
            dict(cites[f])[p]), p))
        rows.append(f"| {link(INDEX, f, rel_to_results(f))} | {described.get(f, TODO)} | "
                    + ", ".join(link(INDEX, p, p) for p in pages_) + " |")
    return "\n".join(rows)


def rel_to_results(f):
    return os.path.relpath(f, RESULTS).replace(os.sep, "/")


def with_table(text, new_table):
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        sys.exit(f"{INDEX}: no markers {TABLE_BEGIN} ... {TABLE_END}")
    return text[:begin + len(TABLE_BEGIN)] + "\n" + new_table + "\n" + text[end:]


def dead_links():
    """(page, line, target) of every markdown link into docs/results whose file is missing."""
    out = []
    md = ["README.md"] + [rel(f) for f in sorted(glob.glob(os.path.join(ROOT, "step*", "README.md")))] \
        + [rel(f) for f in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))]
    for page in md:
        for no, line in enumerate(read(page).split("\n"), 1):
            for m in re.finditer(r"\]\(([^)\s]+)\)", line):
                target = m.group(1).split("#")[0]
                if not target or re.match(r"^[a-z]+:", target):
                    continue
                path = os.path.normpath(os.path.join(os.path.dirname(page), target)).replace(os.sep, "/")
                if (path == RESULTS or path.startswith(RESULTS + "/")) and not os.path.exists(os.path.join(ROOT, path)):
                    out.append((page, no, target))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"regenerate the table of {INDEX}")
    g.add_argument("--check", action="store_true", help="exit 1 where the tree and the index disagree")
    a = ap.parse_args()

    files = results_files()
    cites = citations(files, pages())
    stays = decide(files, cites)
    described = descriptions()
    kept = [f for f in files if f in stays]

    if a.write:
        path = os.path.join(ROOT, INDEX)
        new = with_table(read(INDEX), table(kept, cites, described))
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
        todo = [f for f in kept if described.get(f, TODO) == TODO]
        print(f"{INDEX}: {len(kept)} rows" + (f", {len(todo)} to describe (TODO)" if todo else ""))
        return 0

    if a.check:
        errors = []
        for f in files:
            if f not in stays:
                kinds = sorted({k for _, k in cites[f]})
                who = f"cited only by {' and '.join(kinds)} pages" if kinds else "cited by no page"
                errors.append(f"{f}: {who}, not by one on the reader's path: git rm it (git keeps it), or cite it")
        if not os.path.isfile(os.path.join(ROOT, INDEX)):
            errors.append(f"{INDEX}: missing")
        elif read(INDEX) != with_table(read(INDEX), table(kept, cites, described)):
            errors.append(f"{INDEX}: its table is not what the tree gives: run docs/bench/results_index.py --write")
        for f in kept:
            if described.get(f, TODO) == TODO:
                errors.append(f"{INDEX}: {rel_to_results(f)} has no description: say in one line what it is")
        for page, no, target in dead_links():
            errors.append(f"{page}:{no}: link to {target}: no such file")
        size = sum(os.path.getsize(os.path.join(ROOT, f)) for f in files + [INDEX]
                   if os.path.isfile(os.path.join(ROOT, f)))
        if size > LIMIT_BYTES:
            errors.append(f"{RESULTS}: {size / 1024:.0f} KB, more than {LIMIT_BYTES // 1024} KB")
        for e in errors:
            print(e)
        print(f"{RESULTS}: {len(files)} files, {size / 1024:.0f} KB; "
              + ("ok" if not errors else f"{len(errors)} problem(s)"))
        return 1 if errors else 0

    total = 0
    for f in files:
        size = os.path.getsize(os.path.join(ROOT, f))
        total += size
        who = ", ".join(f"{p} ({k})" for p, k in cites[f]) or "-"
        print(f"{'stays' if f in stays else 'goes '}\t{size // 1024:6d} KB\t{rel_to_results(f)}\t"
              f"{stays.get(f, '')}\t{who}")
    keep_size = sum(os.path.getsize(os.path.join(ROOT, f)) for f in kept)
    print(f"# {len(files)} files, {total / 1024:.0f} KB; {len(kept)} stay, {keep_size / 1024:.0f} KB; "
          f"{len(files) - len(kept)} go, {(total - keep_size) / 1024:.0f} KB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
