"""Mutation checks: does a test catch the bug it guards?

Each row of ``tools/mutations.toml`` plants one plausible bug (a file, its exact old text, the new text) in a
copy of the tree (the tracked and untracked, not ignored files: what ``git ls-files`` names, uncommitted
changes included) and runs the row's pytest node ids there, with this interpreter and PYTHONPATH pointed at the
copy. "caught": the tests failed; "missed": they passed (a missing test); "error": the mutation could not be
applied or pytest could not run the tests (a bad node id, no tests collected). The real tree is never edited.
A row may expect "missed" instead: it simulates a slow machine, and its tests must not care.

    python tools/mutate.py --area sessions          the area's rows
    python tools/mutate.py --all                    every row
    python tools/mutate.py --id greedy-tie-lanes    one row
    python tools/mutate.py --list                   the rows, not run
    python tools/mutate.py --all --baseline         also run each row's tests on the unmutated copy first

A mutation of ``npu_ops/csrc`` builds its kernels into a cache folder of its own (MINDIE_KERNEL_CACHE in the
copy). Exit status 0 when every row run came out as it expects (and every baseline passed), else 1."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tools" / "mutations.toml"
LINKED = ("models",)  # ignored build outputs the tests read (demo models): linked into the copy, not copied


@dataclass(frozen=True)
class Mutation:
    id: str
    area: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str
    expect: str = "caught"  # "missed": the tests must pass under it (a slow machine simulated: they do not care)


@dataclass(frozen=True)
class Outcome:
    mutation: Mutation
    verdict: str  # caught | missed | error
    seconds: float
    detail: str = ""
    baseline: str = ""  # "" (not run) | passes | FAILS


def load_table(path: Path) -> list[Mutation]:
    rows = tomllib.loads(path.read_text(encoding="utf-8")).get("mutation", [])
    out = [Mutation(r["id"], r["area"], r["file"], r["old"], r["new"], tuple(r["tests"]), r.get("why", ""),
                    r.get("expect", "caught")) for r in rows]
    ids = [m.id for m in out]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise SystemExit(f"{path}: duplicate ids {dupes}")
    return out


def tree_files(root: Path) -> list[str]:
    """Tracked files and untracked ones git does not ignore, as they are on disk now."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout
    return sorted({f for f in out.decode().split("\0") if f and (root / f).is_file()})


def copy_tree(root: Path, dest: Path) -> None:
    for rel in tree_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    for name in LINKED:
        if (root / name).exists():
            (dest / name).symlink_to(root / name)


def apply(tree: Path, m: Mutation) -> None:
    """Replace ``m.old`` by ``m.new`` in the copy; ValueError unless ``m.old`` occurs exactly once."""
    path = tree / m.file
    if not path.is_file():
        raise ValueError(f"{m.file}: no such file")
    text = path.read_text(encoding="utf-8")
    n = text.count(m.old)
    if n != 1:
        raise ValueError(f"{m.file}: the old text occurs {n} times (needs exactly 1)")
    path.write_text(text.replace(m.old, m.new), encoding="utf-8")


def environment(tree: Path, m: Mutation) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONDONTWRITEBYTECODE="1")
    if m.file.startswith("npu_ops/csrc/"):
        env["MINDIE_KERNEL_CACHE"] = str(tree / ".kernels")
    return env


def check_imports(tree: Path, env: dict[str, str]) -> None:
    """The copy's packages are the ones imported there (not an installed or editable copy elsewhere)."""
    code = "import mindie_service, npu_ops; print(mindie_service.__file__); print(npu_ops.__file__)"
    got = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    paths = got.stdout.split()
    if got.returncode != 0 or len(paths) != 2 or not all(Path(p).is_relative_to(tree) for p in paths):
        raise RuntimeError(f"the copy's packages are not the ones imported: {got.stdout}{got.stderr}")


