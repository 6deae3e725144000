"""Compares python/statecache/_C.pyi with the built statecache._C.

pybind11 functions carry their signature in the first docstring line (or a
``__text_signature__`` for the fast-call ones), so stubtest sees little; this
reads both sides itself: names, kinds (method / static / data), parameters
(names, positional-only / keyword-only, which have defaults, literal default
values). Types are not compared (the runtime says ``object``).

    python tests/python/stubcheck.py             # differences, exit 1 if any
    python tests/python/stubcheck.py --skeleton  # stub lines for new names
    python tests/python/stubcheck.py --docs      # docstrings to complete, or stub ones that drifted
    python tests/python/stubcheck.py --sync-docs # stub docstrings rewritten from the C++ ones
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

STUB = Path(__file__).resolve().parents[2] / "python" / "statecache" / "_C.pyi"

# Dunders a stub must mirror where the runtime class defines them itself.
DUNDERS = (
    "__init__",
    "__len__",
    "__getitem__",
    "__setitem__",
    "__iter__",
    "__contains__",
    "__eq__",
    "__hash__",
    "__bool__",
    "__getstate__",
    "__setstate__",
    "__reduce__",
)
# Present only in builds with GPU kernels.
GPU_ONLY = {"GpuCopyEngine"}

_NO_DEFAULT = object()
_UNKNOWN = object()  # a default whose value cannot be read as a literal


@dataclass
class Param:
    name: str
    kind: str  # "posonly", "pos", "kwonly", "var"
    default: Any = _NO_DEFAULT

    def key(self) -> tuple:
        has = self.default is not _NO_DEFAULT
        return (None if self.kind == "posonly" else self.name, self.kind, has)


@dataclass
class Entry:
    kind: str  # "class", "function", "method", "static", "data"
    params: list[Param] | None = None  # None: not compared (overloads, *args)
    doc: str | None = None


# ------------------------------------------------------------------- stub --


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return _NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except ValueError:
        return _UNKNOWN


def _stub_params(fn: ast.FunctionDef, drop_self: bool) -> list[Param]:
    a = fn.args
    positional = [(p, "posonly") for p in a.posonlyargs] + [(p, "pos") for p in a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [Param(p.arg, kind, _literal(d)) for (p, kind), d in zip(positional, defaults)]
    if a.vararg is not None:
        out.append(Param(a.vararg.arg, "var"))
    out += [Param(p.arg, "kwonly", _literal(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg is not None:
        out.append(Param(a.kwarg.arg, "var"))
    if drop_self and out and out[0].name in ("self", "cls"):
        out = out[1:]
    return out


def _decorators(fn: ast.FunctionDef) -> set[str]:
    names = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Name):
            names.add(d.id)
        elif isinstance(d, ast.Attribute):
            names.add(d.attr)
    return names


def _members(body: list[ast.stmt], in_class: bool) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef):
            decs = _decorators(node)
            if "setter" in decs:
                continue
            doc = ast.get_docstring(node)
            if "overload" in decs:
                out[node.name] = Entry("static" if "staticmethod" in decs else "method", None, doc)
                continue
            if "property" in decs:
                out[node.name] = Entry("data", None, doc)
            elif "staticmethod" in decs:
                out[node.name] = Entry("static", _stub_params(node, False), doc)
            else:
                out[node.name] = Entry("method" if in_class else "function", _stub_params(node, in_class), doc)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = Entry("data")
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = Entry("data")
        elif isinstance(node, ast.ClassDef):
            out[node.name] = Entry("class", None, ast.get_docstring(node))
            for name, e in _members(node.body, True).items():
                out[f"{node.name}.{name}"] = e
    return out


def stub_entries(path: Path = STUB) -> dict[str, Entry]:
    """Public names of the stub (module level and ``Class.member``)."""
    tree = ast.parse(path.read_text(), str(path))
    entries = _members(tree.body, False)
    return {k: v for k, v in entries.items() if _is_public(k)}


def _is_public(qualname: str) -> bool:
    parts = qualname.split(".")
    if parts[0].startswith("_"):
        return False
    return len(parts) == 1 or not parts[1].startswith("_") or parts[1] in DUNDERS


# ---------------------------------------------------------------- runtime --


def _split_top(text: str) -> list[str]:
    parts, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def _doc_signature(name: str, doc: str | None) -> list[Param] | None:
    """Parameters from pybind11's ``name(a: T, b: T = d) -> R`` first line."""
    if not doc:
        return None
    line = doc.strip().splitlines()[0]
    if not line.startswith(name + "("):
        return None
    depth, end = 0, -1
    for i, ch in enumerate(line[len(name) :], start=len(name)):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                end = i
                break
    if end < 0:
        return None
    raw = _split_top(line[len(name) + 1 : end])
    out: list[Param] = []
    kind = "pos"
    for item in raw:
        if item == "*":
            kind = "kwonly"
            continue
        if item == "/":
            for p in out:
                p.kind = "posonly"
            continue
        if item.startswith("*"):
            out.append(Param(item.lstrip("*").split(":")[0].strip(), "var"))
            continue
        pname, _, rest = item.partition(":")
        default: Any = _NO_DEFAULT
        if "=" in rest:
            text = rest.split("=", 1)[1].strip()
            try:
                default = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                default = _UNKNOWN
        pname = pname.split("=")[0].strip()
        # pybind11 names unnamed arguments arg0, arg1, ...: positional only
        out.append(Param(pname, "posonly" if re.fullmatch(r"arg\d+", pname) else kind, default))
    return out


