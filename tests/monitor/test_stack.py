"""The monitoring stack for real, across network namespaces as on a rack: Debian's Prometheus (1 s
scrapes, the repo's example config and rules) runs in the monitoring host's namespace and scrapes,
over a veth pair, the node's namespace: Debian's node_exporter (textfile collector on a file written
by the real export, GPUs replayed from the recorded H200, probes to the peers) and the CPU
tritonserver, started by `hkgpu-tune triton start` (its gate sends real inference requests) with its
metrics bound to the node's address from the profile. Every query of every dashboard
panel, with its variables resolved through Prometheus, must answer with at least one series; every
rule must evaluate without error; the replayed XID must fire its alert and a healthy node nothing else."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from tests.helpers import processes, tagged
from tests.triton.conftest import HAVE_PYTRITON, dump, free_ports, profile_dict

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MON = os.path.join(REPO, "monitoring")
H200 = os.path.join(REPO, "tests", "fixtures", "gpu", "h200-health.json")
BUDGET_S = 90
NS_NODE, NS_PEER = tagged("hkmon-node"), tagged("hkmon-peer")
BINS = {b: shutil.which(b) for b in ("prometheus", "prometheus-node-exporter", "promtool", "ip", "ping")}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces for the probes)"),
    pytest.mark.skipif(not all(BINS.values()),
                       reason="needs " + ", ".join(b for b, p in BINS.items() if not p) + " (scripts/apt-packages.txt)"),
    pytest.mark.skipif(not HAVE_PYTRITON, reason="needs the nvidia-pytriton wheel (its tritonserver)"),
]

PROFILE = """\
name: monitor-stack
# both metric sets in one Prometheus (the rules and dashboard name each): the export keeps its NIC
# and TCP counters although node_exporter (with netdev and netstat) runs beside it
export: {node_exporter: false, dcgm_exporter: false}
network:
  interfaces:
    - match: {name: hkmon0}
      mtu: 9000
  fabric_peers: [198.18.0.2]
  wan_peers:
    - {address: 198.18.0.3, name: wan-test, rtt_ms: 40, jitter_ms: 30}
"""
# the kernel log `hkgpu-tune export` reads instead of the host's (HKGPU_TUNE_KMSG_REPLAY): an XID and a link flap
KMSG = """\
[   12.500000] NVRM: Xid (PCI:0000:00:06): 13, pid=4242, name=python3, Graphics Exception
[   30.000000] mlx5_core 0000:17:00.0 ens1f0np0: Link down
"""


def sh(*argv, check=True):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p


NODE_ADDR = "198.18.0.1"     # hkmon0 in NS_NODE; the monitoring host (Prometheus) is NS_PEER


def in_ns(ns, fn):
    """fn() in a thread that has entered network namespace ns (setns(2) changes only that thread)."""
    import ctypes
    import threading
    out = {}

    def run():
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:   # CLONE_NEWNET
                raise OSError(ctypes.get_errno(), f"setns {ns}")
        finally:
            os.close(fd)
        try:
            out["v"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["e"] = e
    th = threading.Thread(target=run)
    th.start()
    th.join()
    if "e" in out:
        raise out["e"]
    return out["v"]


def get(port, path, **params):
    """Prometheus's API, from inside the monitoring host's namespace."""
    url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")

    def fetch():
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    return in_ns(NS_PEER, fetch)


def query(port, expr):
    """Prometheus instant query: (status, result list or error text)."""
    try:
        d = get(port, "/api/v1/query", query=expr)
    except urllib.error.HTTPError as e:
        d = json.load(e)
    return d["status"], d.get("data", {}).get("result", d.get("error"))


def wait_scraped(port, deadline):
    """Until Prometheus has scraped every target once with success (its own /api/v1/targets: health
    "up" and a lastScrape) and answers the targets' `up` series: a test reads data, not a clock."""
    seen = []
    while time.monotonic() < deadline:
        active = get(port, "/api/v1/targets")["data"]["activeTargets"]
        seen = [(a["scrapeUrl"], a["health"], a["lastError"]) for a in active]
        if active and all(a["health"] == "up" and not a["lastScrape"].startswith("0001-") for a in active):
            status, res = query(port, "up == 1")
            if status == "success" and len(res) >= len(active):
                return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus did not scrape every target in time: {seen}")


