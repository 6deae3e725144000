"""The typed API: _C.pyi agrees with the built module (and the check can
fail), `mypy --strict` passes on the stubs, the typed modules and the README's
examples, and the README's examples are the checked ones."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stubcheck
from statecache import _C

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = Path(__file__).with_name("test_typing_examples.py")


def test_stub_and_module_agree():
    problems = stubcheck.compare(_C)
    hint = (
        "\n_C.pyi is out of date: update it (python tests/python/stubcheck.py --skeleton "
        "prints stub lines for new names; give them types and a Returns/Raises docstring)"
    )
    assert problems == [], "\n".join(problems) + hint


def _drifted(tmp_path, old: str, new: str) -> list[str]:
    text = stubcheck.STUB.read_text()
    assert old in text
    path = tmp_path / "_C.pyi"
    path.write_text(text.replace(old, new, 1))
    return stubcheck.compare(_C, path)


@pytest.mark.parametrize(
    "old,new,expect",
    [
        (
            "    def pop_many(self, count: _Int) -> list[int]:",
            "    def pop_many(self, n: _Int) -> list[int]:",
            "StateSlotPool.pop_many: stub (n) != module (count)",
        ),
        (
            "    def has_free(self, count: _Int = 1) -> bool:",
            "    def has_free(self, count: _Int = 2) -> bool:",
            "StateSlotPool.has_free: default of count is 2 in the stub, 1 in the module",
        ),
        (
            "    def pin(self, slot: _Int, *, reader_is_next_batch: bool = False) -> None:",
            "    def pin(self, slot: _Int, reader_is_next_batch: bool = False) -> None:",
            "StateSlotPool.pin: stub (slot, reader_is_next_batch=False) != module (slot, *reader_is_next_batch=False)",
        ),
        (
            "    def reset_prefix_cache(self) -> int:",
            "    def reset_prefix_caches(self) -> int:",
            "missing from the stub: BlockPool.reset_prefix_cache (method)",
        ),
        (
            '    def clear_index(self) -> None:\n        """Drops every checkpoint',
            "    def clear_index(self) -> None: ...\n    def forget_all(self) -> None:\n"
            '        """Drops every checkpoint',
            "in the stub but not in the module: StateSlotPool.forget_all",
        ),
        (
            "    @property\n    def num_blocks(self) -> int: ...",
            "    def num_blocks(self) -> int: ...",
            "BlockPool.num_blocks: the stub has a method, the module a data",
        ),
    ],
)
def test_the_check_fails_on_drift(tmp_path, old, new, expect):
    assert expect in _drifted(tmp_path, old, new)


def test_skeleton_for_new_names(tmp_path):
    text = stubcheck.STUB.read_text().replace("def checkpoint_copy_ops_per_batch(", "def _gone(")
    path = tmp_path / "_C.pyi"
    path.write_text(text)
    assert "def checkpoint_copy_ops_per_batch(max_num_seqs: Any) -> Any: ..." in stubcheck.skeleton(_C, path)


def test_stub_and_marker_ship_beside_the_module():
    pkg = Path(_C.__file__).parent
    assert (pkg / "_C.pyi").is_file() and (pkg / "py.typed").is_file()


def test_every_public_function_in_the_stub_has_a_docstring():
    missing = [
        name
        for name, e in stubcheck.stub_entries().items()
        if e.kind in ("function", "method", "static") and e.doc is None and not name.rsplit(".", 1)[-1].startswith("__")
    ]
    assert missing == []


