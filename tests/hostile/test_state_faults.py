"""A full or read-only state directory never blocks recovery. Apply whose journal cannot be
rewritten mid-run undoes every write it made and says what state the host is in; rollback restores
every entry even when the state file cannot be rewritten, says so, and a later rollback (the
directory writable again) finishes the job. The faults are real: a small tmpfs filled up and a
read-only bind mount, each in a private mount namespace (unshare -m), so nothing global changes."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import sh, write_profile

pytestmark = [pytest.mark.root, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def in_private_mounts(script: str, timeout=120):
    """Run sh `script` in a mount namespace of its own (private propagation)."""
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": ROOT})


@pytest.mark.parametrize("with_earlier", [False, True])
def test_apply_on_a_disk_that_fills_mid_run_undoes_every_write_and_says_so(tmp_path, with_earlier):
    st, host_dir = tmp_path / "st", tmp_path / "host"
    st.mkdir(mode=0o700)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import json, os
        from hkgpu_tune.tune.engine import Engine
        from hkgpu_tune.core.profile import parse_profile_text
        from tests.unit.test_engine import PROFILE, host
        b = host()
        if {with_earlier!r}:   # an earlier run's entry: the undo must rewrite the journal, not remove it
            rep0 = Engine(parse_profile_text(PROFILE, "t.yaml"), only=["link"], state_dir={str(st)!r}, backends=b,
                          host_dir={str(host_dir)!r}).apply()
            assert not rep0.error, rep0.error
        def seen():   # as the kernel shows a value: whitespace normalised
            return {{k: " ".join(v.split()) for k, v in b.sysctl.values.items()}}, [l["mtu"] for l in b.net.links()]
        before = seen()
        eng = Engine(parse_profile_text(PROFILE, "t.yaml"), state_dir={str(st)!r}, backends=b,
                     host_dir={str(host_dir)!r})
        sub = eng.by_name["sysctl"]
        real = sub.apply
        def apply_then_fill(c):          # another process fills the disk while apply runs
            real(c)
            if not os.path.exists({str(st / "filler")!r}):
                fd = os.open({str(st / "filler")!r}, os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    while True:
                        os.write(fd, b"x" * 4096)
                except OSError:
                    os.close(fd)
        sub.apply = apply_then_fill
        rep = eng.apply()
        after = seen()
        print(json.dumps({{"error": rep.error, "rolled_back": rep.rolled_back, "same": before == after, "before": before, "after": after,
                          "writes": len(b.sysctl.writes),
                          "state_left": os.path.exists({str(st / "state.json")!r})}}))
    """))
    p = in_private_mounts(f"mount -t tmpfs -o size=64k,mode=0700 hkgpu-full {st}\n"
                          f"cd {ROOT}\nexec {sys.executable} {script}")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["writes"] > 1 and out["rolled_back"], out         # it wrote, then undid
    assert out["same"], json.dumps([out["before"], out["after"]])                                       # every write undone
    assert "No space left on device" in out["error"], out["error"]
    if with_earlier:   # the journal could not follow: said, and the earlier run's entries are still there
        assert "every one of its" in out["error"] and "could not be rewritten" in out["error"], out["error"]
        assert out["state_left"]
    else:
        assert not out["state_left"], "undone entries left in the journal"    # removing needs no space


def test_rollback_on_a_read_only_state_directory_restores_every_entry(net, tmp_path):
    keys = {"net.ipv4.tcp_mtu_probing": "1", "net.ipv4.tcp_fin_timeout": "17",
            "net.ipv4.tcp_slow_start_after_idle": "0"}

    def read():
        vals = {k: sh("sysctl", "-n", k, ns=net.A).stdout.strip() for k in keys}
        return vals, net.link()["mtu"]

    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    sh("sysctl", "-w", "net.ipv4.tcp_mtu_probing=0", "net.ipv4.tcp_fin_timeout=60",
       "net.ipv4.tcp_slow_start_after_idle=1", ns=net.A)
    before = read()
    p = write_profile(tmp_path, "sysctl:\n" + "".join(f"  {k}: {v}\n" for k, v in keys.items()) + f"""\
network:
  interfaces:
    - match: {{name: {net.a}}}
      mtu: 9000
  fabric_peers: [{net.ipb}]
""")
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, "--only", "sysctl,link", state=st)
    assert rc == 0 and doc["error"] == "", doc
    assert read() == (keys, 9000)
    saved = (st / "state.json").read_bytes()

    r = in_private_mounts(f"mount --bind {st} {st}\nmount -o remount,bind,ro {st}\n"
                          f"exec ip netns exec {net.A} {sys.executable} -m hkgpu_tune rollback --state-dir {st}")
    assert read() == before, (r.stdout, r.stderr)                  # every entry, not one
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "could not be rewritten" in r.stderr and "Read-only file system" in r.stderr, r.stderr
    assert "run rollback again" in r.stderr
    assert (st / "state.json").read_bytes() == saved               # untouched: it was read-only

    r = net.hk("rollback", state=st)                              # writable again: finishes
    assert r.returncode == 0, r.stdout + r.stderr
    assert read() == before and not (st / "state.json").exists()
