"""scripts/mutate.py, the developer's mutation pass, on a two-function project of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test starts the script and pytest in fresh processes

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutate.py"

CALC = "def add(a, b):\n    return a + b\n\n\ndef unused():\n    return 1\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def _project(tmp_path: Path, mutations: str) -> Path:
    (tmp_path / "calc.py").write_text(CALC)
    (tmp_path / "test_calc.py").write_text(TEST)
    (tmp_path / "mutations.toml").write_text(mutations)
    return tmp_path


def _run(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "mutations.toml"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_reports_caught_and_surviving_mutations_and_restores_the_file(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        'tests = ["test_calc.py"]\n'
        '[[mutation]]\nfile = "calc.py"\nold = "a + b"\nnew = "a - b"\n'
        '[[mutation]]\nfile = "calc.py"\nold = "return 1"\nnew = "return 2"\n',
    )
    done = _run(project)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("[1/2] caught") and "'a + b' -> 'a - b'" in lines[0]
    assert lines[1].startswith("[2/2] SURVIVED") and "'return 1' -> 'return 2'" in lines[1]
    assert lines[-1] == "1 of 2 mutations caught, 1 survived"
    assert (project / "calc.py").read_text() == CALC


def test_every_mutation_caught_exits_zero(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        '[[mutation]]\nfile = "calc.py"\nold = "a + b"\nnew = "a * b"\ntests = ["test_calc.py"]\n',
    )
    done = _run(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "1 of 1 mutations caught, 0 survived"


def test_a_mutation_that_does_not_match_once_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    project = _project(
        tmp_path,
        'tests = ["test_calc.py"]\n[[mutation]]\nfile = "calc.py"\nold = "return"\nnew = "yield"\n',
    )
    done = _run(project)
    assert done.returncode == 2
    assert "'return' must occur once in calc.py, found 2 times" in done.stderr
    assert done.stdout == ""
    assert (project / "calc.py").read_text() == CALC


def test_failing_unmutated_tests_stop_the_pass(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        'tests = ["test_calc.py"]\n[[mutation]]\nfile = "calc.py"\nold = "a + b"\nnew = "b + a"\n',
    )
    (project / "calc.py").write_text(CALC.replace("a + b", "a + b + 1"))
    done = _run(project)
    assert done.returncode == 2
    assert "the unmutated tests do not pass: test_calc.py" in done.stderr
