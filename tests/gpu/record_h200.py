"""Record the /sys + /proc tree the gpu/mps/affinity subsystems read (facts and verify), for replay.

    python3 tests/gpu/record_h200.py OUTDIR   (writes h200-tree.tar.gz; the facts JSON comes from
    `hkgpu-tune facts --only gpu,mps,affinity --json`)
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from hkgpu_tune.backends import Backends  # noqa: E402
from hkgpu_tune.backends.procfs import SysFs  # noqa: E402
from hkgpu_tune.backends.sysfs_record import RecordingSysFs, pack  # noqa: E402
from hkgpu_tune.tune.engine import Engine  # noqa: E402
from hkgpu_tune.core.profile import load_profile  # noqa: E402


def record(profile_path: str, tarball: str) -> tuple[dict, str, int]:
    """facts and verify of gpu, mps and affinity with every /sys,/proc read recorded; the tree is
    packed into `tarball`. Returns (facts, tree directory, paths recorded)."""
    rec = RecordingSysFs(SysFs("/"))
    eng = Engine(load_profile(profile_path), only=["gpu", "mps", "affinity"], backends=Backends(sysfs=rec))
    facts = eng.facts()
    eng.verify()   # records what verify reads beyond facts
    tree = tempfile.mkdtemp()
    n = rec.dump(tree)
    pack(tree, tarball)
    return facts, tree, n


if __name__ == "__main__":
    _, _, n = record(os.path.join(os.path.dirname(__file__), "..", "fixtures/gpu/profile-h200.yaml"),
                     os.path.join(sys.argv[1], "h200-tree.tar.gz"))
    print(f"recorded {n} paths")
