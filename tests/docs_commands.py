#!/usr/bin/env python3
"""FlashAttention, step by step — tests/docs_commands.py: every shell command the course shows, run.

    docs_commands.py BUILD_DIR            run them against a built tree (the ctest test DocsCommands)
    docs_commands.py BUILD_DIR --list     only say what would be done with each

Which lines are commands. In README.md, step*/README.md and docs/*.md (not docs/results/): a line of a
code block (fenced with ``` and no language or sh/bash/shell, or indented by four spaces) whose first
word, after any VAR=value, is ./run.sh, ctest, cmake, build/..., tests/..., docs/..., python3 or
/usr/bin/python3, compute-sanitizer or ncu. A line ending in a backslash goes on on the next line. In
prose, an inline `./run.sh test -R REGEX` (how an exercise says which tests decide it) counts too.

What is done with each:
  run      the CPU commands, with sh, in a scratch copy of the tree whose build/ is BUILD_DIR (what a
           command writes lands in the copy), each within 120 s. A command must exit 0, or with the status
           its comment declares, for one shown to be refused: `... --seq 0   # refused: exits 2`.
  list     `./run.sh test -R REGEX` and `ctest ... -R REGEX` would build, or run the suite from inside the
           suite: instead, `ctest -N -R REGEX` in BUILD_DIR must select at least one test.
  skip     with the reason, counted:
           build      any other ./run.sh, ctest or cmake line (the tree is built already);
           GPU        it names a GPU program (step3_ to step7_, fa_gpu_tests, tests/run_gpu.sh, mma_peak,
                      docs/bench/sweep.py and mods_bench.py, configs.sh or ab_builds.py, the tour's --tuned rows,
                      compute-sanitizer, ncu, nsys, cuobjdump), or its test regex names GPU tests
                      (step3 to step7, Gpu) and BUILD_DIR has no GPU tests, or names step 7 and
                      BUILD_DIR has no step 7 (built only when 90 is among the CUDA architectures);
           template   it stands for a command to adapt: <gpu>, "...", or a name in capitals (OLD_BUILD).
Fails, with the file and line of each, when a command exits with another status or runs out of time,
or a test regex selects nothing, or a run command writes into the tree (a committed file changed, or a new
file under the copy) without saying so: a command shown to a reader writes to a scratch path, unless its
comment says it `regenerates` a committed file (`... plot.py ...json   # regenerates sweep-...-fwd.png`).
"""
import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 120

COMMAND_START = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
                           r"(?:\./run\.sh|ctest|cmake|build/|tests/|docs/|python3|/usr/bin/python3|compute-sanitizer|ncu)\b")
SHELL_FENCES = {"", "sh", "bash", "shell"}
INLINE_TEST_RUN = re.compile(r"`(\./run\.sh test -R [^`]+)`")

GPU_PROGRAM = re.compile(r"\bstep[3-7]_|fa_gpu_tests|run_gpu\.sh|mma_peak|sweep\.py|mods_bench\.py|configs\.sh|ab_builds\.py"
                         r"|flashattention_tour\b.*--tuned|compute-sanitizer|\bncu\b|\bnsys\b|cuobjdump")
GPU_TESTS = re.compile(r"(?i)step[3-7]|gpu")
STEP7_TESTS = re.compile(r"(?i)step7")
TEMPLATE = re.compile(r"<[\w-]+>|\.\.\.|(?<![\w$./-])[A-Z][A-Z0-9_]{2,}(?![\w.=/])")


def documents():
    found = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "step*", "README.md"))) \
        + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return [os.path.relpath(f, ROOT) for f in found if os.path.isfile(f)]


def commands(path):
    """(line number, command) of every command in one markdown file, in order."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().split("\n")
    out, fence, indented, pending = [], None, False, None
    for no, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
            continue
        in_fence = fence is not None and fence in SHELL_FENCES
        # an indented code block starts after a blank line and lasts while its lines stay indented
        after_blank = no == 1 or not lines[no - 2].strip()
        indented = fence is None and line.startswith("    ") and (indented or after_blank)
        if pending is not None:  # the rest of a command continued with a backslash
            start, text = pending
            text += " " + stripped
            if text.endswith("\\"):
                pending = (start, text[:-1].rstrip())
            else:
                out.append((start, text))
                pending = None
            continue
        if in_fence or indented:
            if COMMAND_START.match(stripped):
                if stripped.endswith("\\"):
                    pending = (no, stripped[:-1].rstrip())
                else:
                    out.append((no, stripped))
        elif fence is None:
            out += [(no, m[1]) for m in INLINE_TEST_RUN.finditer(line)]
    return out


def split_comment(command):
    """(the command, its trailing comment): the comment starts at the first # outside quotes after a blank."""
    quote = None
    for i, c in enumerate(command):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].rstrip(), command[i + 1:].strip()
    return command, ""


def test_regex(words):
    """The -R argument of a ./run.sh test or ctest command, or None."""
    for i, w in enumerate(words[:-1]):
        if w == "-R":
            return words[i + 1]
    return None


# The Python commands of the docs draw plots: where matplotlib or numpy is missing (a GPU machine's own
# Python, say), they are skipped with that reason instead of failing.
def has_plot_modules(python, _known={}):
    if python not in _known:
        _known[python] = subprocess.run([python, "-c", "import matplotlib, numpy"], capture_output=True).returncode == 0
    return _known[python]


