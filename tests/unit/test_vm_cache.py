"""The VM image cache (tests/vm/vm.py) is shared by the runs of one machine: a run's clean-up removes
only images no run holds and none used for a day; a held one (another run building or booting it)
stays, whatever its age."""
import os
import subprocess
import sys
import time

from tests.vm import vm

HOLD = """
import sys, time
from tests.vm import vm
vm.image_key = lambda: sys.argv[2]
vm.image_dir(sys.argv[1]); print("held", flush=True); time.sleep(60)
"""


def old(path):
    t = time.time() - vm.KEEP_S - 60
    os.utime(path, (t, t))


def test_a_run_removes_only_old_images_no_other_run_holds(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    for k in ("held", "stale", "recent"):
        (cache / k).mkdir(parents=True)
        (cache / k / "disk.img").write_text(k)
    old(cache / "held")
    old(cache / "stale")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(cache), "held"], stdout=subprocess.PIPE, text=True,
                              cwd=root, env={**os.environ, "PYTHONPATH": root})
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(vm, "image_key", lambda: "mine")
        assert vm.image_dir(str(cache)) == str(cache / "mine")
        left = sorted(e for e in os.listdir(cache) if not e.endswith(".lock"))
        assert left == ["held", "recent"], left        # held by the other run, and used lately
    finally:
        holder.kill()
        holder.wait()
        os.close(vm._HELD.pop("mine"))
