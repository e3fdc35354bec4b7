"""Root runs no program found on PATH that another user owns or can write (or whose directory
they can write): the one trust rule of core/fsutil, at every place a program is looked up by name
(the Command backend, the MPS control program, iperf3, the collectors' ethtool/journalctl/ping)."""
import os
import pwd
import subprocess
import sys

import pytest

from hkgpu_tune.backends.command import Command
from hkgpu_tune.backends.mps import MpsControl
from hkgpu_tune.core.errors import HkError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is root's: needs root")
NOBODY = pwd.getpwnam("nobody").pw_uid


def stand_in(d, name, marker, mode=0o755, owner=0):
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(f"#!/bin/sh\ntouch {marker}\necho ran\n")
    os.chmod(p, mode)
    os.chown(p, owner, owner)
    return p


@pytest.fixture(params=["dir-writable", "file-writable", "file-owned"])
def hostile(request, tmp_path):
    """A directory put first on PATH that holds a program root must refuse, and the marker it leaves."""
    d, marker = tmp_path / "bin", tmp_path / "ran"
    kind = request.param
    yield d, marker, lambda name: stand_in(
        d, name, marker, mode=0o777 if kind == "file-writable" else 0o755,
        owner=NOBODY if kind == "file-owned" else 0), kind
    assert not marker.exists(), f"root ran a program another user controls ({kind})"


def on_path(monkeypatch, d):
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")


def test_the_command_backend_refuses(monkeypatch, hostile):
    d, marker, make, kind = hostile
    make("ethtool")
    if kind == "dir-writable":
        os.chmod(d, 0o777)
    on_path(monkeypatch, d)
    with pytest.raises(HkError, match="refused"):
        Command().run(["ethtool", "--version"])


def test_the_mps_control_program_is_refused(monkeypatch, hostile):
    d, marker, make, kind = hostile
    make("nvidia-cuda-mps-control")
    if kind == "dir-writable":
        os.chmod(d, 0o777)
    on_path(monkeypatch, d)
    with pytest.raises(HkError, match="refused"):
        MpsControl()._exe()


def test_baseline_serve_refuses_an_iperf3_another_user_controls(hostile):
    d, marker, make, kind = hostile
    make("iperf3")
    if kind == "dir-writable":
        os.chmod(d, 0o777)
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "baseline", "serve", "--bind", "127.0.0.1",
                        "--port", "5398", "--seconds", "2"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": f"{d}:{os.environ['PATH']}"})
    assert p.returncode == 1 and "refused" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_trusted_program_on_path_runs(monkeypatch, tmp_path):
    """The control: the same program, root's own in a directory only root writes, is run."""
    marker = tmp_path / "ran"
    stand_in(tmp_path / "bin", "ethtool", marker)
    on_path(monkeypatch, tmp_path / "bin")
    assert Command().run(["ethtool", "--version"]).out == "ran\n"
    assert marker.exists()


def test_baseline_capture_never_runs_a_trtexec_another_user_controls(monkeypatch, hostile, tmp_path):
    """The engine bench of `baseline capture` with a plan named: trtexec is looked up by name; a
    hostile one first on PATH is skipped (the bench falls back, the marker is never made)."""
    from types import SimpleNamespace

    from hkgpu_tune.baseline import engine_bench
    from hkgpu_tune.serve.repository.tensorrt import trtexec_path
    d, marker, make, kind = hostile
    make("trtexec")
    if kind == "dir-writable":
        os.chmod(d, 0o777)
    on_path(monkeypatch, d)
    assert trtexec_path() is None or not trtexec_path().startswith(str(d))
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"plan")
    engine_bench.run(SimpleNamespace(plan=str(plan), batch=1), quick=False)


@pytest.mark.slow
@pytest.mark.parametrize("prog", ["as", "ld"])
def test_the_hkbatch_build_never_runs_an_assembler_or_linker_another_user_controls(monkeypatch, hostile, prog):
    """The compiler driver runs `as` and `ld` from PATH where its own directories lack them: the
    build runs with a PATH of system directories only, and what the driver resolves passes the
    trust rule. A hostile one first on the caller's PATH is never run."""
    from hkgpu_tune.serve.repository import batch_backend
    d, marker, make, kind = hostile
    make(prog)
    if kind == "dir-writable":
        os.chmod(d, 0o777)
    on_path(monkeypatch, d)
    batch_backend.compiler.cache_clear()
    cxx = batch_backend.compiler()
    if cxx is None:
        pytest.skip("no C++ compiler with a static libstdc++ here")
    assert batch_backend.toolchain_refusal(cxx) is None     # the system's own as and ld
    out = d.parent / "built"
    batch_backend.install(str(out))
    assert (out / batch_backend.LIBRARY).exists()


def test_a_driver_that_resolves_an_untrusted_assembler_is_not_used(tmp_path):
    """The driver's own answer (-print-prog-name) is checked: one that names an assembler another
    user can write is refused."""
    from hkgpu_tune.serve.repository import batch_backend
    d = tmp_path / "tc"
    d.mkdir()
    os.chmod(tmp_path, 0o755)
    asm = d / "as"
    asm.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(asm, 0o777)
    drv = d / "c++"
    drv.write_text(f"#!/bin/sh\ncase \"$1\" in -print-prog-name=as) echo {asm};; *) echo ld;; esac\n")
    os.chmod(drv, 0o755)
    assert "writable by other users" in batch_backend.toolchain_refusal(str(drv))
