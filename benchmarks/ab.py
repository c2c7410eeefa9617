"""Before and after in one run: the same benchmark script against two commits, interleaved.

    .venv/bin/python benchmarks/ab.py --before 516d8aa [--after HEAD] [--rounds 2] \
        [--grep 'jobs/s|ratio'] -- benchmarks/fleet_vs_churn.py --jobs 60 --rounds 1

Each commit gets a git worktree and a virtual environment of its own (kept under ``--work``, reused
by later runs; the editable install makes each import its own tree), and the script is run from the
side's own tree with its own interpreter (the benchmark as that commit had it), in the order before,
after, after, before, ... so a host that drifts over minutes favours neither. A script that the before
tree does not have yet is run from the after tree, importing the before tree's code. Every run's output is printed in full under a header; ``--grep`` then collects the
matching lines of each side, round by round, so the spread shows beside the figures. Nothing is
asserted: figures and ratios are read by a person.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def prepared_tree(ref: str, work: Path) -> Path:
    """A worktree of ``ref`` with its own .venv (made once; the venv is reused while pyproject is the same)."""
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = work / commit[:12]
    if not tree.exists():
        work.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(tree), commit)
    venv = tree / ".venv"
    stamp = venv / ".ab-installed"
    want = (tree / "pyproject.toml").read_text()
    if not stamp.exists() or stamp.read_text() != want:
        print(f"[ab] installing {ref} ({commit[:12]}) into {venv}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin/pip"), "install", "-q", "-e", f"{tree}[all,dev]"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        stamp.write_text(want)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="the commit measured as before")
    parser.add_argument("--after", default="HEAD", help="the commit measured as after (default HEAD)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side (interleaved)")
    parser.add_argument("--grep", default="", help="a regex: lines of each run to collect in the summary")
    parser.add_argument("--work", type=Path, default=Path("/tmp/sandfleet-ab"), help="where the trees live")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...] (a path in the repo)")
    args = parser.parse_args()
    command = [a for a in args.script if a != "--"]
    if not command:
        parser.error("name the benchmark after --")
    sides = {"before": prepared_tree(args.before, args.work), "after": prepared_tree(args.after, args.work)}
    order = [("before", "after")[(i + i // 2) % 2] for i in range(2 * args.rounds)]  # b a a b b a ...
    collected: dict[str, list[list[str]]] = {"before": [], "after": []}
    pattern = re.compile(args.grep) if args.grep else None
    for number, side in enumerate(order, 1):
        tree = sides[side]
        script = tree / command[0] if (tree / command[0]).exists() else sides["after"] / command[0]
        print(
            f"\n===== run {number}/{len(order)}: {side} ({git('rev-parse', '--short', 'HEAD', cwd=tree)}) ====="
        )
        sys.stdout.flush()
        done = subprocess.run(
            [str(tree / ".venv/bin/python"), str(script), *command[1:]],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        print(done.stdout, end="")
        if done.returncode:
            print(f"[ab] exit {done.returncode}: {done.stderr[-2000:]}")
        collected[side].append(
            [line for line in done.stdout.splitlines() if pattern and pattern.search(line)]
        )
    if pattern:
        print("\n===== summary (lines matching --grep, per run) =====")
        for side, runs in collected.items():
            for number, lines in enumerate(runs, 1):
                for line in lines:
                    print(f"{side:<6} #{number}  {line.strip()}")


if __name__ == "__main__":
    main()