def classify(command, has_gpu_tests, has_step7):
    """("run", expected status) | ("list", regex) | ("skip", reason)."""
    cmd, comment = split_comment(command)
    words = shlex.split(cmd)
    program = next(w for w in words if not re.match(r"[A-Z_][A-Z0-9_]*=", w))  # after VAR=value
    args = words[words.index(program) + 1:]
    if program in ("./run.sh", "ctest", "cmake"):
        runs_tests = program == "ctest" or args[:1] == ["test"]
        regex = test_regex(args) if runs_tests else None
        if regex is None:
            return "skip", "build"
        # step 7's tests exist only in a build with 90 among the CUDA architectures
        if (GPU_TESTS.search(regex) and not has_gpu_tests) or (STEP7_TESTS.search(regex) and not has_step7):
            return "skip", "GPU"
        return "list", regex
    if GPU_PROGRAM.search(cmd):
        return "skip", "GPU"
    if TEMPLATE.search(cmd):
        return "skip", "template"
    if program in ("python3", "/usr/bin/python3") and not has_plot_modules(program):
        return "skip", "no matplotlib/numpy"
    m = re.search(r"\bexits (\d+)\b", comment)
    return "run", int(m[1]) if m else 0


def scratch_tree(build_dir):
    """A scratch copy of the tree: the markdown and docs/ copied (commands write there), the other source
    folders linked, and build/ linked to the build folder under test."""
    scratch = tempfile.mkdtemp(prefix="fa-docs-")
    for name in os.listdir(ROOT):
        src = os.path.join(ROOT, name)
        if name.startswith(".") or name.startswith("build"):
            continue
        if name == "docs":
            shutil.copytree(src, os.path.join(scratch, name), symlinks=True)
        elif os.path.isdir(src):
            os.symlink(src, os.path.join(scratch, name))
        else:
            shutil.copy2(src, os.path.join(scratch, name))
    os.symlink(os.path.abspath(build_dir), os.path.join(scratch, "build"))
    return scratch


def listed(build_dir, regex):
    """How many tests of the build `ctest -R regex` selects (ctest -N: lists them, runs nothing)."""
    out = subprocess.run(["ctest", "--test-dir", build_dir, "-N", "-R", regex], capture_output=True, text=True)
    m = re.search(r"Total Tests: (\d+)", out.stdout)
    return int(m[1]) if m else 0


def files_of(scratch):
    """Every plain file of the scratch copy (not through the links to the sources) and when it was written."""
    out = {}
    for top, dirs, files in os.walk(scratch):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
        for f in files:
            path = os.path.join(top, f)
            if not os.path.islink(path):
                st = os.stat(path)
                out[os.path.relpath(path, scratch)] = (st.st_size, st.st_mtime_ns)
    return out


def run(command, scratch, expected):
    """(what to print, the failure or None) of one command run in the scratch tree."""
    before = files_of(scratch)
    start = time.monotonic()
    try:
        p = subprocess.run(["sh", "-c", command], cwd=scratch, capture_output=True, text=True, timeout=TIMEOUT_S)
        status, output = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        as_text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        status, output = f"none within {TIMEOUT_S} s", as_text(e.stdout) + as_text(e.stderr)
    said = f"run  (exit {status}, {time.monotonic() - start:5.1f} s)"
    after = files_of(scratch)
    written = sorted(f for f in after if before.get(f) != after[f])
    if written and "regenerates" not in split_comment(command)[1]:
        return said, (f"writes into the tree ({', '.join(written[:5])}): write to a scratch path, or say in its "
                      f"comment that it regenerates a committed file\n    {command}")
    if status == expected:
        return said, None
    tail = "\n".join("    | " + line for line in output.rstrip().split("\n")[-15:])
    return said, f"exit {status}, expected {expected}\n    {command}\n{tail}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", help="a built tree (what `build/` in the commands stands for)")
    ap.add_argument("--list", action="store_true", help="say what would be done with each command, run nothing")
    a = ap.parse_args()
    build_dir = os.path.abspath(a.build)
    has_gpu_tests = listed(build_dir, "Gpu") > 0
    has_step7 = listed(build_dir, "[Ss]tep7") > 0

    scratch = None if a.list else scratch_tree(build_dir)
    failures, done, skipped = [], {"run": 0, "list": 0}, {}
    start = time.monotonic()
    try:
        for doc in documents():
            for no, command in commands(doc):
                where = f"{doc}:{no}"
                what, arg = classify(command, has_gpu_tests, has_step7)
                if what == "skip":
                    skipped[arg] = skipped.get(arg, 0) + 1
                    print(f"skip ({arg}) {where}: {command}")
                    continue
                done[what] += 1
                if a.list:
                    print(f"{what} {where}: {command}")
                elif what == "list":
                    n = listed(build_dir, arg)
                    print(f"list ({n} tests) {where}: {command}")
                    if n == 0:
                        failures.append(f"{where}: the test regex '{arg}' selects no test of {build_dir}\n    {command}")
                else:
                    said, failure = run(command, scratch, arg)
                    print(f"{said} {where}: {command}")
                    if failure:
                        failures.append(f"{where}: {failure}")
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)

    reasons = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
    print(f"\n{done['run']} commands {'to run' if a.list else 'run'}, {done['list']} test regexes "
          f"{'to list' if a.list else 'listed'}, {sum(skipped.values())} skipped ({reasons or 'none'}) "
          f"in {time.monotonic() - start:.0f} s")
    if failures:
        print(f"\n{len(failures)} FAILED:\n" + "\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
