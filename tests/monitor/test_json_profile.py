"""health, export and baseline compare say in --json which profile they used and why
(profile_source), as every other command does through report.envelope."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200 = os.path.join(REPO, "tests", "fixtures", "gpu", "h200-health.json")
sys.path.insert(0, REPO)
from tests.baseline.snapshots import snapshot, write  # noqa: E402


def hk(*args, env=None):
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True, cwd=REPO,
                       timeout=120, env={**os.environ, **(env or {})})
    assert p.returncode in (0, 2), p.stderr
    return json.loads(p.stdout)


def test_health_export_and_compare_name_their_profile_and_its_source(tmp_path):
    prof = tmp_path / "node.yaml"
    prof.write_text("name: node-a\nhealth:\n  gpus_expected: 1\n")
    env = {"HKGPU_TUNE_NVML_REPLAY": H200, "HKGPU_TUNE_KMSG_REPLAY": os.devnull}
    st = str(tmp_path / "st")
    doc = hk("health", "--json", "--no-hooks", "--profile", str(prof), "--state-dir", st, env=env)
    assert (doc["profile"], doc["profile_source"]) == (str(prof), "--profile")
    (tmp_path / "tf").mkdir()
    doc = hk("export", "--json", "--textfile-dir", str(tmp_path / "tf"), "--state-dir", st, env=env)
    assert doc["command"] == "export" and doc["profile_source"] in ("default", "node", "persist")
    doc = hk("export", "--json", "--textfile-dir", str(tmp_path / "tf"), "--state-dir", st,
             env={**env, "HKGPU_TUNE_PROFILE": str(prof)})
    assert (doc["profile"], doc["profile_source"]) == (str(prof), "HKGPU_TUNE_PROFILE")
    a = write(tmp_path / "a.json", snapshot())
    doc = hk("baseline", "compare", a, a, "--json", "--profile", "hk-inference")
    assert (doc["profile"], doc["profile_source"]) == ("hk-inference", "--profile")
    doc = hk("baseline", "compare", a, a, "--json")       # no profile used: none named
    assert (doc["profile"], doc["profile_source"]) == (None, None)
