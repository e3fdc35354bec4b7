"""One version everywhere it is written: the wheel (pyproject), the package, the collection
(galaxy.yml), and a CHANGELOG section for it in both change logs (tags are vX.Y.Z of it)."""
import os
import re
import tomllib

import yaml

from hkgpu_tune.core.version import __version__

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTION = os.path.join(REPO, "collections", "ansible_collections", "hkgpu", "tune")


def releases(path: str) -> list[str]:
    with open(path) as f:
        return re.findall(r"^## (\d+\.\d+\.\d+)\b", f.read(), flags=re.M)


def test_one_version_everywhere():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        wheel = tomllib.load(f)["project"]["version"]
    with open(os.path.join(COLLECTION, "galaxy.yml")) as f:
        collection = yaml.safe_load(f)["version"]
    assert wheel == __version__ == collection, (wheel, __version__, collection)


def test_the_newest_release_in_each_changelog_is_this_version():
    for path in (os.path.join(REPO, "CHANGELOG.md"), os.path.join(COLLECTION, "CHANGELOG.md")):
        got = releases(path)
        assert got and got[0] == __version__, (path, got[:3], __version__)
        assert got == sorted(got, key=lambda v: tuple(map(int, v.split("."))), reverse=True), (path, got)
