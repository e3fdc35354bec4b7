"""`baseline compare` on hostile snapshots: an integer too large for a float, input nested past the
parser's depth. One clear line naming the file, exit 1, no traceback."""
import json
import subprocess
import sys

import pytest

from ..baseline.snapshots import snapshot, write


def hk(*args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True, timeout=60)


def big_int(tmp_path):
    doc = snapshot()
    text = json.dumps(doc).replace('"streams": 4', '"streams": ' + "9" * 400, 1)
    assert "9" * 400 in text
    (tmp_path / "b.json").write_text(text)
    return str(tmp_path / "b.json")


def longer_than_python_reads(tmp_path):
    """Past Python's own limit on digits (a ValueError of its own): the same one line."""
    text = json.dumps(snapshot()).replace('"baseline_format"', '"huge": ' + "1" * 5000 + ', "baseline_format"', 1)
    (tmp_path / "c.json").write_text(text)
    return str(tmp_path / "c.json")


def deep(tmp_path):
    text = json.dumps(snapshot())
    text = text[:-1] + ', "nest": ' + "[" * 100000 + "]" * 100000 + "}"
    (tmp_path / "d.json").write_text(text)
    return str(tmp_path / "d.json")


@pytest.mark.parametrize("make", [big_int, longer_than_python_reads, deep])
def test_a_hostile_snapshot_is_one_clear_error(tmp_path, make):
    good = write(tmp_path / "a.json", snapshot())
    bad = make(tmp_path)
    for args in ((good, bad), (bad, good)):
        p = hk("baseline", "compare", *args)
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert bad in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
