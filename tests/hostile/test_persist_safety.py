"""--persist: nothing from the profile injects lines into /etc/sysctl.d; each file is journalled
(with its hash) before it is written; undo is idempotent and never removes or overwrites a file
the tool did not write."""
import dataclasses
import json
import os

import pytest

from hkgpu_tune.tune.engine import Engine
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.tune.persist import persist, unpersist
from hkgpu_tune.core.profile import parse_profile_text

from ..unit.test_engine import PROFILE, host
from .test_kills import tree


def setup(tmp_path, text=PROFILE):
    root = tmp_path / "root"
    (root / "etc/hkgpu-tune").mkdir(parents=True)
    (root / "etc/hkgpu-tune/profile.yaml").write_text("name: older\n")
    eng = Engine(parse_profile_text(text, "t.yaml"), state_dir=str(tmp_path / "st"), backends=host())
    return root, eng


@pytest.mark.parametrize("value", ["1\nkernel.core_pattern = |/tmp/x", "1\rx", "1\x00"])
def test_a_sysctl_value_with_a_line_break_is_refused_and_nothing_written(tmp_path, value):
    root, eng = setup(tmp_path)
    before = tree(root)
    s = next(x for x in eng.profile.sysctl if x.key == "net.ipv4.tcp_mtu_probing")
    eng.profile.sections["sysctl"] = [dataclasses.replace(x, value=value) if x is s else x
                                      for x in eng.profile.sysctl]
    with pytest.raises(HkError, match=f"sysctl '{s.key}': the value holds a line break"):
        persist(eng, str(root))
    assert tree(root) == before and not (tmp_path / "st/state.json").exists()


def test_each_file_is_journalled_with_its_hash_and_undo_is_idempotent(tmp_path):
    root, eng = setup(tmp_path)
    before = tree(root)
    done = persist(eng, str(root))
    assert any("60-hkgpu-tune.conf" in d for d in done)
    entries = json.load(open(tmp_path / "st/state.json"))["entries"]
    files = {e["target"]: e for e in entries if e["type"] == "persist.file" and e["key"] == "file"}
    prof = str(root / "etc/hkgpu-tune/profile.yaml")
    assert files[prof]["original"]["backup"].startswith(str(tmp_path / "st/backup/"))
    assert all(len(e["desired"]["sha256"]) == 1 for e in files.values())
    persist(eng, str(root))           # a second persist: nothing new to back up, same entries
    assert len(json.load(open(tmp_path / "st/state.json"))["entries"]) == len(entries)
    first = unpersist(str(tmp_path / "st"))
    assert f"restored {prof}" in first and tree(root) == before
    assert unpersist(str(tmp_path / "st")) == []
    assert tree(root) == before


def test_a_file_changed_since_is_kept_and_reported(tmp_path):
    root, eng = setup(tmp_path)
    persist(eng, str(root))
    conf = root / "etc/sysctl.d/60-hkgpu-tune.conf"
    conf.write_text("# the operator's own now\n")
    done = unpersist(str(tmp_path / "st"))
    assert f"kept {conf}: changed since hkgpu-tune wrote it (not removed, not restored)" in done
    assert conf.read_text() == "# the operator's own now\n"


def test_a_tampered_backup_is_not_restored_and_its_entry_kept(tmp_path):
    root, eng = setup(tmp_path)
    persist(eng, str(root))
    prof = root / "etc/hkgpu-tune/profile.yaml"
    ours = prof.read_text()
    backup = next((tmp_path / "st/backup").iterdir())
    backup.write_text("planted\n")
    with pytest.raises(HkError, match="the backup changed since it was made"):
        unpersist(str(tmp_path / "st"))
    assert prof.read_text() == ours
    left = [e["target"] for e in json.load(open(tmp_path / "st/state.json"))["entries"]]
    assert str(prof) in left


def test_a_link_that_is_not_ours_is_left_alone(tmp_path):
    root, eng = setup(tmp_path)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    os.symlink("/somewhere/else.service", wants / "hkgpu-tune.service")
    with pytest.raises(HkError, match="not hkgpu-tune's link"):
        persist(eng, str(root))
    assert os.readlink(wants / "hkgpu-tune.service") == "/somewhere/else.service"
    unpersist(str(tmp_path / "st"))   # what it did write goes again; the foreign link stays
    assert os.readlink(wants / "hkgpu-tune.service") == "/somewhere/else.service"
    assert (root / "etc/hkgpu-tune/profile.yaml").read_text() == "name: older\n"


def test_a_kill_between_the_record_and_the_write_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    import hkgpu_tune.tune.persist as pe

    class Kill(BaseException):
        pass

    root, eng = setup(tmp_path)
    before = tree(root)
    real = pe.atomic_write

    def die(path, *a, **k):
        if path == str(root / "etc/hkgpu-tune/profile.yaml"):   # after its record and backup
            raise Kill()
        return real(path, *a, **k)

    monkeypatch.setattr(pe, "atomic_write", die)
    with pytest.raises(Kill):
        persist(eng, str(root))
    monkeypatch.setattr(pe, "atomic_write", real)
    done = unpersist(str(tmp_path / "st"))
    assert f"{root}/etc/hkgpu-tune/profile.yaml: already restored" in done
    assert tree(root) == before
