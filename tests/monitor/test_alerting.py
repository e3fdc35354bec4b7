"""Alerts end to end, for real: Debian's Prometheus (the shipped config and rules, 2 s scrapes) scrapes
Debian's node_exporter, whose textfile the real `hkgpu-tune export` wrote, and a dcgm-exporter
stand-in (an HTTP server on loopback serving output recorded from a real dcgm-exporter,
tests/fixtures/monitor/README.md, with one GPU's last XID set to 79); the alerts go to Debian's
Alertmanager with the hkgpu_monitoring role's minimal configuration, asked through its API
(/api/v2/alerts).
- The export runs with dcgm-exporter present, so it leaves its XID series out (a replayed kernel log
  has XID 79): the XID alert fires from dcgm-exporter's series and reaches Alertmanager.
- A sysctl changed by hand in the node's network namespace: the next export has the drift, and
  HkgpuDriftPresent reaches Alertmanager within the rule's `for` plus two scrape intervals of the
  drift first being scraped."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml

from tests.helpers import tagged

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MON = os.path.join(REPO, "monitoring", "prometheus")
FIXTURE = os.path.join(REPO, "tests", "fixtures", "monitor", "dcgm-exporter-a30-mig.metrics")
H200 = os.path.join(REPO, "tests", "fixtures", "gpu", "h200-health.json")
AM_TEMPLATE = os.path.join(REPO, "roles", "hkgpu_monitoring", "templates", "alertmanager.yml.j2")
NS = tagged("hkalert-node")   # this run's: the set-up deletes it first
SCRAPE_S = 2
BINS = {b: shutil.which(b) for b in ("prometheus", "prometheus-node-exporter", "prometheus-alertmanager", "ip")}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a network namespace for the node's sysctl)"),
    pytest.mark.skipif(not all(BINS.values()),
                       reason="needs " + ", ".join(b for b, p in BINS.items() if not p) + " (scripts/apt-packages.txt)"),
]

PROFILE = """\
name: alerting
# dcgm-exporter and node_exporter run here: the export leaves their series (XIDs among them) to them
export: {node_exporter: true, dcgm_exporter: true, collectors: [gpu, kmsg]}
sysctl:
  net.core.somaxconn: 4096
