"""Every reference to the documentation resolves: ``docs/<name>.md`` files exist, every
``§x.y`` names a numbered heading of ``docs/semantics.md``, and relative Markdown links point at
existing files. No reference to a semantics file outside the repository is left."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEMANTICS = ROOT / "docs" / "semantics.md"
SCANNED = ("src", "docs", "examples", "benchmarks", "tests")
ROOT_DOCS = ("README.md", "BENCHMARKS.md")

DOC_PATH = re.compile(r"\bdocs/[\w./-]+?\.md\b")
SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
MD_LINK = re.compile(r"\]\(([^)\s#]+\.md)(?:#[^)]*)?\)")
HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)?)[. ]", re.M)
OUTSIDE = re.compile(r"\bSPEC\b")


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in ROOT_DOCS if (ROOT / name).exists()]
    for top in SCANNED:
        files += sorted(p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md"))
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def occurrences(pattern: re.Pattern[str]) -> list[tuple[Path, int, str]]:
    """``(file, line, group 1 or the match)`` of every match in the scanned files."""
    found = []
    for path in scanned_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in pattern.finditer(line):
                found.append((path, n, m.group(1) if pattern.groups else m.group(0)))
    return found


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_semantics_sections_are_numbered_once():
    numbers = HEADING.findall(SEMANTICS.read_text(encoding="utf-8"))
    assert "2.8" in numbers and "6" in numbers, numbers
    assert len(numbers) == len(set(numbers)), sorted(n for n in numbers if numbers.count(n) > 1)


def test_section_references_resolve():
    headings = set(HEADING.findall(SEMANTICS.read_text(encoding="utf-8")))
    refs = occurrences(SECTION)
    assert refs, "no §x.y reference found: the scan is broken"
    bad = [f"{where(p, n)}: §{s}" for p, n, s in refs if s not in headings]
    assert not bad, "references to sections docs/semantics.md does not have:\n" + "\n".join(bad)


def test_document_paths_exist():
    refs = occurrences(DOC_PATH)
    assert any(r[2] == "docs/semantics.md" for r in refs)
    bad = [f"{where(p, n)}: {doc}" for p, n, doc in refs if not (ROOT / doc).is_file()]
    assert not bad, "references to missing documents:\n" + "\n".join(bad)


def test_markdown_links_resolve():
    bad = [
        f"{where(p, n)}: {target}"
        for p, n, target in occurrences(MD_LINK)
        if p.suffix == ".md" and "://" not in target and not (p.parent / target).is_file()
    ]
    assert not bad, "Markdown links to missing files:\n" + "\n".join(bad)


def test_no_reference_to_a_semantics_file_outside_the_repository():
    left = [f"{where(p, n)}" for p, n, _ in occurrences(OUTSIDE)]
    assert not left, "cite docs/semantics.md §x.y instead of SPEC at:\n" + "\n".join(left)
