"""docs/architecture.md covers every module of the package and every registered subsystem: its
tables are what scripts/module_table.py generates from the package now."""
import importlib.util
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "module_table.py")


def _script():
    spec = importlib.util.spec_from_file_location("module_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_doc_is_current():
    mt = _script()
    with open(mt.DOC, encoding="utf-8") as f:
        text = f.read()
    assert mt.render(text) == text, "docs/architecture.md is not current: run python3 scripts/module_table.py"


def test_every_module_and_subsystem_is_in_the_doc():
    mt = _script()
    with open(mt.DOC, encoding="utf-8") as f:
        text = f.read()
    names = [name for _, name, _ in mt.modules()]
    assert len(names) > 100 and "hkgpu_tune.subsystems.cpufreq" in names
    assert [n for n in names if f"| `{n}` |" not in text] == []
    from hkgpu_tune import subsystems
    assert [n for n in subsystems.ORDER if f"| `{n}` |" not in text] == []


def test_a_new_module_makes_the_doc_stale(tmp_path, monkeypatch):
    mt = _script()
    pkg = tmp_path / "hkgpu_tune"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The package."""\n')
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "new.py").write_text('"""A new module. More words."""\n')
    monkeypatch.setattr(mt, "PKG", str(pkg))
    monkeypatch.setattr(mt, "ROOT", str(tmp_path))
    assert "| core | `hkgpu_tune.core.new` | A new module. |" in mt.module_table()
