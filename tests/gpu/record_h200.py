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
from hkgpu_tune.engine import Engine  # noqa: E402
from hkgpu_tune.profile import load_profile  # noqa: E402

out = sys.argv[1]
prof = load_profile(os.path.join(os.path.dirname(__file__), "..", "fixtures/gpu/profile-h200.yaml"))
rec = RecordingSysFs(SysFs("/"))
eng = Engine(prof, only=["gpu", "mps", "affinity"], backends=Backends(sysfs=rec))
eng.facts()
eng.verify()
tree = tempfile.mkdtemp()
n = rec.dump(tree)
pack(tree, os.path.join(out, "h200-tree.tar.gz"))
print(f"recorded {n} paths")