def wait_http(ns, host, port, path, deadline):
    def ok():
        try:
            with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    while time.monotonic() < deadline:
        if in_ns(ns, ok):
            return
        time.sleep(0.2)
    raise AssertionError(f"{host}:{port}{path} in {ns} did not answer in time")


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


def netns_up():
    for ns in (NS_NODE, NS_PEER):
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "netns", "add", ns)
    sh("ip", "-n", NS_NODE, "link", "add", "hkmon0", "type", "veth", "peer", "name", "hkmon1", "netns", NS_PEER)
    sh("ip", "-n", NS_NODE, "link", "set", "hkmon0", "mtu", "9000", "up")
    sh("ip", "-n", NS_PEER, "link", "set", "hkmon1", "mtu", "9000", "up")
    sh("ip", "-n", NS_NODE, "addr", "add", "198.18.0.1/29", "dev", "hkmon0")
    for a in ("198.18.0.2/29", "198.18.0.3/29"):
        sh("ip", "-n", NS_PEER, "addr", "add", a, "dev", "hkmon1")
    for ns in (NS_NODE, NS_PEER):
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def ours(root) -> list:
    return processes(lambda p: str(root) in " ".join(p.info["cmdline"] or []))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from hkgpu_tune.core.profile import load_profile
    from hkgpu_tune.serve.running import launch

    t0 = time.monotonic()
    root = tmp_path_factory.mktemp("monstack")
    procs, logs, t = [], [], None
    try:
        # the node's textfile, from the real export in the test's namespace
        netns_up()
        textdir = root / "textfile"
        textdir.mkdir()
        (root / "node.yaml").write_text(PROFILE)
        (root / "kmsg.txt").write_text(KMSG)
        # the real command, GPUs and kernel log replayed through its documented switches; the NIC
        # collector reads hkmon0 because the profile names it
        env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "HKGPU_TUNE_NVML_REPLAY": H200, "HKGPU_TUNE_KMSG_REPLAY": str(root / "kmsg.txt")}
        p = subprocess.run(["ip", "netns", "exec", NS_NODE, sys.executable, "-m", "hkgpu_tune", "export", "--probes",
                            "--json", "--profile", str(root / "node.yaml"), "--textfile-dir", str(textdir),
                            "--state-dir", str(root / "state")], capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        down = [(c["collector"], c["error"]) for c in json.loads(p.stdout)["collectors"] if not c["up"]]
        assert not down, down
        prom_text = (textdir / "hkgpu-tune.prom").read_text()

        # Triton on the CPU with the doubler model in the node's namespace, its metrics on the node's
        # address (the profile's metrics.address); `triton start` runs the gate: real requests
        ports = free_ports(6)
        doc = profile_dict(root, ports[:3])
        doc["triton"]["metrics"]["address"] = NODE_ADDR
        (root / "triton.yaml").write_text(dump(doc))
        t = load_profile(str(root / "triton.yaml")).section("triton")
        p = subprocess.run(["ip", "netns", "exec", NS_NODE, sys.executable, "-m", "hkgpu_tune", "triton", "start",
                            "-p", str(root / "triton.yaml")], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]

        # node_exporter and Prometheus on free loopback ports
        ne_port, prom_port = ports[3], ports[4]
        log = open(root / "node_exporter.log", "w")
        logs.append(log)
        procs.append(start(["ip", "netns", "exec", NS_NODE, BINS["prometheus-node-exporter"],
                            f"--web.listen-address={NODE_ADDR}:{ne_port}",
                            f"--collector.textfile.directory={textdir}", "--collector.disable-defaults",
                            "--collector.textfile", "--collector.cpu", "--collector.meminfo",
                            "--collector.loadavg", "--collector.netdev", "--collector.netstat"], log))
        conf = root / "prometheus"
        shutil.copytree(os.path.join(MON, "prometheus"), conf, ignore=shutil.ignore_patterns("tests", "targets"))
        cfg = yaml.safe_load((conf / "prometheus.yml").read_text())
        cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
        (conf / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        (conf / "targets").mkdir()
        labels = {"site": "hk_test", "rack": "rack_test_a01", "node": "test-n01"}
        (conf / "targets" / "node-rack_test_a01.yml").write_text(
            yaml.safe_dump([{"targets": [f"{NODE_ADDR}:{ne_port}"], "labels": labels}]))
        (conf / "targets" / "triton-rack_test_a01.yml").write_text(
            yaml.safe_dump([{"targets": [f"{t.metrics.address}:{t.metrics.port}"], "labels": labels}]))
        check = sh(BINS["promtool"], "check", "config", str(conf / "prometheus.yml"), check=False)
        log = open(root / "prometheus.log", "w")
        logs.append(log)
        procs.append(start(["ip", "netns", "exec", NS_PEER, BINS["prometheus"],
                            f"--config.file={conf / 'prometheus.yml'}",
                            f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"], log))
        deadline = t0 + 60
        wait_http(NS_NODE, NODE_ADDR, ne_port, "/metrics", deadline)
        wait_http(NS_PEER, "127.0.0.1", prom_port, "/-/ready", deadline)
        wait_scraped(prom_port, t0 + BUDGET_S - 10)
        yield {"port": prom_port, "ne_port": ne_port, "t": t, "root": root, "check": check, "text": prom_text,
               "t0": t0, "deadline": t0 + BUDGET_S - 10}
    finally:
        for proc in procs:
            stop(proc)
        if t is not None:
            launch.stop(t)
        for f in logs:
            f.close()
        for ns in (NS_NODE, NS_PEER):
            sh("ip", "netns", "del", ns, check=False)
    left = ours(root)
    assert not left, f"processes left behind: {[p.pid for p in left]}"
    assert not any(ns in sh("ip", "netns", "list").stdout for ns in (NS_NODE, NS_PEER))
    assert time.monotonic() - t0 < BUDGET_S, f"the stack test took {time.monotonic() - t0:.0f} s"


# ---------------------------------------------------------------- the dashboard
def dashboard():
    with open(os.path.join(MON, "grafana", "hkgpu-tune.json")) as f:
        return json.load(f)


def panel_queries(d):
    for p in d["panels"]:
        for tgt in p.get("targets", []):
            yield p["title"], tgt["refId"], tgt["expr"]
        for sub in p.get("panels", []):     # collapsed rows keep their panels inside
            for tgt in sub.get("targets", []):
                yield sub["title"], tgt["refId"], tgt["expr"]


GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
LABEL_VALUES = re.compile(r"label_values\((.*),\s*(\w+)\)\s*$")


def substitute(expr, values):
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    for k in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${k}", values[k])
    return expr


def resolve_variables(port, d, deadline) -> dict:
    """Each query variable's label_values(), asked of Prometheus in order: the first value it has."""
    values = {}
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = LABEL_VALUES.match(q)
        assert m, f"variable {v['name']}: {q} is not label_values(selector, label)"
        sel, lab = substitute(m.group(1), values), m.group(2)
        while True:
            status, res = query(port, f"group by ({lab}) ({sel})")
            assert status == "success", f"variable {v['name']}: {res}"
            if res or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert res, f"variable {v['name']}: {q} has no values"
        values[v["name"]] = sorted(r["metric"][lab] for r in res)[0]
    return values


def test_promtool_checks_the_config_and_rules(stack):
    c = stack["check"]
    assert c.returncode == 0, c.stdout + c.stderr
    assert "SUCCESS: 5 rule files found" in c.stdout and c.stdout.count("SUCCESS") >= 7
    ex = sh(BINS["promtool"], "check", "config", os.path.join(MON, "prometheus", "prometheus.yml"), check=False)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    rules = sorted(os.path.join(MON, "prometheus", "rules", f) for f in os.listdir(os.path.join(MON, "prometheus", "rules")))
    r = sh(BINS["promtool"], "check", "rules", *rules, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_panel_query_answers_with_series(stack):
    port, d = stack["port"], dashboard()
    values = resolve_variables(port, d, stack["deadline"])
    assert values["node"] == "test-n01" and values["model"] == "doubler"
    queries = [(title, ref, substitute(e, values)) for title, ref, e in panel_queries(d)]
    assert len(queries) >= 40
    for e in (e for _, _, e in queries):
        assert "$" not in e, e
    pending = list(queries)
    while True:     # the first scrapes and rule evaluations land within seconds; wait for them, bounded
        bad = []
        for title, ref, e in pending:
            status, res = query(port, e)
            if status != "success":
                bad.append((title, ref, e, res))
            elif not res:
                bad.append((title, ref, e, "no series"))
        errors = [b for b in bad if b[3] != "no series"]
        assert not errors, "queries that error:\n" + "\n".join(map(str, errors))
        pending = [b[:3] for b in bad]
        if not pending or time.monotonic() > stack["deadline"]:
            break
        time.sleep(1)
    assert not pending, "panel queries without series:\n" + "\n".join(f"{t} [{r}]: {e}" for t, r, e in pending)


def test_rules_evaluate_and_only_the_replayed_xid_fires(stack):
    port = stack["port"]
    while True:
        groups = get(port, "/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        alerts = get(port, "/api/v1/alerts")["data"]["alerts"]
        fired = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
        if ("HkgpuGpuXid" in fired and all(
                not r.get("lastEvaluation", "0001").startswith("0001") for r in rules)) \
                or time.monotonic() > stack["deadline"]:
            break
        time.sleep(1)
    assert {g["name"] for g in groups} == {"hkgpu-thresholds", "hkgpu-node", "hkgpu-serving", "hkgpu-gpu", "hkgpu-network"}
    assert len(rules) == 41
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    xid = [a for a in alerts if a["labels"]["alertname"] == "HkgpuGpuXid"]
    assert [(a["labels"]["xid"], a["labels"]["gpu"], a["labels"]["node"], a["state"]) for a in xid] == \
        [("13", "0", "test-n01", "firing")]
    # a healthy, freshly exported node with a served model: nothing else
    assert fired == {"HkgpuGpuXid"}, fired


def test_every_metric_the_rules_and_dashboard_name_is_exported(stack):
    """A renamed series in the export or Triton would leave an alert silent: every hkgpu_tune_*, nv_*
    and node_* name the rules and the dashboard use is in Prometheus, but for these, which this
    stack cannot have."""
    absent_here = {
        "nv_gpu_utilization": "Triton's GPU metrics: no GPU here",
    }
    absent_prefix = ("DCGM_FI_",)   # dcgm-exporter's: no GPU here (its rule tests: promtool test rules)
    names = set(get(stack["port"], "/api/v1/label/__name__/values")["data"])
    exprs = [e for _, _, e in panel_queries(dashboard())]
    for f in sorted(os.listdir(os.path.join(MON, "prometheus", "rules"))):
        with open(os.path.join(MON, "prometheus", "rules", f)) as fh:
            exprs += [r["expr"] for g in yaml.safe_load(fh)["groups"] for r in g["rules"]]
    used = set(re.findall(r"\b((?:hkgpu_tune|nv|node)_[A-Za-z0-9_]+)", "\n".join(exprs)))
    assert set(re.findall(r"\b(DCGM_FI_[A-Z_]+)", "\n".join(exprs)))   # where dcgm-exporter runs
    used = {n for n in used if not n.startswith(absent_prefix)}
    assert len(used) > 30
    missing = used - names - set(absent_here)
    assert missing == set(), f"named by rules or dashboard, not exported: {sorted(missing)}"