def run_tests(tree: Path, m: Mutation, timeout: float, verbose: bool = False) -> tuple[int, str]:
    env = environment(tree, m)
    check_imports(tree, env)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *m.tests]
    # a session of its own: on a timeout its whole process group goes (a server a test started, too)
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return -1, f"timed out after {timeout:.0f} s"
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if verbose:
        print("\n".join(ln for ln in lines if ln.startswith(("E ", "FAILED", "ERROR")))[-3000:], flush=True)
    failed = [ln.removeprefix("FAILED ") for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    tail = lines[-1] if lines else stderr.strip()[-300:]
    return proc.returncode, f"{tail}: {failed[0]}" if failed else tail


def verdict(rc: int) -> str:
    """pytest's exit status: 0 all passed, 1 some failed, 2 interrupted (a collection error: the mutation broke
    an import), 5 nothing collected, 4 usage error, -1 our timeout."""
    return {0: "missed", 1: "caught", 2: "caught"}.get(rc, "error")


def run_one(m: Mutation, timeout: float, baseline: bool, verbose: bool) -> Outcome:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutate-{m.id}-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(ROOT, tree)
        base = ""
        if baseline:
            rc, tail = run_tests(tree, m, timeout)
            base = "passes" if rc == 0 else "FAILS"
            if rc != 0:
                return Outcome(m, "error", time.monotonic() - t0, f"baseline: {tail}", base)
        try:
            apply(tree, m)
        except ValueError as e:
            return Outcome(m, "error", time.monotonic() - t0, str(e), base)
        rc, tail = run_tests(tree, m, timeout, verbose)
    return Outcome(m, verdict(rc), time.monotonic() - t0, tail, base)


def print_table(outcomes: list[Outcome]) -> None:
    w = max([len(o.mutation.id) for o in outcomes] + [2])
    a = max([len(o.mutation.area) for o in outcomes] + [4])
    print(f"\n{'id':<{w}}  {'area':<{a}}  verdict  expected  baseline  seconds  detail")
    for o in outcomes:
        print(f"{o.mutation.id:<{w}}  {o.mutation.area:<{a}}  {o.verdict:<7}  {o.mutation.expect:<8}  "
              f"{o.baseline or '-':<8}  {o.seconds:7.1f}  {o.detail[:90]}")
    counts = {v: sum(o.verdict == v for o in outcomes) for v in ("caught", "missed", "error")}
    wrong = sum(o.verdict != o.mutation.expect for o in outcomes)
    print(", ".join(f"{n} {v}" for v, n in counts.items()) + f"; {wrong} not as expected")


def select(rows: list[Mutation], args: argparse.Namespace) -> list[Mutation]:
    if args.all:
        return rows
    if args.id:
        chosen = [m for m in rows if m.id in args.id]
        missing = set(args.id) - {m.id for m in chosen}
    else:
        chosen = [m for m in rows if m.area in args.area]
        missing = set(args.area) - {m.area for m in chosen}
    if missing:
        raise SystemExit(f"not in the table: {sorted(missing)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--area", action="append", help="run this area's rows (repeatable)")
    group.add_argument("--id", action="append", help="run this row (repeatable)")
    group.add_argument("--all", action="store_true", help="run every row")
    group.add_argument("--list", action="store_true", help="list the rows and their areas, run nothing")
    p.add_argument("--table", type=Path, default=TABLE)
    p.add_argument("--baseline", action="store_true", help="first check each row's tests pass unmutated")
    p.add_argument("--verbose", action="store_true", help="print each mutated run's failures (E lines)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for one row's tests")
    args = p.parse_args(argv)
    rows = load_table(args.table)
    if args.list:
        for m in rows:
            print(f"{m.area:<14} {m.id:<34} {m.file} (expect {m.expect})\n{'':<14} {m.why}")
        return 0
    outcomes = []
    for m in select(rows, args):
        o = run_one(m, args.timeout, args.baseline, args.verbose)
        print(f"{o.verdict:<7} {m.id} ({o.seconds:.1f} s) {o.detail[:120]}", flush=True)
        outcomes.append(o)
    print_table(outcomes)
    return 0 if all(o.verdict == o.mutation.expect for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
