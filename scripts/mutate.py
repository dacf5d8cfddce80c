#!/usr/bin/env python
"""A small mutation pass: plant one bug at a time, run the tests, report the bugs they miss.

    python scripts/mutate.py MUTATIONS.toml [-- extra pytest arguments]

MUTATIONS.toml lists textual mutations; ``old`` must occur exactly once in ``file``::

    tests = ["tests/train/test_train_lr_schedule.py"]   # default tests of every mutation

    [[mutation]]
    file = "src/embcore/train/model.py"
    old = "return cfg.dense_lr * step / cfg.warmup_steps"
    new = "return cfg.dense_lr * (step - 1) / cfg.warmup_steps"
    tests = ["tests/train/test_train_lr_schedule.py"]  # optional, replaces the default

The tests must pass unmutated first. Each mutation is then written into the file in place, the
tests run in a fresh ``python -m pytest -x -q`` process, and the file is restored before the
next one (also on errors and Ctrl-C). A mutation the tests still pass on "survives". Exit
status: 0 when every mutation is caught, 1 when one survives, 2 for a bad mutation list or
failing unmutated tests. Paths are relative to the current directory. See docs/testing.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutation:
    file: Path
    old: str
    new: str
    tests: tuple[str, ...]

    def label(self) -> str:
        return f"{self.file}: {self.old.strip()!r} -> {self.new.strip()!r}"


def load(path: Path) -> list[Mutation]:
    """The mutations of a TOML file, each checked against its target file."""
    spec = tomllib.loads(path.read_text())
    default = tuple(spec.get("tests", ()))
    mutations = []
    for i, m in enumerate(spec.get("mutation", [])):
        missing = {"file", "old", "new"} - set(m)
        if missing:
            raise ValueError(f"{path}: mutation {i} lacks {sorted(missing)}")
        target = Path(m["file"])
        tests = tuple(m.get("tests", default))
        if not tests:
            raise ValueError(f"{path}: mutation {i} ({target}) has no tests to run")
        count = target.read_text().count(m["old"]) if target.is_file() else -1
        if count != 1:
            found = "the file does not exist" if count < 0 else f"found {count} times"
            raise ValueError(
                f"{path}: mutation {i}: {m['old']!r} must occur once in {target}, {found}"
            )
        if m["old"] == m["new"]:
            raise ValueError(f"{path}: mutation {i} changes nothing")
        mutations.append(Mutation(target, m["old"], m["new"], tests))
    if not mutations:
        raise ValueError(f"{path}: no [[mutation]] entries")
    return mutations


def run_tests(tests: tuple[str, ...], extra: list[str], timeout: float) -> str:
    """``passed``, ``failed`` (tests failed or errored) or ``timeout``."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests, *extra]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    if done.returncode == 5:  # no tests collected: the list is wrong, not the code
        raise ValueError(f"no tests collected by {' '.join(tests)}")
    return "passed" if done.returncode == 0 else "failed"


def mutate(mutations: list[Mutation], extra: list[str], timeout: float) -> list[Mutation]:
    """Run every mutation; return the survivors."""
    survivors = []
    for n, m in enumerate(mutations, 1):
        original = m.file.read_text()
        try:
            m.file.write_text(original.replace(m.old, m.new))
            outcome = run_tests(m.tests, extra, timeout)
        finally:
            m.file.write_text(original)
        verdict = {"passed": "SURVIVED", "failed": "caught", "timeout": "caught (timeout)"}
        print(f"[{n}/{len(mutations)}] {verdict[outcome]:<16} {m.label()}", flush=True)
        if outcome == "passed":
            survivors.append(m)
    return survivors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mutations", type=Path, help="the TOML list of mutations")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test run")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = parser.parse_args(argv)
    try:
        mutations = load(args.mutations)
        for tests in sorted({m.tests for m in mutations}):
            if run_tests(tests, args.pytest_args, args.timeout) != "passed":
                print(f"the unmutated tests do not pass: {' '.join(tests)}", file=sys.stderr)
                return 2
        survivors = mutate(mutations, args.pytest_args, args.timeout)
    except (ValueError, OSError, tomllib.TOMLDecodeError) as e:
        print(f"mutate.py: {e}", file=sys.stderr)
        return 2
    caught = len(mutations) - len(survivors)
    print(f"{caught} of {len(mutations)} mutations caught, {len(survivors)} survived")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