def _mypy(*args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy is not installed here (.ci/run installs it)")
    # from the checkout root: the config's `files` are relative to it
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "pyproject.toml",
            "--cache-dir",
            str(ROOT / "build" / "mypy-cache"),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_mypy_strict_passes():
    r = _mypy()
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_catches_misuse(tmp_path):
    bad = tmp_path / "misuse.py"
    bad.write_text(
        "import statecache as sc\n"
        "pool = sc.StateSlotPool(4, sc.StateTransfer.fork(2))\n"
        "n: str = pool.num_free()\n"  # returns int
        "pool.pop_many('two')\n"  # not an int
        "spec = sc.PagedStateCheckpointSpec(page_unit_bytes=1, slot_bytes=1, layout_id='x',"
        " image_bytes=1)\n"
        "op = sc.PageUnitCheckpointStore(sc.BlockPool(4), spec).begin_store(1, 0)\n"
        "print(op.unit_ids)\n"  # op may be None
        "sc.StateSlotPol(4)\n"  # typo
    )
    r = _mypy(str(bad))
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    for line in (3, 4, 7, 8):
        assert f"misuse.py:{line}: error" in out, out


def _code_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def test_readme_and_docs_examples_are_the_checked_ones():
    blocks = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks += re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert len(blocks) >= 4
    examples = _code_lines(EXAMPLES.read_text())
    for block in blocks:
        lines = _code_lines(block)
        # each README block appears, in order, inside api/test_typing_examples.py
        pos = 0
        for ln in lines:
            assert ln in examples[pos:], f"README line not in {EXAMPLES.name}: {ln}"
            pos = examples.index(ln, pos) + 1
    ast.parse(EXAMPLES.read_text())


def _public_callables() -> list[tuple[str, object]]:
    out = []
    for name in dir(_C):
        obj = getattr(_C, name)
        if name.startswith("__"):
            continue
        if isinstance(obj, type):
            for mname, value in vars(obj).items():
                if mname.startswith("_") and mname != "__init__":
                    continue
                if callable(value) or isinstance(value, staticmethod):
                    if mname == "__init__" and type(value).__name__ == "wrapper_descriptor":
                        continue  # no constructor from Python
                    out.append((f"{name}.{mname}", getattr(obj, mname)))
        elif callable(obj) and not isinstance(obj, type):
            out.append((name, obj))
    return out


def test_inspect_signature_works_on_every_public_callable():
    import inspect

    found = _public_callables()
    assert len(found) > 150
    failed = []
    for qualname, fn in found:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as e:
            failed.append(f"{qualname}: {e}")
            continue
        if "." in qualname and not isinstance(
            inspect.getattr_static(_C, qualname.split(".")[0]).__dict__[qualname.split(".")[1]],
            staticmethod,
        ):
            assert next(iter(sig.parameters)) == "self", (qualname, sig)
    assert failed == [], "\n".join(failed)


def test_signatures_of_bound_methods_and_their_calls():
    import inspect

    pool = _C.BlockPool(4)
    assert str(inspect.signature(pool.allocate)) == "(count)"
    assert str(inspect.signature(_C.BlockPool.allocate)) == "(self, count)"
    assert str(inspect.signature(_C.StateTransfer.fork)) == "(tokens, readable_midstep=False)"
    slots = _C.StateSlotPool(2, _C.StateTransfer.fork(1))
    assert str(inspect.signature(slots.has_free)) == "(count=1)"  # a fast-call method
    assert str(inspect.signature(_C.StateSlotPool.__init__)) == (
        "(self, num_slots, transfer=None, hash_block_size=1, enabled=True)"
    )
    assert str(inspect.signature(_C.BlockPool)) == "(num_blocks, on_evict=None)"  # the class
    # calls through the signed functions behave as before: values, keywords, errors
    assert pool.allocate(count=2) == [0, 1]
    with pytest.raises(TypeError, match="count"):
        pool.allocate("two")
    assert not _C.BlockPool.allocate.__doc__.startswith("allocate(")  # the signature moved
    eq = inspect.signature(_C.StateTransfer.__eq__) if "__eq__" in vars(_C.StateTransfer) else None
    if eq is not None:
        assert [p.kind for p in eq.parameters.values()][-1] is inspect.Parameter.POSITIONAL_ONLY


def test_every_public_method_says_what_it_returns_and_raises():
    gaps = stubcheck.cxx_docstring_gaps(_C)
    assert gaps == [], "\n".join(gaps)


def test_python_layers_say_what_they_return_and_raise():
    gaps = stubcheck.python_docstring_gaps()
    assert gaps == [], "\n".join(gaps)
    assert stubcheck.python_docstring_gaps({"statecache.tiers.servers": ["ServerProcess"]}) != []


def test_stub_docstrings_are_the_modules():
    drift = stubcheck.docstring_drift(_C)
    hint = "\nrun python tests/python/stubcheck.py --sync-docs after changing a C++ docstring"
    assert drift == [], "\n".join(drift) + hint


def test_the_docs_check_fails_on_gaps_and_drift(tmp_path):
    import types

    fake = types.ModuleType("fake")

    def quiet(x):
        """quiet(x) -> int

        Returns x."""

    def silent(x):
        """Raises nothing."""

    fake.quiet, fake.silent = quiet, silent
    assert stubcheck.cxx_docstring_gaps(fake) == [
        "quiet: does not say what it raises",
        "silent: does not say what it returns",
    ]
    text = stubcheck.STUB.read_text()
    old = "Returns how many indices are free (vacant or checkpointed)."
    assert old in text
    path = tmp_path / "_C.pyi"
    path.write_text(text.replace(old, "Returns the free count.", 1))
    drift = stubcheck.docstring_drift(_C, path)
    assert any(line.split(":")[0].endswith("Pool.num_free") for line in drift), drift
    # and --sync-docs repairs it
    assert stubcheck.sync_docs(_C, path) == 1
    assert stubcheck.docstring_drift(_C, path) == []