"""
KMSG = "[   12.500000] NVRM: Xid (PCI:0000:00:06): 79, pid=0, GPU has fallen off the bus.\n"
LABELS = {"site": "hk_test", "rack": "rack_test_a01", "node": "test-n01"}


def sh(*argv, check=True):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def wait(what, fn, deadline, step=0.2):
    """fn() until it returns something true, else fail naming what was awaited."""
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)


def dcgm_standin(text):
    """dcgm-exporter on loopback: GET /metrics answers the recorded text."""
    body = text.encode()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            code = 200 if self.path == "/metrics" else 404
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            if code == 200:
                self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def with_xid(text, gpu, instance, xid):
    """The recorded output with one MIG instance's last XID (the gauge's value) set."""
    out = []
    for line in text.splitlines():
        if line.startswith(f'DCGM_FI_DEV_XID_ERRORS{{gpu="{gpu}",') and f'GPU_I_ID="{instance}"' in line:
            line = line.rsplit(" ", 1)[0] + f" {xid}"
        out.append(line)
    return "\n".join(out) + "\n"


def start(argv, log):
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def export(root):
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HKGPU_TUNE_NVML_REPLAY": H200, "HKGPU_TUNE_KMSG_REPLAY": str(root / "kmsg.txt")}
    p = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-m", "hkgpu_tune", "export", "--json",
                        "--profile", str(root / "node.yaml"), "--textfile-dir", str(root / "textfile"),
                        "--state-dir", str(root / "state")], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode in (0, 2), p.stdout + p.stderr
    return p.returncode, (root / "textfile" / "hkgpu-tune.prom").read_text()


def am_template(webhook=""):
    import jinja2
    with open(AM_TEMPLATE) as f:
        t = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(f.read())
    return t.render(ansible_managed="test", hkgpu_monitoring_alertmanager_webhook_url=webhook)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from tests.triton.conftest import free_ports
    root = tmp_path_factory.mktemp("alerting")
    procs, logs, srv = [], [], None
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "netns", "exec", NS, "sysctl", "-qw", "net.core.somaxconn=4096")
        (root / "node.yaml").write_text(PROFILE)
        (root / "kmsg.txt").write_text(KMSG)
        (root / "textfile").mkdir()
        rc, text = export(root)
        assert rc == 0, text

        with open(FIXTURE) as f:
            srv = dcgm_standin(with_xid(f.read(), 0, 3, 79))
        ne_port, prom_port, am_port = free_ports(3)

        def run(name, argv):
            log = open(root / f"{name}.log", "w")
            logs.append(log)
            procs.append(start(argv, log))
        run("node_exporter", [BINS["prometheus-node-exporter"], f"--web.listen-address=127.0.0.1:{ne_port}",
                              f"--collector.textfile.directory={root / 'textfile'}", "--collector.disable-defaults",
                              "--collector.textfile"])
        (root / "alertmanager.yml").write_text(am_template())
        run("alertmanager", [BINS["prometheus-alertmanager"], f"--config.file={root / 'alertmanager.yml'}",
                             f"--storage.path={root / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
                             "--cluster.listen-address="])

        # the shipped config and rules: faster clocks, our Alertmanager and targets
        conf = root / "prometheus"
        shutil.copytree(MON, conf, ignore=shutil.ignore_patterns("tests", "targets"))
        cfg = yaml.safe_load((conf / "prometheus.yml").read_text())
        cfg["global"].update(scrape_interval=f"{SCRAPE_S}s", evaluation_interval="1s")
        assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
        cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{am_port}"]
        (conf / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        assert {j["job_name"] for j in cfg["scrape_configs"]} >= {"node", "dcgm"}
        (conf / "targets").mkdir()
        (conf / "targets" / "node-rack_test_a01.yml").write_text(
            yaml.safe_dump([{"targets": [f"127.0.0.1:{ne_port}"], "labels": LABELS}]))
        (conf / "targets" / "dcgm-rack_test_a01.yml").write_text(
            yaml.safe_dump([{"targets": [f"127.0.0.1:{srv.server_address[1]}"], "labels": LABELS}]))
        run("prometheus", [BINS["prometheus"], f"--config.file={conf / 'prometheus.yml'}",
                           f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"])
        yield {"root": root, "text": text, "prom": f"http://127.0.0.1:{prom_port}",
               "am": f"http://127.0.0.1:{am_port}", "procs": procs}
    finally:
        for p in procs:
            stop(p)
        for f in logs:
            f.close()
        if srv is not None:
            srv.shutdown()
            srv.server_close()
        sh("ip", "netns", "del", NS, check=False)


def query(stack, expr):
    import urllib.parse
    try:
        d = get(stack["prom"] + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    except OSError:
        return []
    return d["data"]["result"]


def am_alerts(stack, name):
    try:
        alerts = get(stack["am"] + "/api/v2/alerts")
    except OSError:
        return []
    return [a for a in alerts if a["labels"].get("alertname") == name and a["status"]["state"] == "active"]


def test_xid_from_dcgm_exporter_reaches_alertmanager(stack):
    # the export left its XID series to dcgm-exporter although the kernel log has XID 79
    assert "hkgpu_tune_exporter_present{exporter=\"dcgm_exporter\"} 1" in stack["text"]
    assert "hkgpu_tune_xid_events" not in stack["text"]
    deadline = time.monotonic() + 60
    # the stand-in scraped, with the target's labels
    got = wait("dcgm-exporter's XID series in Prometheus", lambda: query(stack, "DCGM_FI_DEV_XID_ERRORS == 79"), deadline)
    assert [(r["metric"]["job"], r["metric"]["node"], r["metric"]["GPU_I_ID"]) for r in got] == [("dcgm", "test-n01", "3")]
    (a,) = wait("HkgpuGpuXidCritical in Alertmanager", lambda: am_alerts(stack, "HkgpuGpuXidCritical"), deadline)
    assert {k: a["labels"][k] for k in ("severity", "xid", "gpu", "node", "rack", "uuid")} == {
        "severity": "critical", "xid": "79", "gpu": "0", "node": "test-n01", "rack": "rack_test_a01",
        "uuid": "GPU-265c9814-6156-355b-e589-ff2064894f16"}
    assert [r["name"] for r in a["receivers"]] == ["hkgpu"]
    assert "XID 79 on GPU 0" in a["annotations"]["summary"]
    # the other GPUs' XID gauge is 0: no XID alert of any severity for them
    assert am_alerts(stack, "HkgpuGpuXid") == []


def test_drift_reaches_alertmanager_within_for_plus_two_scrapes(stack):
    deadline = time.monotonic() + 60
    wait("the clean export in Prometheus", lambda: query(stack, 'hkgpu_tune_failures{node="test-n01"} == 0'), deadline)
    assert am_alerts(stack, "HkgpuDriftPresent") == []

    # drift by hand, then the export (the verify timer's job) writes it
    sh("ip", "netns", "exec", NS, "sysctl", "-qw", "net.core.somaxconn=1024")
    rc, text = export(stack["root"])
    t_drift = time.monotonic()      # the textfile with the drift is in place
    assert rc == 2 and "\nhkgpu_tune_failures 1\n" in text, text[:2000]
    seen = wait("the drift in Prometheus", lambda: query(stack, 'hkgpu_tune_failures{node="test-n01"} > 0'),
                time.monotonic() + 30, step=0.05)
    t_seen = time.monotonic()
    with open(os.path.join(MON, "rules", "hkgpu-node.yml")) as f:
        (rule,) = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"] if r.get("alert") == "HkgpuDriftPresent"]
    assert rule["for"] == "1m"
    budget = 60 + 2 * SCRAPE_S
    (a,) = wait("HkgpuDriftPresent in Alertmanager", lambda: am_alerts(stack, "HkgpuDriftPresent"),
                t_seen + budget + 30, step=0.1)
    t_alert = time.monotonic()
    print(f"drift written -> scraped {t_seen - t_drift:.1f} s, -> in Alertmanager {t_alert - t_drift:.1f} s "
          f"(budget: for 60 s + 2 scrapes = {budget} s)")
    assert t_alert - t_drift <= budget, f"{t_alert - t_drift:.1f} s"
    assert a["labels"]["node"] == "test-n01" and a["labels"]["severity"] == "warning"
    assert seen[0]["metric"]["job"] == "node"
