"""docs/api.md is where the docstrings of statecache._C are written: the build
embeds it (cmake/embed_docs.py), which refuses a file it cannot read, and the
built module's docstrings are its texts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from statecache import _C

ROOT = Path(__file__).resolve().parents[3]
API = ROOT / "docs" / "api.md"


def _embed_docs():
    spec = importlib.util.spec_from_file_location("embed_docs", ROOT / "cmake" / "embed_docs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _words(text: str | None) -> str:
    # pybind11 ends a function's doc with a newline; the stub re-wraps: words are what must agree
    return " ".join((text or "").split())


def test_every_docstring_is_its_api_md_text():
    entries = _embed_docs().parse(API.read_text(encoding="utf-8"), str(API))
    checked = []
    for name, text in entries.items():
        head, _, member = name.partition(".")
        if name == "statecache._C":
            obj = _C
        elif not hasattr(_C, head):
            continue  # bound only with GPU kernels
        else:
            obj = getattr(_C, head)
            if member:
                obj = getattr(obj, member)
        assert _words(obj.__doc__) == _words(text), name
        checked.append(name)
    assert len(checked) > 300
    assert "StateSlotPool.pop" in checked and "StateGroupPool.release_many" in checked


@pytest.mark.parametrize(
    "text, error",
    [
        ("# t\n\n## `A`\n\nx\n\n### `B.y`\n\ny\n", "B.y is not a member of the section above it"),
        ("# t\n\n## `A`\n\nx\n\n#### `A.y`\n", "not a `## Name` or `### Name.member` heading"),
        ("# t\n\n## A\n\nx\n\n## A\n\ny\n", "A is given twice"),
        ("# t\n\n## A\n\n# x\n", "not a `## Name`"),
    ],
)
def test_embed_refuses_what_it_cannot_read(text, error):
    with pytest.raises(SystemExit, match=error):
        _embed_docs().parse(text, "api.md")


def test_embed_keeps_text_verbatim_and_marks_no_text():
    text = "# t\n\nintro\n\n## `A`\n\n  two\nlines \n\n### `A.b`\n\n## C\n\nc\n"
    assert _embed_docs().parse(text, "api.md") == {"A": "  two\nlines", "A.b": None, "C": "c"}
