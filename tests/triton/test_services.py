"""Several Triton services in one profile (triton.services), on the real CPU tritonserver: apply
starts and gates each, verify reads each on its own (targets name the unit), a stopped service is
drift of that service alone and apply starts it without touching the other, the CLI's per-service
commands take --unit, rollback stops both. The servers are read with a plain HTTP client and ss."""
from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from .conftest import dump, free_ports, needs_server, profile_dict

pytestmark = [needs_server, pytest.mark.slow]


def two_services(root) -> str:
    doc = profile_dict(root, free_ports(3), requests=32, concurrency=4)
    sec = doc["triton"]
    services = []
    for name in ("hk-svc-a", "hk-svc-b"):
        http_, grpc, metrics = free_ports(3)
        services.append({"unit": name, "supervisor": "process",
                         "model_repository": f"{root}/{name}/models", "run_dir": f"{root}/{name}/run",
                         "http": {"port": http_}, "grpc": {"port": grpc}, "metrics": {"port": metrics}})
    for key in ("model_repository", "run_dir", "http", "grpc", "metrics"):
        sec.pop(key)
    sec["services"] = services
    root.mkdir(parents=True, exist_ok=True)
    path = root / "profile.yaml"
    path.write_text(dump(doc))
    return str(path)


def hk(*args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hkgpu_tune", *args], capture_output=True, text=True,
                          timeout=timeout)


