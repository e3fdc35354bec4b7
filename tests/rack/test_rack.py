"""Roles and playbooks on a simulated rack over real SSH (tests/rack/simrack.py).

Order matters: a bad profile and a canary that does not verify first (the rest of the rack is
still pristine), then converge, re-run, testinfra, drift, check mode, rollback, and last a canary
whose Triton gate fails (it leaves the canary converged).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

import simrack
from simrack import REPO, snapshot

from hkgpu_tune.fleet.rack import host_line, run_playbook
from tests.helpers import run_testinfra

pytestmark = [pytest.mark.slow, pytest.mark.root]
SETTINGS_PER_HOST = 16   # 7 sysctls, mtu, channels rx+tx, gro/gso/tso, qdisc root + 2 queues


def play(rack, action, **kw):
    extra = dict(rack["extra"], **kw.pop("extra", {}))
    return run_playbook(action, rack["inventory"], extravars=extra, **kw)


def test_bad_profile_fails_in_first_batch_and_leaves_the_rest_untouched(rack):
    bad = {"hkgpu_network_interfaces": [{"match": {"name": "eth0"}, "mtu": 90000}]}
    run = play(rack, "apply", extra=bad)
    first, rest = rack["hosts"][0], rack["hosts"][1:]
    assert run.failed_hosts == [first]
    assert "network.interfaces[0].mtu: expected an integer 68-65535, got 90000" in run.hosts[first].msg
    for h in rest:   # never reached: the canary batch failed
        assert h not in run.hosts or (run.hosts[h].ok, run.hosts[h].changed) == (0, 0)
    for h in rack["hosts"]:   # and nothing changed anywhere, the canary included
        assert snapshot(h) == rack["originals"][h], h


# Another agent on the host re-applies /etc/sysctl.d, in order, whenever a file there changes
# (as a path unit running systemd-sysctl would); only per-namespace keys are in the files here.
SYSCTL_AGENT = """
sum() { cat /etc/sysctl.d/*.conf 2>/dev/null | cksum; }
last=$(sum)
echo ready
while sleep 0.05; do
  now=$(sum)
  [ "$now" = "$last" ] && continue
  for f in /etc/sysctl.d/*.conf; do sysctl -q -p "$f"; done
  last=$now
done
"""
LOCAL_CONF = "/etc/sysctl.d/99-local.conf"


def test_canary_that_fails_verify_after_apply_stops_the_roll_out(rack):
    """The canary's apply goes through, then an old local sysctl file that sorts after the tool's
    60-hkgpu-tune.conf is re-applied by an agent there: the whole-node verify of the canary's batch
    finds the drift, and the play ends before the next batch touches any other host."""
    first, rest = rack["hosts"][0], rack["hosts"][1:]
    key = "net.ipv4.tcp_fin_timeout"
    local = rack["originals"][first][key]                # the value the operator's old file pins
    simrack.nsexec(first, "sh", "-c", f"printf '{key} = {local}\\n' > {LOCAL_CONF}")
    agent = subprocess.Popen(["ip", "netns", "exec", first, "sh", "-c", SYSCTL_AGENT], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    events = []
    try:
        assert agent.stdout.readline() == "ready\n"
        run = play(rack, "apply", on_event=events.append)
    finally:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.wait(timeout=10)
        simrack.nsexec(first, "rm", "-f", LOCAL_CONF)
    ran = [(e["event_data"]["host"], e["event_data"].get("task"), e["event"]) for e in events
           if e.get("event", "").startswith("runner_on_") and "host" in (e.get("event_data") or {})]
    # the apply itself went through on the canary (the setting read back right after it) ...
    assert (first, "Apply the network and kernel settings", "runner_on_ok") in ran, ran
    applied = next(e["event_data"]["res"] for e in events if e.get("event") == "runner_on_ok"
                   and e["event_data"].get("task") == "Apply the network and kernel settings")
    assert applied["changed"] and not applied["failures"], applied
    # ... the verify of its batch failed, naming the check and the key ...
    assert run.rc != 0 and run.failed_hosts == [first], {h: r.msg for h, r in run.hosts.items()}
    failed = [(h, t) for h, t, k in ran if k == "runner_on_failed"]
    assert failed == [(first, "Verify the whole node after a change")], failed
    msg = run.hosts[first].msg
    assert msg.startswith("verify: 1 setting(s) failed") and f"{key}: drift: current {local}, desired 15" in msg, msg
    assert [(f["key"], f["status"]) for f in run.hosts[first].failures] == [(key, "drift")]
    assert host_line(run.hosts[first]).endswith(f": verify: sysctl host {key}: {local} != 15")
    assert snapshot(first)[key] == local                 # read with sysctl: the agent did revert it
    # ... and the next batch was never started: no task ran on any other host, nothing changed there
    assert [h for h, _, _ in ran if h != first] == []
    for h in rest:
        assert h not in run.hosts or (run.hosts[h].ok, run.hosts[h].changed) == (0, 0), h
        assert snapshot(h) == rack["originals"][h], h


def test_converge(rack):
    run = play(rack, "apply")
    assert run.rc == 0, {h: r.msg for h, r in run.hosts.items()}
    assert sorted(run.hosts) == rack["hosts"]
    for h, r in run.hosts.items():
        assert r.changed > 0 and not r.is_failed, h
        assert len(r.results) == SETTINGS_PER_HOST and not r.failures, (h, r.failures)
    s = snapshot(rack["hosts"][1])
    assert "mtu 9000" in s["link"] and s["net.ipv4.tcp_fin_timeout"] == "15"
    for h in rack["hosts"]:   # hkgpu-tune on PATH (the role's bin dir, per simulated host): the venv's
        link = os.path.join(rack["dir"], h, "bin", "hkgpu-tune")
        assert os.readlink(link) == os.path.join(rack["dir"], h, "opt", "hkgpu-tune", "bin", "hkgpu-tune"), h
        r = simrack.nsexec(h, link, "verify", "--profile", "/etc/hkgpu-tune/node.yaml", "--json", check=False)
        assert r.returncode == 0 and json.loads(r.stdout)["failures"] == [], r.stdout[-2000:] + r.stderr


def unit_export(rack, host):
    """Run the verify service's ExecStart lines (health, then export) as systemd would; the textfile."""
    unit = simrack.nsexec(host, "cat", "/etc/systemd/system/hkgpu-tune-verify.service").stdout
    env = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("Environment=")]
    starts = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert [a.lstrip("-").split()[1] for a in starts] == ["health", "export"]
    argv = starts[1].split()
    prom = os.path.join(rack["dir"], host, "textfile", "hkgpu-tune.prom")
    assert argv[argv.index("--textfile-dir") + 1] == os.path.dirname(prom)   # the inventory's, per host
    r = simrack.nsexec(host, "env", *env, *argv, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return prom


def test_the_boot_unit_verifies_the_node(rack):
    host = rack["hosts"][0]
    assert "/etc/systemd/system/hkgpu-tune-verify.service" in simrack.nsexec(
        host, "readlink", "/etc/systemd/system/multi-user.target.wants/hkgpu-tune-verify.service").stdout
    with open(unit_export(rack, host)) as f:
        text = f.read()
    assert 'key="net.ipv4.tcp_fin_timeout"' in text and "hkgpu_tune_failures 0" in text


def test_second_run_changes_nothing(rack):
    run = play(rack, "apply")
    assert run.rc == 0
    assert {h: r.changed for h, r in run.hosts.items()} == {h: 0 for h in rack["hosts"]}


def test_testinfra_passes_on_every_host(rack):
    r = run_testinfra(rack["inventory"], timeout=300)
    expected = SETTINGS_PER_HOST * len(rack["hosts"])
    assert r.returncode == 0 and f"{expected} passed" in r.stdout, r.stdout[-3000:]


def test_drift_reported_for_that_host_and_key_only(rack):
    host = rack["hosts"][2]
    simrack.nsexec(host, "sysctl", "-qw", "net.ipv4.tcp_fin_timeout=33")
    run = play(rack, "verify")
    assert run.failed_hosts == [host]
    assert [(f["subsystem"], f["key"], f["current"], f["desired"]) for f in run.hosts[host].failures] == \
        [("sysctl", "net.ipv4.tcp_fin_timeout", "33", "15")]
    assert "net.ipv4.tcp_fin_timeout: drift: current 33, desired 15" in run.hosts[host].msg
    # the same through the CLI: per-host JSON, exit 2 (drift only)
    cli = subprocess.run([sys.executable, "-m", "hkgpu_tune", "rack", "verify", "--inventory", rack["inventory"],
                          "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert cli.returncode == 2, cli.stderr[-2000:]
    doc = json.loads(cli.stdout)
    assert [h for h, r in doc["hosts"].items() if r["failed"]] == [host]
    assert [f["key"] for f in doc["hosts"][host]["failures"]] == ["net.ipv4.tcp_fin_timeout"]


TIMER = "/etc/systemd/system/hkgpu-tune-verify.timer"
TIMER_LINK = "/etc/systemd/system/timers.target.wants/hkgpu-tune-verify.timer"


def test_check_mode_reports_the_fix_and_changes_nothing(rack):
    """The drifted sysctl, an edited unit and a missing wants link: each reported with its diff, none written."""
    host = rack["hosts"][2]
    simrack.nsexec(host, "sed", "-i", "s/^AccuracySec=.*/AccuracySec=1s/", TIMER)
    simrack.nsexec(host, "rm", TIMER_LINK)
    before = simrack.nsexec(host, "sha1sum", TIMER).stdout
    # with the verify on every run too: in check mode the roles only plan, so it must not fail the drifted host
    run = play(rack, "apply", check=True, extra={"hkgpu_verify_always": True})
    assert run.rc == 0, {h: r.msg for h, r in run.hosts.items()}
    # the sysctl, the unit and the link
    assert {h: r.changed for h, r in run.hosts.items()} == {h: 3 if h == host else 0 for h in rack["hosts"]}
    diffs = {d["task"]: d["diff"] for d in run.hosts[host].diffs}
    unit = next(d for t, d in diffs.items() if TIMER in t and "link" not in t.lower())
    assert "-AccuracySec=1s\n+AccuracySec=10s\n" in unit, diffs
    link = next(d for t, d in diffs.items() if TIMER_LINK in t)
    assert '-  "state": "absent"' in link and '+  "state": "link"' in link, link
    assert any("net.ipv4.tcp_fin_timeout" in d for d in diffs.values()), diffs
    # nothing written: read with the system's tools
    assert snapshot(host)["net.ipv4.tcp_fin_timeout"] == "33"
    assert simrack.nsexec(host, "sha1sum", TIMER).stdout == before
    assert simrack.nsexec(host, "test", "-L", TIMER_LINK, check=False).returncode == 1
    fixed = play(rack, "apply", extra={"hkgpu_verify_always": True})
    assert fixed.rc == 0, {h: r.msg for h, r in fixed.hosts.items()}
    assert fixed.hosts[host].changed == 3 and snapshot(host)["net.ipv4.tcp_fin_timeout"] == "15"
    assert "AccuracySec=10s" in simrack.nsexec(host, "cat", TIMER).stdout
    assert TIMER in simrack.nsexec(host, "readlink", TIMER_LINK).stdout


def test_tags_limit_the_subsystems(rack):
    host = rack["hosts"][1]
    simrack.nsexec(host, "sysctl", "-qw", "net.ipv4.tcp_fin_timeout=44")
    simrack.nsexec(host, "ethtool", "-K", "eth0", "gro", "off")
    run = play(rack, "apply", tags="ethtool")
    assert run.hosts[host].changed == 1
    s = snapshot(host)
    assert s["net.ipv4.tcp_fin_timeout"] == "44"          # sysctl was not in the run
    assert "generic-receive-offload: on" in s["features"]
    play(rack, "apply", tags="sysctl")
    assert snapshot(host)["net.ipv4.tcp_fin_timeout"] == "15"


def test_one_bad_node_does_not_stop_the_rest_of_its_batch(rack):
    """Past the canary, a failing node below max_fail_percentage leaves the others converging."""
    bad, good = rack["hosts"][-1], rack["hosts"][1:-1]
    for h in good:
        simrack.nsexec(h, "sysctl", "-qw", "net.ipv4.tcp_fin_timeout=55")
    hv = os.path.join(os.path.dirname(rack["inventory"]), "host_vars")
    os.makedirs(hv, exist_ok=True)
    with open(os.path.join(hv, f"{bad}.yml"), "w") as f:       # this node's profile has an error
        f.write("hkgpu_network_interfaces: [{match: {name: eth0}, mtu: 90000}]\n")
    try:
        pct = 100 // (len(rack["hosts"]) - 1) + 1          # one host of the second batch
        run = play(rack, "apply", extra={"hkgpu_max_fail_percentage": pct})
    finally:
        os.unlink(os.path.join(hv, f"{bad}.yml"))
    assert run.failed_hosts == [bad] and "got 90000" in run.hosts[bad].msg
    for h in good:
        assert run.hosts[h].changed == 1 and snapshot(h)["net.ipv4.tcp_fin_timeout"] == "15", h


def test_rollback_restores_the_originals(rack):
    prom = unit_export(rack, rack["hosts"][0])
    assert os.path.isfile(prom)
    run = play(rack, "rollback")
    assert run.rc == 0 and not run.failed_hosts
    for h in rack["hosts"]:
        assert snapshot(h) == rack["originals"][h], h
    state = json.dumps(os.listdir(os.path.join(rack["dir"], rack["hosts"][0], "var/lib/hkgpu-tune")))
    assert "state.json" not in state and "persist.json" not in state
    # the export timer and what the hkgpu_verify role wrote for it are gone too
    left = simrack.nsexec(rack["hosts"][0], "sh", "-c", "ls -d /etc/systemd/system/hkgpu-tune-verify.* "
                          "/etc/systemd/system/*.wants/hkgpu-tune-verify.* /etc/hkgpu-tune/export.env 2>/dev/null",
                          check=False).stdout.split()
    assert left == [] and not os.path.lexists(prom), (left, prom)


def test_canary_that_fails_the_gate_stops_the_roll_out(rack):
    """The canary's Triton service starts, but its latency gate fails: the operator's batching delay
    is 200000 us where 200 us was meant (every request waits 200 ms for a batch, against a p99 SLO
    of 50 ms; the server's own time misses, not the gate's client). The canary fails naming the
    gate, its service is rolled back, and no task runs on any other host. Through `hkgpu-tune rack
    apply` in a pipe, as in a CI log. Last in the file: it leaves the canary's network applied."""
    pytest.importorskip("pytriton", reason="needs the nvidia-pytriton wheel (its tritonserver)")
    first, rest = rack["hosts"][0], rack["hosts"][1:]
    before = {h: snapshot(h) for h in rest}
    node = os.path.join(rack["dir"], first)
    model = os.path.join(REPO, "tests", "triton", "data", "doubler.py")
    hv = os.path.join(os.path.dirname(rack["inventory"]), "host_vars")
    os.makedirs(hv, exist_ok=True)
    with open(os.path.join(hv, f"{first}.yml"), "w") as f:
        f.write(f"""\
# root by name and no user created: a simulated host shares this machine's /etc/passwd
hkgpu_triton_user: root
hkgpu_triton_create_user: false
hkgpu_triton_gpu: null
hkgpu_triton_supervisor: process
hkgpu_triton_model_repository: {node}/triton/models
hkgpu_triton_run_dir: {node}/triton/run
hkgpu_triton_metrics: {{port: 8002, address: 127.0.0.1}}
hkgpu_triton_files: [{{src: {model}, dest: {node}/triton/doubler.py}}]
hkgpu_triton_models:
  - name: doubler
    backend: python
    model_file: {node}/triton/doubler.py
    max_batch_size: 16
    inputs: [{{name: INPUT0, data_type: FP32, dims: [4]}}]
    outputs: [{{name: OUTPUT0, data_type: FP32, dims: [4]}}]
    dynamic_batching: {{max_queue_delay_microseconds: 200000}}
    instance_group: [{{count: 1, kind: KIND_CPU}}]
hkgpu_triton_gate: {{ready_timeout_s: 120, warmup_requests: 2, load: {{requests: 16, concurrency: 2}}, p99_ms: 50}}
""")
    try:   # the command an operator runs, its output in a log (a pipe)
        cli = subprocess.run([sys.executable, "-m", "hkgpu_tune", "rack", "apply", "--inventory", rack["inventory"]],
                             capture_output=True, text=True, cwd=REPO, timeout=600)
    finally:
        os.unlink(os.path.join(hv, f"{first}.yml"))
        left = _tritonservers(first)
        for pid in left:                      # started by this test's play: stop them by their id
            os.kill(int(pid), signal.SIGKILL)
    assert cli.returncode == 1, cli.stdout[-3000:] + cli.stderr[-2000:]
    lines = unwrap(cli.stdout)
    # a line per host and task as it finished: only the canary's, the last one the failed gate
    tasks = [ln for ln in lines if ln.startswith(tuple(h + " " for h in rack["hosts"]))]
    assert tasks and all(ln.startswith(first + " ") for ln in tasks), tasks
    assert tasks[-1] == f"{first} failed: Render the model repository and start the Triton service", tasks
    # the canary's line names the gate and what it measured; the run had one host
    host = next(ln for ln in lines if ln.startswith(first + ": failed "))
    assert "triton gate failed: doubler: p99 latency " in host and "over the SLO of 50 ms" in host, host
    assert re.fullmatch(r"site\.yml: 1 host\(s\), 1 failed, \d+\.\d s", lines[-1]), lines[-3:]
    assert left == [], f"the failed gate left tritonserver running: {left}"
    for h in rest:
        assert snapshot(h) == before[h], h


def unwrap(text: str) -> list[str]:
    """Lines as printed before the CLI wrapped them at 80 columns (continuations are indented 4)."""
    out: list[str] = []
    for ln in text.splitlines():
        if ln.startswith("    ") and out:
            out[-1] += " " + ln.strip()
        else:
            out.append(ln)
    return out


def _tritonservers(ns: str) -> list[str]:
    """Ids of the tritonserver processes in a simulated host's namespace (read with ip and /proc)."""
    out = []
    for pid in simrack.sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "tritonserver":
                    out.append(pid)
        except OSError:
            pass
    return out
