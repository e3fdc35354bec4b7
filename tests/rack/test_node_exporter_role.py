"""The hkgpu_node_exporter role: its flags, written by the real role (ansible-playbook, connection
local, into a temp environment file), start Debian's node_exporter, which then serves the textfile
the export writes into the directory hkgpu_verify's default names."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from simrack import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not shutil.which("ansible-playbook"), reason="needs ansible-playbook (pip install -e .[test])"),
    pytest.mark.skipif(not shutil.which("prometheus-node-exporter"),
                       reason="needs Debian's prometheus-node-exporter (scripts/apt-packages.txt)"),
]


def defaults(role):
    with open(os.path.join(REPO, "roles", role, "defaults", "main.yml")) as f:
        return yaml.safe_load(f)


def test_defaults_agree_with_the_export_and_the_scrape():
    ne, ver, mon = defaults("hkgpu_node_exporter"), defaults("hkgpu_verify"), defaults("hkgpu_monitoring")
    assert ne["hkgpu_node_exporter_textfile_dir"] == ver["hkgpu_verify_textfile_dir"]
    assert ne["hkgpu_node_exporter_listen"].rsplit(":", 1)[1] == str(mon["hkgpu_monitoring_node_exporter_port"])
    # Debian's node_exporter reads the same directory with no flag at all
    h = subprocess.run(["prometheus-node-exporter", "--help"], capture_output=True, text=True, timeout=30)
    assert f'--collector.textfile.directory="{ne["hkgpu_node_exporter_textfile_dir"]}"' in h.stdout + h.stderr


def test_role_flags_start_node_exporter_on_the_textfile(tmp_path):
    from tests.triton.conftest import free_ports
    (port,) = free_ports(1)
    textdir = tmp_path / "textfile"
    env_file = tmp_path / "prometheus-node-exporter"
    env_file.write_text('# Set the command-line arguments to pass to the server.\nARGS=""\n')   # as Debian ships it
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"n1": {
        "ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}}}}))
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False,
                                     "roles": [{"role": "hkgpu.tune.hkgpu_node_exporter"}]}]))
    argv = ["ansible-playbook", "-i", str(inv), str(play), "-e", "hkgpu_node_exporter_install=false",
            "-e", f"hkgpu_node_exporter_textfile_dir={textdir}", "-e", f"hkgpu_node_exporter_listen=127.0.0.1:{port}",
            "-e", '{"hkgpu_node_exporter_args": ["--collector.disable-defaults", "--collector.textfile"]}',
            "-e", f"__hkgpu_node_exporter_env_file={env_file}", "-e", "__hkgpu_node_exporter_service=false"]
    env = {**os.environ, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert textdir.is_dir()
    (textdir / "hkgpu-tune.prom").write_text("# TYPE hkgpu_tune_failures gauge\nhkgpu_tune_failures 3\n")

    # ARGS as systemd's EnvironmentFile= and $ARGS hand them over: unquoted, split on whitespace
    (line,) = [x for x in env_file.read_text().splitlines() if x.startswith("ARGS=")]
    args = shlex.split(line[len("ARGS="):])[0].split()
    p = subprocess.Popen([shutil.which("prometheus-node-exporter"), *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        body, deadline = "", time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    body = resp.read().decode()
                break
            except OSError:
                assert p.poll() is None, p.stderr.read().decode()
                time.sleep(0.2)
        assert "\nhkgpu_tune_failures 3\n" in body, body[-2000:]
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)

    r = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert r.returncode == 0 and "changed=0" in r.stdout, r.stdout[-3000:]


def installed(pkg: str) -> bool:
    p = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    return p.stdout.strip() == "install ok installed"


@pytest.mark.skipif(not all(map(installed, ("prometheus-node-exporter", "prometheus", "prometheus-alertmanager"))),
                    reason="needs Debian's prometheus-node-exporter, prometheus and prometheus-alertmanager installed")
def test_installed_packages_need_no_package_index(tmp_path):
    """Where dpkg shows the package, the roles run no apt task: Ansible's apt module would first fetch
    python3-apt, and a node with no package index (the VM test node, an air-gapped rack) failed the
    converge there. Check mode on this machine, which has the packages: nothing changes here."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "roles": [{"role": "hkgpu.tune.hkgpu_node_exporter"},
                  {"role": "hkgpu.tune.hkgpu_monitoring", "vars": {"hkgpu_monitoring_manage_config": False}}]}]))
    p = subprocess.run(["ansible-playbook", "--check", str(play), "-e", f"ansible_python_interpreter={sys.executable}"],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    tasks = {}
    for block in p.stdout.split("TASK [")[1:]:
        name, _, rest = block.partition("]")
        tasks[name] = rest
    for t in ("hkgpu.tune.hkgpu_node_exporter : Install node_exporter",
              "hkgpu.tune.hkgpu_monitoring : Install Prometheus (promtool comes with it)",
              "hkgpu.tune.hkgpu_monitoring : Install Alertmanager (amtool comes with it)"):
        assert "skipping: [localhost]" in tasks[t], (t, tasks.get(t))