def infer(port: int) -> list:
    """OUTPUT0 of one request, by hand (JSON in and out)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                       "data": [1, 2, 3, 4]}]})
        c.request("POST", "/v2/models/doubler/infer", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, r.read()
        return json.loads(r.read())["outputs"][0]["data"]
    finally:
        c.close()


def gated(out: dict) -> list[str]:
    """The services whose gate kept the deployment, from apply's notes (one per gated service).
    Client-bound counts: on a loaded 2-CPU machine the gate's client, not the server, can miss
    (test_gate_client.py tests that verdict); a failed gate fails the apply instead."""
    units = []
    for n in out["notes"]:
        m = re.match(r"triton gate \((\S+)\) (passed|client-bound, deployment kept): ", n)
        assert m, n
        units.append(m.group(1))
    return sorted(units)


def listener(port: int) -> int | None:
    """The pid listening on the port, as ss sees it (None: nothing listens)."""
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"pid=(\d+)", out)
    return int(m.group(1)) if m else None


@pytest.mark.skipif(not shutil.which("ss"), reason="needs ss (iproute2) to read the listeners independently")
def test_two_services_apply_verify_and_drift_each_on_its_own(tmp_path):
    path = two_services(tmp_path / "node")
    state = str(tmp_path / "state")
    svc = yaml.safe_load(open(path))["triton"]["services"]
    ports = {s["unit"]: s["http"]["port"] for s in svc}
    try:
        p = hk("apply", "--only", "triton", "-p", path, "--state-dir", state, "--json")
        assert p.returncode == 0, p.stdout + p.stderr
        out = json.loads(p.stdout)
        assert not out["error"] and not out["rolled_back"], out
        # each service gated on its own, each note naming its unit
        assert gated(out) == ["hk-svc-a", "hk-svc-b"], out["notes"]
        pids = {u: listener(port) for u, port in ports.items()}
        assert all(pids.values()) and len(set(pids.values())) == 2, pids
        for port in ports.values():
            assert infer(port) == [2, 4, 6, 8]

        # verify: every result of each service, its targets naming the unit
        p = hk("verify", "--only", "triton", "-p", path, "--json")
        assert p.returncode == 0, p.stdout + p.stderr
        rows = json.loads(p.stdout)["results"]
        for unit in ports:
            mine = {r["key"] for r in rows if r["target"].startswith(unit)}
            assert {"repository", "service", "server_ready", "model_ready", "served_config", "metrics"} <= mine, rows
        assert {r["target"] for r in rows if r["key"] == "model_ready"} == {"hk-svc-a/doubler", "hk-svc-b/doubler"}

        # a per-service command without --unit names the services; with --unit it runs
        p = hk("triton", "gate", "-p", path)
        assert p.returncode == 1 and "2 triton services (hk-svc-a, hk-svc-b): name one with --unit" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
        p = hk("triton", "gate", "-p", path, "--unit", "hk-svc-c")
        assert p.returncode == 1 and "no triton service with unit 'hk-svc-c'" in p.stderr, p.stderr
        p = hk("triton", "stop", "-p", path, "--unit", "hk-svc-b")
        assert p.returncode == 0, p.stdout + p.stderr
        assert listener(ports["hk-svc-b"]) is None and listener(ports["hk-svc-a"]) == pids["hk-svc-a"]

        # health with triton_ready: one check per service, the stopped one failing by its unit
        doc = yaml.safe_load(open(path))
        doc["health"] = {"triton_ready": True, "xids": []}
        hpath = tmp_path / "node" / "health.yaml"
        hpath.write_text(dump(doc))
        p = hk("health", "--json", "--no-hooks", "-p", str(hpath), "--state-dir", str(tmp_path / "hstate"))
        checks = {c["target"]: c["status"] for c in json.loads(p.stdout)["checks"] if c["name"] == "triton_ready"}
        assert checks == {"hk-svc-a": "ok", "hk-svc-b": "failing"}, p.stdout
        assert p.returncode == 2 and json.loads(p.stdout)["status"] == "degraded", p.stdout + p.stderr

        # the stopped service is drift of its own; the other is ok
        p = hk("verify", "--only", "triton", "-p", path, "--json")
        assert p.returncode == 2, p.stdout + p.stderr
        bad = {(r["target"], r["key"]) for r in json.loads(p.stdout)["results"] if r["status"] != "ok"}
        assert bad and all(t.startswith("hk-svc-b") for t, _ in bad), bad
        assert ("hk-svc-b", "service") in bad, bad

        # apply starts it again, the other server untouched (same pid, never restarted)
        p = hk("apply", "--only", "triton", "-p", path, "--state-dir", state, "--json")
        assert p.returncode == 0, p.stdout + p.stderr
        assert gated(json.loads(p.stdout)) == ["hk-svc-b"], p.stdout
        assert listener(ports["hk-svc-a"]) == pids["hk-svc-a"]
        assert listener(ports["hk-svc-b"]) not in (None, pids["hk-svc-b"])
        assert infer(ports["hk-svc-b"]) == [2, 4, 6, 8]

        # a change to one service's model: that server reloads it and is gated, the other is not touched
        doc = yaml.safe_load(open(path))
        doc["triton"]["services"][0]["models"] = [dict(doc["triton"]["models"][0], dynamic_batching={
            "max_queue_delay_microseconds": 1000})]
        open(path, "w").write(dump(doc))
        p = hk("plan", "--only", "triton", "-p", path, "--json")
        assert p.returncode == 2, p.stdout + p.stderr
        planned = {(c["target"], c["key"]) for c in json.loads(p.stdout)["changes"]}
        assert planned == {("hk-svc-a/doubler", "repository"), ("hk-svc-a/doubler", "served_config")}, planned
        p = hk("apply", "--only", "triton", "-p", path, "--state-dir", state, "--json")
        assert p.returncode == 0, p.stdout + p.stderr
        assert gated(json.loads(p.stdout)) == ["hk-svc-a"], p.stdout
        assert listener(ports["hk-svc-a"]) == pids["hk-svc-a"]   # a hot reload, no restart
        for unit, delay in (("hk-svc-a", 1000), ("hk-svc-b", 20000)):
            c = http.client.HTTPConnection("127.0.0.1", ports[unit], timeout=10)
            c.request("GET", "/v2/models/doubler/config")
            served = json.loads(c.getresponse().read())
            c.close()
            assert served["dynamic_batching"]["max_queue_delay_microseconds"] == delay, (unit, served)

        # a change to the other whose gate cannot pass: the apply fails and puts its model back
        doc["triton"]["services"][1].update(
            models=[dict(doc["triton"]["models"][0], dynamic_batching={"max_queue_delay_microseconds": 3000})],
            gate={"ready_timeout_s": 60, "warmup_requests": 2, "load": {"requests": 16, "concurrency": 4},
                  "p99_ms": 0.001})
        open(path, "w").write(dump(doc))
        p = hk("apply", "--only", "triton", "-p", path, "--state-dir", state, "--json")
        assert p.returncode != 0, p.stdout + p.stderr
        out = json.loads(p.stdout)
        assert out["error"].startswith("triton gate (hk-svc-b) failed: doubler: p99 latency "), out
        c = http.client.HTTPConnection("127.0.0.1", ports["hk-svc-b"], timeout=10)
        c.request("GET", "/v2/models/doubler/config")
        assert json.loads(c.getresponse().read())["dynamic_batching"]["max_queue_delay_microseconds"] == 20000
        c.close()
        assert listener(ports["hk-svc-a"]) == pids["hk-svc-a"]

        # rollback: neither ran before the first apply, so both stop
        p = hk("rollback", "--state-dir", state, "-p", path, "--json")
        assert p.returncode == 0, p.stdout + p.stderr
        assert listener(ports["hk-svc-a"]) is None and listener(ports["hk-svc-b"]) is None
    finally:
        for unit in ports:
            hk("triton", "stop", "-p", path, "--unit", unit)
