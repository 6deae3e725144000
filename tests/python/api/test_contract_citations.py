"""Code comments cite the behaviour contract in the repository by section name
(docs/contract.md, "Section"); every cited section exists, and nothing cites
the old out-of-tree specification any more."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CONTRACT = ROOT / "docs" / "contract.md"
TREES = ("csrc", "python", "tests", "benchmarks")
SUFFIXES = {".py", ".pyi", ".h", ".cpp", ".cu", ".md", ".txt", ".sh", ".cmake"}

# `docs/contract.md, "A", "B"` (possibly wrapped, comment markers between)
CITATION = re.compile(r'contract\.md,((?:[\s#/*]*"[^"\n]+"[,;:]?)+)')
OLD = re.compile(r"SPEC(\.md)?\s*§|SPEC\.md|DESIGN\.md")


def _sources() -> list[Path]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    for tree in TREES:
        files += [p for p in (ROOT / tree).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return [p for p in files if "results" not in p.parts and p.name != Path(__file__).name]


def sections(text: str) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^##+ (.+)$", text, re.M)}


def citations(text: str) -> list[str]:
    return [name for m in CITATION.finditer(text) for name in re.findall(r'"([^"\n]+)"', m.group(1))]


def test_citation_parser_reads_wrapped_and_multiple_names():
    text = '# (docs/contract.md, "The pass",\n#  "Reference engine") and contract.md, "Words".'
    assert citations(text) == ["The pass", "Reference engine", "Words"]
    assert sections("# t\n## The pass\ntext\n## Words\n") == {"The pass", "Words"}


def test_every_cited_section_exists():
    known = sections(CONTRACT.read_text())
    bad, seen = [], 0
    for path in _sources():
        for name in citations(path.read_text(errors="replace")):
            seen += 1
            if name not in known:
                bad.append(f"{path.relative_to(ROOT)}: {name!r}")
    assert seen >= 30, f"only {seen} citations found: the parser is broken"
    assert bad == [], f"sections not in docs/contract.md ({sorted(known)}):\n" + "\n".join(bad)


def test_nothing_cites_the_out_of_tree_spec():
    hits = []
    for path in _sources():
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OLD.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert hits == [], "\n".join(hits)
