"""The package's layout stays readable: imports go one way down the layers (docs/architecture.md),
no import cycle between modules (imports inside functions count), no module over 600 lines, and
no string table that names a module of a higher layer ("hkgpu_tune.serve.x:parse" in core/ is an
import up the layers that the import graph cannot see). Read with Python's own ast, not by
importing the package."""
import ast
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "hkgpu_tune")
PKG = "hkgpu_tune"
MAX_LINES = 600
# low -> high: a module may import its own layer and the layers below it
LAYERS = ["core", "backends", "serve", "subsystems", "tune", "observe", "baseline", "fleet", "cli"]
TOP = {PKG, PKG + ".__main__"}   # the package's facade and `python -m hkgpu_tune`


def modules(root=ROOT):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                parts = os.path.relpath(path, os.path.dirname(root))[:-3].split(os.sep)
                ispkg = parts[-1] == "__init__"
                out[".".join(parts[:-1] if ispkg else parts)] = (path, ispkg)
    return out


def imports(mods):
    """module -> {imported module of the package} (from-imports of a submodule resolve to it)."""
    def known(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None
    graph = {}
    for m, (path, ispkg) in mods.items():
        base = m if ispkg else m.rpartition(".")[0]
        edges = set()
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                mod = n.module or ""
                if n.level:
                    b = base.split(".")
                    mod = ".".join(b[: len(b) - n.level + 1] + ([mod] if mod else []))
                targets = [f"{mod}.{a.name}" for a in n.names]
            else:
                continue
            for t in targets:
                if t == PKG or t.startswith(PKG + "."):
                    k = known(t)
                    if k and k != m:
                        edges.add(k)
        graph[m] = edges
    return graph


MODULE_PATH = re.compile(r"hkgpu_tune(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _docstrings(tree):
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def string_refs(mods):
    """module -> {(module of the package a string names, line)}: "hkgpu_tune.x.y" and "hkgpu_tune.x.y:func"
    in any string but a docstring (prose may name a module; a table that imports by name may not)."""
    def known(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None
    out = {}
    for m, (path, _) in mods.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        docs = _docstrings(tree)
        refs = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                for hit in MODULE_PATH.finditer(n.value):
                    k = known(hit.group(0))
                    if k and k != m:
                        refs.add((k, n.lineno))
        out[m] = refs
    return out


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer(m):
    if m in TOP:
        return len(LAYERS)
    part = m.split(".")[1]
    return LAYERS.index(part) if part in LAYERS else None


MODS = modules()
GRAPH = imports(MODS)


def test_every_module_is_in_a_layer():
    loose = sorted(m for m in MODS if layer(m) is None)
    assert not loose, f"modules outside the layers {LAYERS}: {loose} (docs/architecture.md says where they go)"


def test_no_import_cycle():
    assert cycles(GRAPH) == []


def test_imports_go_down_the_layers():
    up = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() for t in ts
                if layer(m) is not None and layer(t) is not None and layer(t) > layer(m))
    assert not up, "imports up the layers:\n" + "\n".join(up)


def test_no_string_names_a_module_up_the_layers():
    """core/profile.py once mapped sections to "hkgpu_tune.serve.schema.services:parse_profile" and
    seven more: a hidden cycle. A lower layer learns of a higher one by registration, never by name."""
    up = sorted(f"{m}:{line} -> {t}" for m, refs in string_refs(MODS).items() for t, line in refs
                if layer(m) is not None and layer(t) is not None and layer(t) > layer(m))
    assert not up, "strings naming modules up the layers:\n" + "\n".join(up)


def test_no_module_over_600_lines():
    big = {}
    for m, (path, _) in MODS.items():
        with open(path, encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            big[m] = n
    assert big == {}


@pytest.mark.parametrize("case, graph, want", [
    ("a cycle through a function-level import", {"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ("no cycle", {"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder(case, graph, want):
    assert cycles(graph) == want


def test_the_reader_sees_imports_inside_functions(tmp_path):
    pkg = tmp_path / PKG
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text("def f():\n    from hkgpu_tune.cli import b\n")
    (pkg / "cli").mkdir()
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "cli" / "b.py").write_text("from ..core import a\n")
    g = imports(modules(str(pkg)))
    assert g["hkgpu_tune.core.a"] == {"hkgpu_tune.cli.b"} and g["hkgpu_tune.cli.b"] == {"hkgpu_tune.core.a"}
    assert cycles(g) == [["hkgpu_tune.cli.b", "hkgpu_tune.core.a"]]


def test_the_string_reader_sees_a_table_and_not_a_docstring(tmp_path):
    pkg = tmp_path / PKG
    for d in ("core", "cli"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "b.py").write_text("def parse(n):\n    return n\n")
    (pkg / "core" / "a.py").write_text('"""Parsed by hkgpu_tune.cli.b, see there."""\n'
                                       'TABLE = {"x": "hkgpu_tune.cli.b:parse"}\n'
                                       'NAME = f"{PKG}.other"\n')
    refs = string_refs(modules(str(pkg)))
    assert refs["hkgpu_tune.core.a"] == {("hkgpu_tune.cli.b", 2)}
