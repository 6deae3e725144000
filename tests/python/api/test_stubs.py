"""The typed API: _C.pyi is what .ci/stubgen.py generates from the built
module (and the check fails on drift), `mypy --strict` passes on the stubs, the
typed modules and the README's examples, the README's examples are the checked
ones, and every public call says what it returns and raises."""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from statecache import _C

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = Path(__file__).with_name("test_typing_examples.py")
sys.path.insert(0, str(ROOT / ".ci"))
import stub_types  # noqa: E402
import stubgen  # noqa: E402


def test_committed_stub_is_the_generated_one():
    diff = stubgen.check(stubgen.generate(_C))
    assert diff == [], "".join(diff[:80]) + "\n_C.pyi is out of date: run python3 .ci/stubgen.py"


def _table(**changes: dict) -> types.ModuleType:
    """A copy of .ci/stub_types.py with some entries replaced (None: removed)."""
    t = types.ModuleType("stub_types_copy")
    for name in ("PRELUDE", "PARAM_TYPES", "FUNCTIONS", "DATA", "DATA_DOCS", "CLASSES", "GPU_ONLY"):
        setattr(t, name, copy.deepcopy(getattr(stub_types, name)))
    for path, value in changes.items():
        *outer, key = path.split("__")
        d = getattr(t, outer[0])
        for k in outer[1:]:
            d = d[k]
        if value is None:
            del d[key]
        else:
            d[key] = value
    return t


@pytest.mark.parametrize(
    "changes,expect",
    [
        ({"CLASSES__BlockPool__allocate": None}, "BlockPool.allocate: no type"),
        ({"PARAM_TYPES__slot": None}, "no type for parameter 'slot'"),
        (
            {"CLASSES__StateSlotPool__has_free": "n: _Int -> bool"},
            "StateSlotPool.has_free: the table types parameter 'n', which the module does not have",
        ),
        ({"CLASSES__BlockPool__reset_prefix_caches": "-> int"}, "BlockPool.reset_prefix_caches: typed"),
        ({"FUNCTIONS__scheduler_hash": None}, "scheduler_hash: no type"),
        ({"CLASSES__HostArena": None}, "HostArena: a class the table does not type"),
    ],
)
def test_the_generator_fails_where_table_and_module_disagree(changes, expect):
    with pytest.raises(stubgen.StubError, match=re.escape(expect)):
        stubgen.generate(_C, _table(**changes))


