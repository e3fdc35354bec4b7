"""Well-known places on a node, shared by layers that must not import each other."""
import os
import sys

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import check_trusted

TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"   # Debian's prometheus-node-exporter textfile collector
TEXTFILE_NAME = "hkgpu-tune.prom"


def entry_point(what: str = "hkgpu-tune entry point for the boot unit") -> list[str]:
    """The installed command by absolute path, never looked up on PATH at boot: the console script
    this process runs as, else the one installed beside this interpreter, else `python -m`. Each
    must pass the trust rule (root runs it at every boot)."""
    cands = []
    if os.path.basename(sys.argv[0] or "") == "hkgpu-tune" and os.path.isabs(sys.argv[0]):
        cands.append([sys.argv[0]])
    cands += [[os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "hkgpu-tune")],
              [os.path.abspath(sys.executable), "-m", "hkgpu_tune"]]
    for argv in cands:
        if os.path.isfile(argv[0]) and os.access(argv[0], os.X_OK):
            check_trusted(argv[0], what)
            return argv
    raise HkError(f"{what}: no hkgpu-tune entry point found by absolute path")
