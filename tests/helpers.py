"""Shared by the suites that drive real tools over SSH (tests/rack, tests/vm)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# this run's tag: every host-wide name a test creates (namespaces, units, directories outside its
# tmp_path) carries it, so two runs on one machine never share, nor remove, each other's
RUN_TAG = str(os.getpid())


def tagged(base: str) -> str:
    """A host-wide name of this run: base-RUN_TAG."""
    return f"{base}-{RUN_TAG}"


def env_tools_on_path() -> None:
    """The tools of this interpreter's environment (ansible-playbook, ...) even when its bin/ is not
    on PATH (CI runs `$VENV/bin/python -m pytest`)."""
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def sh(*argv, check=True, ns=None, **kw) -> subprocess.CompletedProcess:
    """Run a command (inside network namespace ns when given), output captured."""
    if ns:
        argv = ("ip", "netns", "exec", ns) + argv
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kw)


def missing_tool(tools) -> str:
    """Why the suite cannot run ("" when every tool is there)."""
    for tool in tools:
        if not shutil.which(tool):
            return f"{tool} is not installed (scripts/apt-packages.txt, pip install -e .[test])"
    return ""


def run_testinfra(inventory: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """tests/infra against every host of an Ansible inventory (one test per setting per host)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", REPO,
                           os.path.join(REPO, "tests", "infra"), "--hosts=ansible://all",
                           f"--ansible-inventory={inventory}"],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout)


def role_filters() -> dict:
    """The Jinja filters the collection ships (plugins/filter), by their full names, for tests that
    render a role's templates with plain jinja2 as Ansible would."""
    import glob
    import importlib.util
    out = {}
    for path in sorted(glob.glob(os.path.join(REPO, "collections", "ansible_collections", "hkgpu", "tune", "plugins", "filter", "*.py"))):
        spec = importlib.util.spec_from_file_location(f"_role_filter_{os.path.basename(path)[:-3]}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out.update({f"hkgpu.tune.{k}": v for k, v in mod.FilterModule().filters().items()})
    return out


def processes(match) -> list:
    """Live processes (not zombies) for which match(process) is true. A process may exit at any moment
    of a scan (psutil raises NoSuchProcess, or AccessDenied for a pid reused by another user): such a
    process is not a match. Every test that scans the machine's processes goes through here."""
    import psutil
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and match(p):
                out.append(p)
        except psutil.Error:
            continue
    return out


def gone(pid: int, started: float | None = None) -> bool:
    """The process exited: no such pid, a zombie its parent has not reaped yet, or (with `started`, its
    psutil create_time) a pid the kernel has since given to another process. Never raises for a
    process that exits while it is read."""
    import psutil
    try:
        p = psutil.Process(pid)
        return p.status() == psutil.STATUS_ZOMBIE or (started is not None and p.create_time() != started)
    except psutil.NoSuchProcess:   # ZombieProcess too (a subclass): exited
        return True
    except psutil.AccessDenied:    # there, and not ours to read: alive
        return False
