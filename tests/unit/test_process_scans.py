"""A scan of the machine's processes tolerates a process that exits in the middle of it (psutil raises
NoSuchProcess, or AccessDenied for a reused pid). Read with Python's ast: in the package every loop
over psutil.process_iter() reads each process inside a try that catches psutil's errors; the tests
scan only through tests.helpers.processes, and ask whether a process exited through tests.helpers.gone."""
import ast
import os

from tests.helpers import gone, processes

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def sources(*dirs):
    for d in dirs:
        for top, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(top, f)
                    with open(path) as fh:
                        yield os.path.relpath(path, ROOT), ast.parse(fh.read())


def is_process_iter(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "process_iter"


def guarded(loop: ast.For) -> bool:
    """The loop's body is a try whose handlers catch psutil.Error (or its subclasses, or OSError
    together with NoSuchProcess)."""
    if len(loop.body) != 1 or not isinstance(loop.body[0], ast.Try):
        return False
    caught = set()
    for h in loop.body[0].handlers:
        for n in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]):
            caught.add(ast.unparse(n))
    return "psutil.Error" in caught or "psutil.NoSuchProcess" in caught


def test_every_process_scan_of_the_package_survives_a_vanishing_process():
    bad, seen = [], 0
    for path, tree in sources("hkgpu_tune"):
        for node in ast.walk(tree):
            if isinstance(node, ast.For) and is_process_iter(node.iter):
                seen += 1
                if not guarded(node):
                    bad.append(f"{path}:{node.lineno}")
            elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) and \
                    any(is_process_iter(g.iter) for g in node.generators):
                bad.append(f"{path}:{node.lineno} (a comprehension cannot catch a vanishing process)")
    assert seen >= 2, "no process scan found: the check looks at nothing"
    assert bad == [], bad


def test_the_tests_scan_processes_only_through_the_helper():
    bad = [f"{path}:{node.lineno}" for path, tree in sources("tests", "bench", "scripts")
           if path != os.path.join("tests", "helpers.py")
           for node in ast.walk(tree) if is_process_iter(node)]
    assert bad == [], bad


def test_the_helper_skips_a_process_that_vanishes_mid_scan():
    import psutil
    me = os.getpid()

    def match(p):
        if p.pid != me:
            raise psutil.NoSuchProcess(p.pid)   # what psutil raises for a process gone since listed
        return True
    assert [p.pid for p in processes(match)] == [me]


def test_gone_reads_an_exited_process_without_raising():
    import subprocess
    import psutil
    me = psutil.Process()
    assert not gone(me.pid) and not gone(me.pid, me.create_time())
    assert gone(me.pid, me.create_time() - 1)   # the pid, given to another process since
    p = subprocess.Popen(["true"])
    while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE:   # exited, not reaped yet
        pass
    assert gone(p.pid)
    p.wait()
    assert gone(p.pid)                           # reaped: no such process