def _runtime_params(name: str, obj: Any, drop_self: bool) -> list[Param] | None:
    doc = getattr(obj, "__doc__", None)
    if doc and "Overloaded function" in doc:
        return None
    params: list[Param] | None = None
    if getattr(obj, "__text_signature__", None):
        try:
            sig = inspect.signature(obj)
        except (ValueError, TypeError):
            sig = None
        if sig is not None:
            kinds = {
                inspect.Parameter.POSITIONAL_ONLY: "posonly",
                inspect.Parameter.POSITIONAL_OR_KEYWORD: "pos",
                inspect.Parameter.KEYWORD_ONLY: "kwonly",
            }
            params = []
            for p in sig.parameters.values():
                default: Any = _NO_DEFAULT
                if p.default is not inspect.Parameter.empty:
                    default = p.default
                params.append(Param(p.name, kinds.get(p.kind, "var"), default))
    if params is None:
        params = _doc_signature(name, doc)
    if params is None:
        return None
    if drop_self and params and params[0].name == "self":
        params = params[1:]
    if any(p.kind == "var" for p in params):
        return None  # (*args, **kwargs): nothing to compare
    return params


def _runtime_kind(value: Any) -> str:
    if isinstance(value, staticmethod):
        return "static"
    if isinstance(value, property) or type(value).__name__ == "getset_descriptor":
        return "data"
    if callable(value):
        return "method"
    return "data"


def runtime_entries(mod: ModuleType) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    for name in dir(mod):
        if name.startswith("_"):
            continue
        obj = getattr(mod, name)
        if inspect.isclass(obj):
            out[name] = Entry("class", None, obj.__doc__)
            for mname, value in vars(obj).items():
                if mname.startswith("_") and mname not in DUNDERS:
                    continue
                if mname == "__init__" and type(value).__name__ == "wrapper_descriptor":
                    continue  # no constructor from Python
                if mname == "__hash__" and value is None:
                    out[f"{name}.__hash__"] = Entry("data")
                    continue
                kind = _runtime_kind(value)
                params = None
                doc = getattr(value, "__doc__", None) if kind != "data" else None
                if kind == "method":
                    params = _runtime_params(mname, value, True)
                elif kind == "static":
                    fn = value.__func__
                    doc = fn.__doc__
                    params = _runtime_params(mname, fn, False)
                out[f"{name}.{mname}"] = Entry(kind, params, doc)
        elif callable(obj):
            out[name] = Entry("function", _runtime_params(name, obj, False), obj.__doc__)
        else:
            out[name] = Entry("data")
    return out


# ------------------------------------------------------------- comparison --


def _fmt(params: list[Param] | None) -> str:
    if params is None:
        return "(?)"
    return (
        "("
        + ", ".join(
            ("" if p.kind != "kwonly" else "*")
            + (p.name if p.kind != "posonly" else "<pos>")
            + ("" if p.default is _NO_DEFAULT else "=" + ("..." if p.default is _UNKNOWN else repr(p.default)))
            for p in params
        )
        + ")"
    )


def compare(mod: ModuleType, path: Path = STUB) -> list[str]:
    """Every difference between the stub and the module, one line each."""
    stub, rt = stub_entries(path), runtime_entries(mod)
    problems = []
    gpu = bool(getattr(mod, "has_gpu_kernels", False))
    for name in sorted(set(rt) - set(stub)):
        problems.append(f"missing from the stub: {name} ({rt[name].kind})")
    for name in sorted(set(stub) - set(rt)):
        if not gpu and name.split(".")[0] in GPU_ONLY:
            continue
        problems.append(f"in the stub but not in the module: {name}")
    for name in sorted(set(stub) & set(rt)):
        s, r = stub[name], rt[name]
        if s.kind != r.kind:
            problems.append(f"{name}: the stub has a {s.kind}, the module a {r.kind}")
            continue
        if s.params is None or r.params is None:
            continue
        if [p.key() for p in s.params] != [p.key() for p in r.params]:
            problems.append(f"{name}: stub {_fmt(s.params)} != module {_fmt(r.params)}")
            continue
        for sp, rp in zip(s.params, r.params):
            known = (sp.default, rp.default)
            if _NO_DEFAULT in known or _UNKNOWN in known:
                continue
            if sp.default != rp.default or type(sp.default) is not type(rp.default):
                problems.append(
                    f"{name}: default of {sp.name} is {sp.default!r} in the stub, {rp.default!r} in the module"
                )
    return problems


