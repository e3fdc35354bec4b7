"""The model repository is written with fsutil.atomic_write: a link planted where the old fixed
temporary name went (MODEL.hkgpu-tmp) is not followed, and a config or model file that is a link
is refused (HkError), its target untouched."""
import os

import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.serve.repository import render

from .conftest import MODEL_PY, dump, profile_dict
from .test_render import section


def setup(tmp_path):
    t = section(dump(profile_dict(tmp_path, (18000, 18001, 18002))))
    repo = tmp_path / "models" / "doubler"
    (repo / "1").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    return t, repo, victim


def test_a_link_at_the_model_copys_temp_name_is_not_followed(tmp_path):
    t, repo, victim = setup(tmp_path)
    os.symlink(victim, repo / "1" / "model.py.hkgpu-tmp")
    render.write_repository(t)
    assert victim.read_text() == "keep\n"
    assert (repo / "1" / "model.py").read_bytes() == open(MODEL_PY, "rb").read()
    assert os.stat(repo / "1" / "model.py").st_mode & 0o777 == 0o644


@pytest.mark.parametrize("name", ["config.pbtxt", "1/model.py"])
def test_a_repository_file_that_is_a_link_is_refused(tmp_path, name):
    t, repo, victim = setup(tmp_path)
    os.symlink(victim, repo / name)
    with pytest.raises(HkError, match="refusing to replace it: it is a link"):
        render.write_repository(t)
    assert victim.read_text() == "keep\n" and (repo / name).is_symlink()
