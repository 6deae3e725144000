#!/usr/bin/env python3
"""Writes python/statecache/_C.pyi from the built statecache._C.

The module gives each name, its kind (class, function, method, static method,
attribute), its parameters (names, defaults, positional-only / keyword-only:
the text signatures signatures.cpp and fast::def install) and every docstring
(written once, in docs/api.md, which the build embeds). .ci/stub_types.py adds
what the runtime cannot say: the types, and the aliases, Protocols and
TypedDicts they use.

    python3 .ci/stubgen.py          # rewrite the stub
    python3 .ci/stubgen.py --check  # exit 1, with a diff, when the committed stub differs
    (--stub PATH: another stub file than python/statecache/_C.pyi)

Fails (exit 2) when the table and the module disagree: a name or parameter
without a type, a type for a name or parameter the module lacks.
"""

from __future__ import annotations

import difflib
import inspect
import json
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
STUB = HERE.parent / "python" / "statecache" / "_C.pyi"
WIDTH = 120  # ruff's line length (pyproject.toml)
DOC_WIDTH = 100

# Dunders the stub types where a class defines them itself (the rest, such as
# __repr__ or __new__, it leaves to object's).
DUNDERS = {
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
}
# Slot wrappers CPython gives a plain type (a value type's __eq__, say) are
# typed only where the table names them.
_SLOT_WRAPPERS = ("wrapper_descriptor", "method-wrapper")


class StubError(Exception):
    """The table and the module disagree (each line one disagreement)."""


def _doc(obj: Any) -> str | None:
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    return doc


def _docstring(doc: str | None, indent: str) -> list[str]:
    """`doc` as docstring lines: paragraphs re-wrapped, blank lines kept."""
    if doc is None:
        return []
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)) if p.strip()]
    out: list[str] = []
    for i, p in enumerate(paragraphs):
        p = p.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        if i:
            out.append("")
        out += textwrap.wrap(p, width=DOC_WIDTH - len(indent), break_on_hyphens=False, break_long_words=False)
    if out[-1].endswith('"'):
        out[-1] += " "
    lines = [f'{indent}"""{out[0]}'] + [(indent + ln) if ln else "" for ln in out[1:]]
    lines[-1] += '"""'
    return lines


