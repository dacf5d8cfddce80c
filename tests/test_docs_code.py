"""Every Python block of README.md and docs/*.md runs, so a snippet with an undefined name or a
stale call fails here.

A file's blocks run in order in one namespace (a later block may continue an earlier one), in
a temporary working directory. A block that is a fragment of a larger program (it needs a
training run's files, ``torchrun``, a GPU, or stands for code the reader writes, ``...``) says
so in its info string, ````python fragment````; it is only compiled.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path) -> list[tuple[int, str, str]]:
    """``(line, info string, code)`` of every Python block of ``path``."""
    text = path.read_text(encoding="utf-8")
    return [
        (text[: m.start()].count("\n") + 1, m.group(1).strip(), m.group(2))
        for m in BLOCK.finditer(text)
    ]


def test_the_scan_finds_the_blocks() -> None:
    found = {p.name: blocks(p) for p in DOCS}
    assert len(found["README.md"]) == 1 and sum(map(len, found.values())) > 10
    kinds = {info for b in found.values() for _, info, _ in b}
    assert kinds <= {"", "fragment"}, kinds  # nothing else is understood


@pytest.mark.parametrize("path", [p for p in DOCS if blocks(p)], ids=lambda p: p.name)
def test_every_python_block_runs(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{path.stem}"}
    for line, info, code in blocks(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        compiled = compile(code, where, "exec")  # every block is valid Python
        if info == "fragment":
            continue
        try:
            exec(compiled, namespace)
        except Exception as error:  # name the block, keep the cause
            raise AssertionError(f"the block at {where} fails: {error!r}") from error
