"""Files the tool writes besides its state (the Prometheus textfile, the JUnit report, systemd
units) go through fsutil.atomic_write: a link planted where the temporary file goes is never
followed, and a destination that is a link or not a regular file is refused in one line."""
import os

import pytest

from hkgpu_tune.backends.systemd import Systemd
from hkgpu_tune.core.errors import HkError

from .test_cli import hk, no_traceback, ok_profile  # noqa: F401  (fixture)


@pytest.mark.parametrize("opt,name", [("--prometheus", "m.prom"), ("--junit", "j.xml")])
def test_a_link_where_the_report_temp_file_goes_is_not_followed(tmp_path, ok_profile, opt, name):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    out = tmp_path / name
    os.symlink(victim, f"{out}.tmp")
    p = hk("verify", "-p", ok_profile, opt, str(out))
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "keep\n" and "kernel.ostype" in out.read_text()
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".")] == []


@pytest.mark.parametrize("kind", ["link", "dir"])
def test_a_report_path_that_is_not_a_regular_file_is_refused(tmp_path, ok_profile, kind):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    out = tmp_path / "m.prom"
    os.symlink(victim, out) if kind == "link" else out.mkdir()
    p = hk("verify", "-p", ok_profile, "--prometheus", str(out))
    no_traceback(p)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and str(out) in p.stderr, p.stderr
    assert victim.read_text() == "keep\n" and (out.is_symlink() if kind == "link" else out.is_dir())


def test_a_unit_file_is_written_without_following_a_planted_link(tmp_path):
    sd = Systemd(root=str(tmp_path))
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    path = sd.unit_path("hk-test.service")
    os.makedirs(os.path.dirname(path))
    os.symlink(victim, path + ".tmp")
    sd.write_unit("hk-test.service", "[Service]\nExecStart=/bin/true\n")
    assert victim.read_text() == "keep\n" and sd.read_unit("hk-test.service").startswith("[Service]")
    assert os.stat(path).st_mode & 0o777 == 0o644
    os.unlink(path)
    os.symlink(victim, path)
    with pytest.raises(HkError, match="refusing to replace it: it is a link"):
        sd.write_unit("hk-test.service", "[Service]\n")
    assert victim.read_text() == "keep\n"