def test_the_check_fails_on_drift_with_a_diff(tmp_path):
    text = stubgen.STUB.read_text()
    old = "    def pop_many(self, count: _Int) -> list[int]:"
    assert old in text
    path = tmp_path / "_C.pyi"
    path.write_text(text.replace(old, "    def pop_many(self, n: _Int) -> list[int]:", 1))
    diff = "".join(stubgen.check(stubgen.generate(_C), path))
    assert "-    def pop_many(self, n: _Int) -> list[int]:" in diff
    assert "+    def pop_many(self, count: _Int) -> list[int]:" in diff
    # the command CI runs: non-zero with the diff; zero on the committed stub
    env = {**os.environ, "PYTHONPATH": str(Path(_C.__file__).parents[1])}
    cmd = [sys.executable, str(ROOT / ".ci" / "stubgen.py"), "--check"]
    bad = subprocess.run([*cmd, "--stub", str(path)], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1 and "+    def pop_many(self, count" in bad.stdout, bad.stdout + bad.stderr
    good = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert good.returncode == 0, good.stdout + good.stderr


def test_signatures_docstrings_and_kinds_come_from_the_module():
    text = stubgen.generate(_C)
    tree = ast.parse(text)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    pool = {n.name: n for n in classes["StateSlotPool"].body if isinstance(n, ast.FunctionDef)}
    # the module's docstring (docs/api.md), word for word
    assert " ".join(ast.get_docstring(pool["num_free"]).split()) == " ".join(
        inspect.getdoc(_C.StateSlotPool.num_free).split()
    )
    assert " ".join(ast.get_docstring(classes["BlockPool"]).split()) == " ".join(inspect.getdoc(_C.BlockPool).split())
    # defaults and keyword-only markers from the text signatures
    assert "def has_free(self, count: _Int = 1) -> bool:" in text
    assert "def pin(self, slot: _Int, *, reader_is_next_batch: bool = False) -> None:" in text
    # a static method stays one; an unhashable class says so
    fork = next(n for n in classes["StateTransfer"].body if isinstance(n, ast.FunctionDef) and n.name == "fork")
    assert [ast.unparse(d) for d in fork.decorator_list] == ["staticmethod"]
    assert "__hash__: ClassVar[None]" in ast.get_source_segment(text, classes["IntListView"])
    # every public name of the module is in the stub
    stub_names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    stub_names |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert {n for n in vars(_C) if not n.startswith("_")} <= stub_names


def test_stub_and_marker_ship_beside_the_module():
    pkg = Path(_C.__file__).parent
    assert (pkg / "_C.pyi").is_file() and (pkg / "py.typed").is_file()


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
    # pybind11's own function objects carry it (no forwarding builtin in between)
    assert type(vars(_C.BlockPool)["allocate"].__func__.__self__).__name__.startswith("pybind11_detail_function_record")
    eq = inspect.signature(_C.StateTransfer.__eq__) if "__eq__" in vars(_C.StateTransfer) else None
    if eq is not None:
        assert [p.kind for p in eq.parameters.values()][-1] is inspect.Parameter.POSITIONAL_ONLY


def _says_returns_and_raises(name: str, doc: str) -> list[str]:
    if not doc:
        return [f"{name}: no docstring"]
    out = []
    if not re.search(r"\breturns?\b", doc, re.I):
        out.append(f"{name}: does not say what it returns")
    if not re.search(r"\brais(es|e)\b", doc, re.I):
        out.append(f"{name}: does not say what it raises")
    return out


def cxx_docstring_gaps(mod: types.ModuleType) -> list[str]:
    """Public functions and methods of `mod` whose docstring is missing or
    does not say what the call returns and what it raises."""
    out = []
    for name, value in sorted(vars(mod).items()):
        if name.startswith("_"):
            continue
        if inspect.isclass(value):
            for mname, m in vars(value).items():
                if mname.startswith("_") or not (callable(m) or isinstance(m, staticmethod)):
                    continue
                fn = m.__func__ if isinstance(m, staticmethod) else m
                out += _says_returns_and_raises(f"{name}.{mname}", inspect.getdoc(fn) or "")
        elif callable(value):
            out += _says_returns_and_raises(name, inspect.getdoc(value) or "")
    return out


# The Python layers' public API (statecache's lazy names, the metrics and the
# tiers): classes and functions whose docstrings the docs check reads too.
PYTHON_API = {
    "statecache": [
        "StateStoreOperationId",
        "StateLayout",
        "PageLayout",
        "TPShard",
        "StateCopyExecutor",
        "CapturedStateCopy",
        "layout_id",
        "paged_checkpoint_spec",
        "tp_shard_layouts",
    ],
    "statecache.metrics": ["StateCacheMetrics", "hit_rates"],
    "statecache.tiers": ["Tier", "HostTier", "MooncakeTier", "RedisTier", "TierKey"],
}


def python_docstring_gaps(api: dict[str, list[str]] = PYTHON_API) -> list[str]:
    """Public methods and functions of the Python layers whose docstring does
    not say what the call returns and what it raises."""
    out = []
    for modname, names in api.items():
        mod = importlib.import_module(modname)
        for name in names:
            obj = getattr(mod, name)
            fns = []
            if inspect.isclass(obj):
                for mname, value in vars(obj).items():
                    if isinstance(value, (staticmethod, classmethod)):
                        value = value.__func__
                    if not mname.startswith("_") and inspect.isfunction(value):
                        fns.append((f"{modname}.{name}.{mname}", value))
            else:
                fns.append((f"{modname}.{name}", obj))
            for qualname, fn in fns:
                out += _says_returns_and_raises(qualname, inspect.getdoc(fn) or "")
    return out


def test_every_public_method_says_what_it_returns_and_raises():
    gaps = cxx_docstring_gaps(_C)
    assert gaps == [], "\n".join(gaps)


def test_python_layers_say_what_they_return_and_raise():
    gaps = python_docstring_gaps()
    assert gaps == [], "\n".join(gaps)
    assert python_docstring_gaps({"statecache.tiers.servers": ["ServerProcess"]}) != []


def test_the_docs_check_fails_on_gaps():
    fake = types.ModuleType("fake")

    def quiet(x):
        """Returns x."""

    def silent(x):
        """Raises nothing."""

    fake.quiet, fake.silent = quiet, silent
    assert cxx_docstring_gaps(fake) == [
        "quiet: does not say what it raises",
        "silent: does not say what it returns",
    ]
