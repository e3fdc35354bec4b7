"""The compare chart: the PNG read back, its panels found by their face colour, its size checked."""
import json
import subprocess
import sys

import pytest

from hkgpu_tune.baseline import chart as chartmod
from hkgpu_tune.baseline import compare as cmpmod

from .snapshots import snapshot, write

mpl = pytest.importorskip("matplotlib", reason="matplotlib is in the test extras (pip install -e .[test])")


def panels_in_png(path) -> int:
    """Connected regions of the panels' face colour, larger than a legend's worth of pixels."""
    import numpy as np
    from matplotlib import image
    img = image.imread(path)[::3, ::3, :3]            # PNG -> floats 0..1, every third pixel
    face = np.array(mpl.colors.to_rgb(chartmod.FACE))
    mask = (np.abs(img - face) < 0.02).all(axis=2)
    seen = np.zeros_like(mask)
    count = 0
    h, w = mask.shape
    for y in range(h):
        for x in range(w):
            if mask[y, x] and not seen[y, x]:
                stack, size = [(y, x)], 0
                seen[y, x] = True
                while stack:
                    cy, cx = stack.pop()
                    size += 1
                    for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                        if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                            seen[ny, nx] = True
                            stack.append((ny, nx))
                if size > 2000:
                    count += 1
    return count


def hk(*args):
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True)


ENGINE = {"status": "ok", "tool": "torch", "model": "resnet50", "batch": 32,
          "img_s": [7900.0, 7950.0, 7880.0, 7920.0, 7910.0], "latency_ms": [4.0, 4.1, 4.05] * 20}


@pytest.mark.parametrize("kw, want", [
    ({"engine": ENGINE}, ["throughput", "rtt", "rtt distribution", "engine"]),
    ({}, ["throughput", "rtt", "rtt distribution"]),
    ({"latency": False}, ["throughput"]),
])
def test_png_has_one_panel_per_group(tmp_path, kw, want):
    a = write(tmp_path / "a.json", snapshot(**kw))
    b = write(tmp_path / "b.json", snapshot(tput_scale=0.6, rtt_scale=1.5, **kw))
    png = tmp_path / "c.png"
    p = hk("baseline", "compare", a, b, "--png", str(png), "--json")
    assert p.returncode == 2, p.stderr
    info = json.loads(p.stdout)["chart"]
    assert info["panels"] == want
    from matplotlib import image
    h, w = image.imread(png).shape[:2]
    assert (w, h) == (info["width_px"], info["height_px"]) == (1100, 340 * len(want))
    assert panels_in_png(png) == len(want)


def test_png_path_that_cannot_be_written(tmp_path):
    a = write(tmp_path / "a.json", snapshot())
    (tmp_path / "real.png").write_text("x")
    (tmp_path / "link.png").symlink_to(tmp_path / "real.png")
    for target, msg in ((tmp_path / "no" / "c.png", "cannot write"), (tmp_path / "link.png", "it is a link")):
        p = hk("baseline", "compare", a, a, "--png", str(target))
        assert p.returncode == 1 and msg in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    assert (tmp_path / "real.png").read_text() == "x"


def test_nothing_to_chart(tmp_path):
    a = write(tmp_path / "a.json", snapshot(throughput=False, latency=False))
    cmp = cmpmod.compare(cmpmod.load(a), cmpmod.load(a))
    with pytest.raises(Exception, match="nothing to chart"):
        chartmod.chart(cmp, str(tmp_path / "c.png"))