def skeleton(mod: ModuleType, path: Path = STUB) -> str:
    """Stub lines (types ``Any``) for the module's names the stub lacks."""
    stub, rt = stub_entries(path), runtime_entries(mod)
    lines = []
    for name in sorted(set(rt) - set(stub)):
        e = rt[name]
        owner, _, member = name.rpartition(".")
        indent = "    " if owner else ""
        label = member or name
        if e.kind == "class":
            lines.append(f"class {name}:  # {(e.doc or '').strip().splitlines()[0:1]}")
            continue
        if e.kind == "data":
            lines.append(f"{indent}{label}: Any  # in {owner or 'module'}")
            continue
        params = e.params or []
        args = (["self"] if e.kind == "method" else []) + [
            f"{p.name}: Any" + ("" if p.default is _NO_DEFAULT else " = ...") for p in params
        ]
        deco = f"{indent}@staticmethod\n" if e.kind == "static" else ""
        lines.append(f"{deco}{indent}def {label}({', '.join(args)}) -> Any: ...  # in {owner or 'module'}")
    return "\n".join(lines)


def cxx_docstring_gaps(mod: ModuleType) -> list[str]:
    """Public runtime functions and methods whose C++ docstring is missing or
    does not say what the call returns and what it raises."""
    out = []
    for name, e in sorted(runtime_entries(mod).items()):
        if e.kind not in ("method", "static", "function") or name.rsplit(".", 1)[-1].startswith("__"):
            continue
        body = (e.doc or "").strip()
        first = body.splitlines()[0] if body else ""
        if first.startswith(name.rsplit(".", 1)[-1] + "("):
            body = "\n".join(body.splitlines()[1:]).strip()
        out += _says_returns_and_raises(name, body)
    return out


def _documented(mod: ModuleType) -> dict[str, str]:
    """Runtime docstring bodies (signature line dropped) of the public
    functions and methods, by qualified name."""
    out = {}
    for name, e in runtime_entries(mod).items():
        member = name.rsplit(".", 1)[-1]
        if e.kind not in ("method", "static", "function") or member.startswith("__"):
            continue
        lines = (e.doc or "").strip().splitlines()
        if lines and lines[0].startswith(member + "("):
            lines = lines[1:]
        out[name] = "\n".join(lines).strip()
    return out


def _words(text: str | None) -> str:
    return " ".join((text or "").split())


def docstring_drift(mod: ModuleType, path: Path = STUB) -> list[str]:
    """Public functions and methods whose stub docstring says something other
    than the C++ one (whitespace aside)."""
    stub = stub_entries(path)
    return [
        f"{name}: stub {_words(stub[name].doc)!r} != module {_words(doc)!r}"
        for name, doc in sorted(_documented(mod).items())
        if name in stub and _words(stub[name].doc) != _words(doc)
    ]


def sync_docs(mod: ModuleType, path: Path = STUB) -> int:
    """Rewrites the stub's function and method docstrings from the module's;
    returns how many changed."""
    import textwrap

    docs = _documented(mod)
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    edits = []  # (first line, last line, new lines), 0-based inclusive

    def visit(body: list[ast.stmt], owner: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{node.name}.")
            elif isinstance(node, ast.FunctionDef) and ast.get_docstring(node) is not None:
                want = docs.get(owner + node.name)
                if not want or _words(want) == _words(ast.get_docstring(node)):
                    continue
                doc = node.body[0]
                indent = " " * doc.col_offset
                flat = _words(want).replace('"' * 3, "'" * 3)
                wrapped = textwrap.wrap(flat, width=88 - len(indent), break_on_hyphens=False)
                block = [f'{indent}"""{wrapped[0]}'] + [indent + w for w in wrapped[1:]]
                block[-1] += '"""'
                end = doc.end_lineno if doc.end_lineno is not None else doc.lineno
                edits.append((doc.lineno - 1, end - 1, [b + "\n" for b in block]))

    visit(ast.parse(text).body, "")
    for first, last, new in sorted(edits, reverse=True):
        lines[first : last + 1] = new
    path.write_text("".join(lines))
    return len(edits)


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


def _says_returns_and_raises(name: str, doc: str) -> list[str]:
    if not doc:
        return [f"{name}: no docstring"]
    out = []
    if not re.search(r"\breturns?\b", doc, re.I):
        out.append(f"{name}: does not say what it returns")
    if not re.search(r"\brais(es|e)\b", doc, re.I):
        out.append(f"{name}: does not say what it raises")
    return out


def python_docstring_gaps(api: dict[str, list[str]] = PYTHON_API) -> list[str]:
    """Public methods and functions of the Python layers whose docstring does
    not say what the call returns and what it raises."""
    import importlib

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


def main(argv: list[str]) -> int:
    from statecache import _C

    if "--skeleton" in argv:
        print(skeleton(_C))
        return 0
    if "--docs" in argv:
        gaps = cxx_docstring_gaps(_C) + docstring_drift(_C) + python_docstring_gaps()
        print("\n".join(gaps) if gaps else "every public method says what it returns and raises")
        return 1 if gaps else 0
    if "--sync-docs" in argv:
        print(f"{sync_docs(_C)} stub docstrings rewritten from the module")
        return 0
    problems = compare(_C)
    print("\n".join(problems) if problems else "stub and module agree")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
