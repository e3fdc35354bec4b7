"""The model repository is under the trust rule: root writes config.pbtxt, model files and the
hkbatch library only where no other user can change the path. A link planted in the repository
(or a directory of it another user owns) is refused before anything is written through it; a
library whose .sha256 another user could write is not taken as built."""
import hashlib
import os

import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.serve.repository import batch_backend, render

from .test_triton_trust import NOBODY, section

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of other owners")


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"          # root's: where an attacker would like root to write
    v.mkdir()
    return v


def untouched(victim):
    return sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == []


def test_a_link_planted_in_a_repository_another_user_owns_is_not_followed(tmp_path, victim):
    os.chmod(tmp_path, 0o755)
    t = section(tmp_path)
    repo = tmp_path / "models"
    repo.mkdir()
    os.chown(repo, NOBODY, NOBODY)               # the service user's repository
    os.symlink(victim, repo / "doubler")        # planted by that user
    with pytest.raises(HkError, match="uid 65534"):
        render.write_repository(t)
    assert untouched(victim)


def test_a_link_planted_in_a_model_directory_is_not_followed(tmp_path, victim):
    os.chmod(tmp_path, 0o755)
    t = section(tmp_path)
    d = tmp_path / "models" / "doubler"
    d.mkdir(parents=True)
    os.chown(d, NOBODY, NOBODY)
    os.symlink(victim, d / "1")                  # the version directory
    with pytest.raises(HkError, match="refused"):
        render.write_repository(t)
    assert untouched(victim) and not (d / "config.pbtxt").exists()


def test_a_trusted_repository_is_rendered(tmp_path):
    os.chmod(tmp_path, 0o755)
    t = section(tmp_path)
    written = render.write_repository(t)
    assert any(w.endswith("config.pbtxt") for w in written)


def test_a_library_record_another_user_could_write_is_not_taken_as_built(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    os.chmod(tmp_path, 0o755)
    lib = d / batch_backend.LIBRARY
    lib.write_bytes(b"\x7fELF planted")
    rec = d / (batch_backend.LIBRARY + ".sha256")
    rec.write_text(f"{batch_backend.source_sha()} {hashlib.sha256(lib.read_bytes()).hexdigest()}\n")
    assert batch_backend.installed_sha(str(d)) == batch_backend.source_sha()[:12]   # root's: as built
    for f in (lib, rec):
        os.chown(f, NOBODY, NOBODY)
        assert batch_backend.installed_sha(str(d)) is None, f
        os.chown(f, 0, 0)


def test_the_copies_apply_keeps_are_not_made_or_moved_through_a_planted_link(tmp_path, victim):
    """redeploy keeps a copy of a model beside the repository and rollback moves it back: a
    copies directory that is a link another user planted is refused before anything moves."""
    from hkgpu_tune.serve.repository import redeploy
    os.chmod(tmp_path, 0o755)
    repo = tmp_path / "models"
    (repo / "doubler").mkdir(parents=True)
    (repo / "doubler" / "config.pbtxt").write_text("name: 'doubler'\n")
    backup = redeploy.backup_path(str(repo), "doubler", redeploy.new_token())
    os.symlink(victim, os.path.dirname(backup))
    os.lchown(os.path.dirname(backup), NOBODY, NOBODY)
    with pytest.raises(HkError, match="refused"):
        redeploy.save(str(repo / "doubler"), backup)
    with pytest.raises(HkError, match="refused"):
        redeploy.put_back(str(repo / "doubler"), backup, True)
    assert untouched(victim) and (repo / "doubler" / "config.pbtxt").exists()