def _comment(doc: str | None, indent: str) -> list[str]:
    if doc is None:
        return []
    text = " ".join(inspect.cleandoc(doc).split())
    return [f"{indent}#: {ln}" for ln in textwrap.wrap(text, width=DOC_WIDTH - len(indent) - 3)]


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, tuple) and all(isinstance(v, (int, str, type(None))) for v in value):
        return "(" + ", ".join(_literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return "..."


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _parse_spec(spec: str) -> tuple[list[tuple[str, str]], str]:
    """The spec "a: T, b: U -> R" as ([(a, T), (b, U)], R)."""
    head, arrow, ret = spec.rpartition("->")
    if not arrow:
        raise ValueError(f"no '-> return type' in {spec!r}")
    params = []
    for item in _split_top(head):
        name, colon, typ = item.partition(":")
        if not colon:
            raise ValueError(f"{item!r} in {spec!r} is not 'name: type'")
        params.append((name.strip(), typ.strip()))
    return params, ret.strip()


def _def_lines(indent: str, name: str, params: list[str], ret: str, body: list[str]) -> list[str]:
    one = f"{indent}def {name}({', '.join(params)}) -> {ret}:"
    if not body:
        one += " ..."
    if len(one) <= WIDTH:
        head = [one]
    else:
        head = [f"{indent}def {name}("] + [f"{indent}    {p}," for p in params] + [f"{indent}) -> {ret}:"]
        if not body:
            head[-1] += " ..."
    return head + body


class _Generator:
    def __init__(self, mod: ModuleType, table: ModuleType) -> None:
        self.mod, self.t = mod, table
        self.errors: list[str] = []

    def error(self, text: str) -> None:
        self.errors.append(text)

    # ---- callables ----

    def params(self, qualname: str, fn: Any, spec: str, drop_self: bool) -> tuple[list[str], str] | None:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as e:
            self.error(f"{qualname}: no signature to read ({e})")
            return None
        try:
            typed, ret = _parse_spec(spec)
        except ValueError as e:
            self.error(f"{qualname}: {e}")
            return None
        runtime = list(sig.parameters.values())
        if drop_self and runtime and runtime[0].name == "self":
            runtime = runtime[1:]
        names = {p.name for p in runtime}
        # Positional-only parameters (pybind11 calls unnamed ones arg0, arg1...)
        # take the table's names not in the module, in order.
        renames = iter(n for n, _ in typed if n not in names)
        given = dict(typed)
        out = ["self"] if drop_self else []
        used = set()
        kinds = inspect.Parameter
        for i, p in enumerate(runtime):
            if p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD):
                self.error(f"{qualname}: takes {p}; give its overloads as a list")
                return None
            name = p.name
            if p.kind is kinds.POSITIONAL_ONLY and name not in given:
                name = next(renames, name)
            typ = given.get(name) or self.t.PARAM_TYPES.get(name)
            if typ is None:
                self.error(f"{qualname}: no type for parameter {name!r} (in .ci/stub_types.py)")
                typ = "Any"
            used.add(name)
            if p.kind is kinds.KEYWORD_ONLY and (i == 0 or runtime[i - 1].kind is not kinds.KEYWORD_ONLY):
                out.append("*")
            text = f"{name}: {typ}"
            if p.default is not kinds.empty:
                text += f" = {_literal(p.default)}"
            out.append(text)
            if p.kind is kinds.POSITIONAL_ONLY and (i + 1 == len(runtime) or runtime[i + 1].kind is not p.kind):
                out.append("/")
        for n in given:
            if n not in used:
                self.error(f"{qualname}: the table types parameter {n!r}, which the module does not have")
        return out, ret

    def function(self, indent: str, qualname: str, name: str, fn: Any, spec: Any, kind: str) -> list[str]:
        deco = [f"{indent}@staticmethod"] if kind == "static" else []
        if isinstance(spec, list):  # overloads: as written
            out = []
            for sig in spec:
                out += deco + [f"{indent}@overload", f"{indent}def {name}{sig}: ..."]
            return out
        got = self.params(qualname, fn, spec, drop_self=kind == "method")
        if got is None:
            return []
        params, ret = got
        doc = None if type(fn).__name__ in _SLOT_WRAPPERS else _doc(fn)
        return deco + _def_lines(indent, name, params, ret, _docstring(doc, indent + "    "))

    # ---- attributes ----

    def data(self, indent: str, qualname: str, name: str, value: Any, spec: str) -> list[str]:
        doc = _doc(value) if isinstance(value, property) or type(value).__name__ == "getset_descriptor" else None
        if spec.startswith(":"):
            return _comment(doc, indent) + [f"{indent}{name}{spec}"]
        getter, _, setter = spec.partition("; set:")
        if not getter.startswith("->"):
            self.error(f"{qualname}: an attribute's type is ': T' or '-> T' (read-only) or '-> T; set: U'")
            return []
        out = [f"{indent}@property"] + _def_lines(
            indent, name, ["self"], getter[2:].strip(), _docstring(doc, indent + "    ")
        )
        if setter:
            out += [f"{indent}@{name}.setter", f"{indent}def {name}(self, value: {setter.strip()}) -> None: ..."]
        return out

    # ---- classes ----

    def klass(self, name: str, cls: type, specs: dict[str, Any]) -> list[str]:
        bases = [b.__name__ for b in cls.__bases__ if b.__name__ not in ("object", "pybind11_object")]
        out = [f"class {name}" + (f"({', '.join(bases)})" if bases else "") + ":"]
        doc = _docstring(_doc(cls), "    ")
        out += doc
        body: list[str] = []
        members = vars(cls)
        for mname, value in members.items():
            slot = type(value).__name__ in _SLOT_WRAPPERS
            wanted = mname in specs or (
                not slot and (not mname.startswith("_") or (mname in DUNDERS and value is not None))
            )
            if not wanted:
                continue
            qual = f"{name}.{mname}"
            spec = specs.get(mname)
            if spec is None:
                self.error(f"{qual}: no type (add it to CLASSES[{name!r}] in .ci/stub_types.py)")
                continue
            if isinstance(value, staticmethod):
                body += self.function("    ", qual, mname, value.__func__, spec, "static")
            elif isinstance(value, property) or type(value).__name__ == "getset_descriptor":
                body += self.data("    ", qual, mname, value, spec)
            elif callable(value):
                body += self.function("    ", qual, mname, value, spec, "method")
            else:
                body += self.data("    ", qual, mname, value, spec)
        for mname in specs:
            if mname not in members:
                self.error(f"{name}.{mname}: typed in .ci/stub_types.py but not in the module")
        if doc and body:
            out.append("")
        return out + (body or ([] if doc else ["    ..."]))

    # ---- module ----

    def run(self) -> str:
        t, mod = self.t, self.mod
        consts: list[str] = []
        data: list[str] = []
        funcs: list[list[str]] = []
        classes: list[list[str]] = []
        names = {n: v for n, v in vars(mod).items() if not n.startswith("__")}
        for name, value in names.items():
            if inspect.isclass(value):
                if name.startswith("_") and name not in t.CLASSES:
                    continue
                if name not in t.CLASSES:
                    self.error(f"{name}: a class the table does not type (add CLASSES[{name!r}])")
                    continue
                block = self.klass(name, value, t.CLASSES[name])
                if name not in t.GPU_ONLY:
                    classes.append(block)
                elif "\n".join(block) != t.GPU_ONLY[name].strip("\n"):
                    # written where the CPU build puts it (last), so both builds give one file
                    self.error(
                        f"{name}: GPU_ONLY[{name!r}] in .ci/stub_types.py is not what this build generates:\n"
                        + "\n".join(block)
                    )
            elif callable(value):
                if name.startswith("_") and name not in t.FUNCTIONS:
                    continue
                if name not in t.FUNCTIONS:
                    self.error(f"{name}: no type (add FUNCTIONS[{name!r}] to .ci/stub_types.py)")
                    continue
                funcs.append(self.function("", name, name, value, t.FUNCTIONS[name], "function"))
            elif name in t.DATA:
                data += _comment(t.DATA_DOCS.get(name), "") + [f"{name}: {t.DATA[name]}"]
            elif isinstance(value, str) and not name.startswith("_"):
                consts.append(f"{name}: Final = {_literal(value)}")
            elif not name.startswith("_"):
                self.error(f"{name}: module attribute of type {type(value).__name__} without a type (DATA)")
        for table, what in ((t.CLASSES, "class"), (t.FUNCTIONS, "function"), (t.DATA, "attribute")):
            for name in table:
                if name not in names and name not in t.GPU_ONLY:
                    self.error(f"{name}: a {what} typed in .ci/stub_types.py but not in the module")
        if self.errors:
            raise StubError("\n".join(self.errors))
        gpu = [t.GPU_ONLY[n].strip("\n").splitlines() for n in t.GPU_ONLY]
        blocks = [t.PRELUDE.strip("\n").splitlines(), consts + [""] + data] + funcs + classes + gpu
        return "\n\n".join("\n".join(b) for b in blocks) + "\n"


def generate(mod: ModuleType, table: ModuleType | None = None) -> str:
    """The stub text for `mod`; StubError when the table and it disagree."""
    if table is None:
        sys.path.insert(0, str(HERE))
        import stub_types as table
    return _Generator(mod, table).run()


def check(text: str, path: Path = STUB) -> list[str]:
    """The unified diff from the stub at `path` to `text` (empty: the same)."""
    old = path.read_text() if path.exists() else ""
    return list(difflib.unified_diff(old.splitlines(True), text.splitlines(True), str(path), "generated"))


def main(argv: list[str]) -> int:
    from statecache import _C

    try:
        text = generate(_C)
    except StubError as e:
        print(f"stubgen: the table and statecache._C disagree:\n{e}", file=sys.stderr)
        return 2
    stub = Path(argv[argv.index("--stub") + 1]) if "--stub" in argv else STUB
    if "--check" in argv:
        diff = check(text, stub)
        if diff:
            sys.stdout.writelines(diff)
            print(f"\n{stub} is not what the bindings generate: run python3 .ci/stubgen.py", file=sys.stderr)
            return 1
        print(f"{stub.name} matches the bindings")
        return 0
    stub.write_text(text)
    print(f"wrote {stub}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
