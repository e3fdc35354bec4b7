"""A sysctl value of the wrong shape is a profile error at load (file:line:key, exit 1, nothing
planned or changed): a directory of /proc/sys, a list or several words where the kernel keeps one
value, an empty value, a mapping without `value`. Lists stay fine where the kernel keeps several."""
import subprocess
import sys

import pytest

CASES = [
    ("net.ipv4.conf.all: 1", "is a directory of /proc/sys"),
    ("net.ipv4.conf: 1", "is a directory of /proc/sys"),
    ("net.ipv4.tcp_mtu_probing: [1, 2]", "takes one value on this kernel, got 2"),
    ("net.ipv4.tcp_mtu_probing: 1 2", "takes one value on this kernel, got 2"),
    ("net.ipv4.tcp_mtu_probing:", "expected a number or a string"),
    ("net.ipv4.tcp_mtu_probing: ''", "expected a number or a string"),
    ("net.ipv4.tcp_mtu_probing: {a: 1}", "unknown key"),
]


def run(tmp_path, line):
    f = tmp_path / "p.yaml"
    f.write_text(f"name: t\nsysctl:\n  {line}\n")
    before = open("/proc/sys/net/ipv4/tcp_mtu_probing").read()
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "apply", "-p", str(f), "--only", "sysctl",
                        "--state-dir", str(tmp_path / "st")], capture_output=True, text=True, timeout=60)
    assert open("/proc/sys/net/ipv4/tcp_mtu_probing").read() == before
    return f, p


@pytest.mark.parametrize("line,msg", CASES)
def test_a_value_of_the_wrong_shape_is_a_profile_error(tmp_path, line, msg):
    f, p = run(tmp_path, line)
    err = p.stderr.strip()
    assert p.returncode == 1 and p.stdout == "" and "Traceback" not in err, err
    assert len(err.splitlines()) == 1 and err.startswith(f"hkgpu-tune: error: {f}:3: sysctl.") and msg in err, err
    assert not (tmp_path / "st" / "state.json").exists()


def test_a_list_where_the_kernel_keeps_several_values_is_fine(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: t\nsysctl:\n  net.ipv4.tcp_rmem: [4096, 87380, 6291456]\n")
    p = subprocess.run([sys.executable, "-m", "hkgpu_tune", "plan", "-p", str(f), "--only", "sysctl"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode in (0, 2) and "Traceback" not in p.stderr, p.stderr
