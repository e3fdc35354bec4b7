"""Independent checks of a tuned host, one per setting of its profile.

Each check reads the host with the host's own tools through testinfra (`sysctl -n`, `ip -j`,
`ethtool`, `tc -j`, /proc/irq, /sys, `nvidia-smi`) and compares with the profile's desired value
in code of its own. Nothing here uses hkgpu_tune's verify, compare, normalisation, matching or
backends: a bug there that says "ok" is still caught here (test_independent.py plants one to prove it).
The profile itself is input: the caller parses it with hkgpu_tune.core.profile.

    checks = plan(host, profile)          # [Check], ids like sysctl::host::net.ipv4.tcp_rmem
    for c in checks: c()                  # AssertionError naming current and desired, or pytest.skip
"""
from __future__ import annotations

import json
import re
import shlex
import uuid
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Callable

import pytest

# ethtool's legacy offload names (as `ethtool -k` prints them) and the kernel features behind each
OFFLOAD_NAME = {"gro": "generic-receive-offload", "gso": "generic-segmentation-offload",
                "tso": "tcp-segmentation-offload", "lro": "large-receive-offload", "rx_checksum": "rx-checksumming",
                "tx_checksum": "tx-checksumming", "sg": "scatter-gather", "rxhash": "receive-hashing"}
OFFLOAD_PARTS = {"tso": "tx-tcp*-segmentation", "tx_checksum": "tx-checksum-*", "sg": "tx-scatter-gather*"}


@dataclass
class Check:
    subsystem: str
    target: str
    key: str
    desired: Any
    run: Callable          # run(reader): raises AssertionError (or pytest.skip)
    reader: Any = None     # the host's Reader (set by plan)

    @property
    def id(self) -> str:
        return f"{self.subsystem}::{self.target}::{self.key}"

    def __call__(self):
        self.run(self.reader)


def _fail(what: str, current, desired, why: str = "differs"):
    raise AssertionError(f"{what}: {why}: current {current}, desired {desired}")


@dataclass
class Out:
    rc: int
    stdout: str


class Reader:
    """One host's command outputs, each read once per run: the commands the checks need are sent
    together in one shell call (an SSH round trip costs 0.3-0.5 s on a busy machine). Anything
    else (host.file, host.exists, ...) goes to the testinfra host itself.

    >>> r = Reader(host); r.want("sysctl -n vm.swappiness"); r.run("ip -j link show").rc   # doctest: +SKIP
    """

    def __init__(self, host):
        self.host, self.wanted, self.done = host, [], {}

    def __getattr__(self, name):
        return getattr(self.host, name)

    def want(self, *cmds: str) -> None:
        self.wanted += [c for c in cmds if c not in self.done and c not in self.wanted]

    def run(self, cmd: str) -> Out:
        if cmd not in self.done:
            self.want(cmd)
            self._fetch()
        return self.done[cmd]

    def _fetch(self) -> None:
        cmds, self.wanted = self.wanted, []
        mark = "@@hkinfra-" + uuid.uuid4().hex
        script = "".join(f"echo {mark} {i}; ( {c} ) 2>/dev/null; r=$?; echo; echo {mark} rc $r; "
                         for i, c in enumerate(cmds))
        text = self.host.run("sh -c %s", script).stdout
        for i, c in enumerate(cmds):
            start, end = f"{mark} {i}\n", f"\n{mark} rc "
            a = text.find(start)
            b = text.find(end, a)
            if a < 0 or b < 0:
                self.done[c] = Out(255, "")        # the batch was cut short: counts as a failed read
                continue
            rc = text[b + len(end):].split("\n", 1)[0]
            self.done[c] = Out(int(rc) if rc.isdigit() else 255, text[a + len(start):b][:-1])

    def sysctl(self, key: str) -> str:
        r = self.run(f"sysctl -n {shlex.quote(key)}")
        assert r.rc == 0, f"`sysctl -n {key}` exited {r.rc}"
        return r.stdout.strip()

    def cat(self, path: str) -> str | None:
        r = self.run(f"cat {shlex.quote(path)}")
        return r.stdout if r.rc == 0 else None


def _out(host, cmd: str) -> str:
    r = host.run(cmd)
    assert r.rc == 0, f"`{cmd}` exited {r.rc}"
    return r.stdout


def _tokens(v) -> list[str]:
    return str(v).split()


def _num(s: str):
    try:
        return int(s, 0)
    except ValueError:
        return None


def values_equal(current, desired) -> bool:
    a, b = _tokens(current), _tokens(desired)
    return len(a) == len(b) and all(
        (_num(x) == _num(y)) if _num(x) is not None and _num(y) is not None else x == y for x, y in zip(a, b))


def values_at_least(current, desired) -> bool:
    a, b = _tokens(current), _tokens(desired)
    return len(a) == len(b) and all(_num(x) is not None and _num(y) is not None and _num(x) >= _num(y)
                                    for x, y in zip(a, b))


def cpus(text: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}"""
    out = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


# ---------------------------------------------------------------- what the host has
def links(host) -> list[dict]:
    """Every interface but loopback: name, MACs, driver and bus address (ethtool -i), default route."""
    host.want("ip -j route show default", "ip -j link show", "cat /sys/devices/system/cpu/online")
    default = {r.get("dev") for r in json.loads(_out(host, "ip -j route show default") or "[]")}
    out, names, by_name = [], [], {}
    for ln in json.loads(_out(host, "ip -j link show")):
        if ln.get("link_type") == "loopback":
            continue
        name = ln["ifname"]
        by_name[name] = ln
        host.want(f"ethtool -i {shlex.quote(name)}")
        names.append(name)
    for name in names:
        ln = by_name[name]
        info = dict(line.split(": ", 1) for line in host.run(f"ethtool -i {shlex.quote(name)}").stdout.splitlines()
                    if ": " in line)
        out.append({"name": name, "macs": {ln.get("address", "").lower(), ln.get("permaddr", "").lower()} - {""},
                    "driver": info.get("driver") or None, "pci": info.get("bus-info") or None,
                    "default_route": name in default})
    return out


def matching(match, devs) -> list[dict]:
    def ok(d):
        name = match.name
        return all((not name or (fnmatchcase(d["name"], name) if set("*?[") & set(name) else d["name"] == name),
                    not match.mac or match.mac.lower() in d["macs"],
                    not match.driver or d["driver"] == match.driver,
                    not match.pci or (d["pci"] or "").lower().endswith(match.pci.lower()),
                    not match.default_route or d["default_route"]))
    return [d for d in devs if ok(d)]


def ethtool_table(host, flag: str, dev: str) -> tuple[dict, dict]:
    """`ethtool -l` / `-g`: (maximums, current), each {'rx': 2, 'tx': 2, 'combined': 0, ...}; n/a is 0."""
    r = host.run(f"ethtool {flag} {shlex.quote(dev)}")
    if r.rc != 0:
        return {}, {}
    maxi, cur, part = {}, {}, None
    for line in r.stdout.splitlines():
        if line.startswith("Pre-set maximums"):
            part = maxi
        elif line.startswith("Current hardware settings"):
            part = cur
        elif part is not None and ":" in line:
            k, v = (x.strip() for x in line.split(":", 1))
            part[k.lower()] = int(v) if v.isdigit() else 0
    return maxi, cur


def tx_queues(host, dev: str) -> int:
    return sum(1 for q in _out(host, f"ls /sys/class/net/{shlex.quote(dev)}/queues").split() if q.startswith("tx-"))


# ---------------------------------------------------------------- one check per setting
def sysctl_check(host, s) -> Check:
    host.want(f"sysctl -n {shlex.quote(s.key)}")

    def run(host):
        try:
            cur = " ".join(_tokens(host.sysctl(s.key)))   # `sysctl -n KEY`, as testinfra's host.sysctl
        except AssertionError:      # `sysctl -n KEY` failed: no such key here
            if s.optional:
                pytest.skip(f"{s.key}: not in this kernel or namespace (optional)")
            _fail(s.key, None, s.value, "no such sysctl here")
        if values_equal(cur, s.value) or (s.compare == "at_least" and values_at_least(cur, s.value)):
            return
        _fail(s.key, cur, s.value, "below the desired value" if s.compare == "at_least" else "differs")
    return Check("sysctl", "host", s.key, s.value, run)


def mtu_check(host, dev, mtu) -> Check:
    host.want(f"ip -j link show dev {shlex.quote(dev)}")

    def run(host):
        cur = json.loads(_out(host, f"ip -j link show dev {shlex.quote(dev)}"))[0]["mtu"]
        if cur != mtu:
            _fail(f"{dev} mtu", cur, mtu)
    return Check("link", dev, "mtu", mtu, run)


def table_checks(host, part: str, flag: str, dev: str, want: dict) -> list[Check]:
    maxi, _ = ethtool_table(host, flag, dev)
    want = {k: v for k, v in want.items() if v is not None}
    if part == "channels" and "combined" in want and not maxi.get("combined") and maxi.get("rx") and maxi.get("tx"):
        v = want.pop("combined")              # a driver with separate rx/tx queues only: those, the same count
        want.setdefault("rx", v)
        want.setdefault("tx", v)
    checks = []
    for k, v in want.items():
        def run(host, k=k, v=v):
            mx, cur = ethtool_table(host, flag, dev)
            if not mx.get(k):
                _fail(f"{dev} {part} {k}", None, v, f"`ethtool {flag}` shows no {k} {part} on this driver")
            desired = mx[k] if v == "max" else v
            if cur.get(k) != desired:
                _fail(f"{dev} {part} {k}", cur.get(k), desired)
        checks.append(Check("ethtool", dev, f"{part} {k}", v, run))
    return checks


def offload_check(host, dev: str, short: str, want: bool) -> Check:
    host.want(f"ethtool --json -k {shlex.quote(dev)}")

    def run(host):
        feats = json.loads(_out(host, f"ethtool --json -k {shlex.quote(dev)}"))[0]
        name = OFFLOAD_NAME[short]
        if name not in feats:
            _fail(f"{dev} {short}", None, want, f"`ethtool -k` shows no {name}")
        parts = {k: v for k, v in feats.items() if short in OFFLOAD_PARTS and fnmatchcase(k, OFFLOAD_PARTS[short])}
        changeable = {k: v["active"] for k, v in parts.items() if not v.get("fixed")}
        if changeable:
            off = sorted(k for k, on in changeable.items() if on != want)
            if off:
                _fail(f"{dev} {short}", {k: changeable[k] for k in off}, want, "differs")
        elif feats[name]["active"] != want:
            _fail(f"{dev} {short} ({name})", feats[name]["active"], want,
                  "fixed by the driver" if feats[name].get("fixed") else "differs")
    return Check("ethtool", dev, short, want, run)


def _handle(text: str) -> tuple[int, int]:
    """tc's 'MAJOR:MINOR' (hex, either may be empty) -> (major, minor)"""
    a, _, b = text.partition(":")
    return int(a or "0", 16), int(b or "0", 16)


def qdisc_checks(host, dev: str, kind: str) -> list[Check]:
    n = tx_queues(host, dev)
    host.want(f"tc -j qdisc show dev {shlex.quote(dev)}")

    def qdiscs(host):
        return json.loads(_out(host, f"tc -j qdisc show dev {shlex.quote(dev)}"))

    def root(host):
        q = [x for x in qdiscs(host) if x.get("root")]
        cur = q[0]["kind"] if q else None
        want = "mq" if n > 1 else kind
        if cur != want:
            _fail(f"{dev} root qdisc", cur, want, f"{n} transmit queue(s)")
    checks = [Check("qdisc", dev, "root", kind, root)]
    for i in range(1, n + 1 if n > 1 else 1):
        def queue(host, i=i):
            all_ = qdiscs(host)
            r = [x for x in all_ if x.get("root")]
            major = _handle(r[0]["handle"])[0] if r else None
            # the kernel's own mq is 0: and tc shows its queues as ":1", ":2", ...
            cur = [x["kind"] for x in all_ if "parent" in x and _handle(x["parent"]) == (major, i)]
            if cur != [kind]:
                _fail(f"{dev} queue {i} qdisc", cur or None, kind)
        checks.append(Check("qdisc", dev, f"queue {i}", kind, queue))
    return checks


def network_checks(host, net) -> list[Check]:
    devs, out, seen = links(host), [], set()
    for rule in net.interfaces:
        found = matching(rule.match, devs)
        if not found:
            if not rule.optional:
                def none(host, m=rule.match.describe()):
                    raise AssertionError(f"no interface matches {m}")
                out.append(Check("link", f"match {rule.match.describe()}", "present", True, none))
            continue
        for d in found:
            name = d["name"]
            new = []
            if rule.mtu is not None:
                new.append(mtu_check(host, name, rule.mtu))
            if rule.channels is not None:
                new += table_checks(host, "channels", "-l", name, vars(rule.channels))
            if rule.rings is not None:
                new += table_checks(host, "rings", "-g", name, vars(rule.rings))
            new += [offload_check(host, name, k, v) for k, v in rule.offloads.items()]
            if rule.qdisc:
                new += qdisc_checks(host, name, rule.qdisc)
            for c in new:
                if c.id not in seen:
                    seen.add(c.id)
                    out.append(c)
    return out


def irq_checks(host, aff) -> list[Check]:
    # NICs on a PCI device (ethtool's bus-info): virtual links have no interrupts to pin
    pci = re.compile(r"([0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
    devs = [d for d in links(host) if d["pci"] and pci.fullmatch(d["pci"])]
    out, pinned = [], []
    online = cpus(_out(host, "cat /sys/devices/system/cpu/online"))
    for rule in aff.nics:
        found = matching(rule.match, devs)
        if not found and not rule.optional:
            def none(host, m=rule.match.describe()):
                raise AssertionError(f"no PCI network interface matches {m}")
            out.append(Check("affinity", f"match {rule.match.describe()}", "irq_affinity", rule.irq_cpus, none))
        for d in found:
            base = f"/sys/bus/pci/devices/{d['pci']}"
            irqs = sorted(int(x) for x in host.run(f"ls {base}/msi_irqs").stdout.split() if x.isdigit())
            if rule.irq_cpus == "local":
                want = cpus(host.cat(f"{base}/local_cpulist") or "") & online or online
            else:
                want = cpus(rule.irq_cpus)
            host.want(*(f"cat /proc/irq/{irq}/smp_affinity_list" for irq in irqs))
            for irq in irqs:
                pinned.append(irq)

                def run(host, irq=irq, want=want):
                    cur = host.cat(f"/proc/irq/{irq}/smp_affinity_list")
                    if cur is None:
                        pytest.skip(f"IRQ {irq}: no /proc/irq entry")
                    cur = cur.strip()
                    if not cpus(cur) <= want:
                        _fail(f"IRQ {irq} ({d['name']})", cur, ",".join(map(str, sorted(want))), "outside the NIC's CPUs")
                out.append(Check("affinity", f"{d['name']} irq{irq}", "smp_affinity_list", sorted(want), run))
    if aff.irqbalance_ban:
        def banned(host, irqs=sorted(set(pinned))):
            for path in ("/etc/default/irqbalance", "/etc/sysconfig/irqbalance"):
                if host.file(path).exists:
                    text = host.file(path).content_string
                    missing = [i for i in irqs if f"--banirq={i}" not in text and f"--banirq {i}" not in text]
                    if missing:
                        _fail(path, "no --banirq for " + ",".join(map(str, missing)), irqs)
                    return
            if irqs:
                _fail("irqbalance", "no /etc/default/irqbalance", irqs, "pinned interrupts not banned")
        out.append(Check("affinity", "irqbalance", "banned_irqs", "pinned", banned))
    for s in aff.services:
        def placed(host, s=s):
            if not host.exists("nvidia-smi"):
                pytest.skip("no nvidia-smi on this host: no GPU to place services by")
            text = _out(host, f"nvidia-smi topo -C -i {int(s.gpu)}")
            want = cpus(text.split(":", 1)[1]) if ":" in text else set()
            pids = host.run(f"pgrep -x {shlex.quote(s.name)}").stdout.split()
            if not pids:
                pytest.skip(f"{s.name}: not running")
            for pid in pids:
                line = [x for x in host.file(f"/proc/{pid}/status").content_string.splitlines()
                        if x.startswith("Cpus_allowed_list:")][0]
                if not cpus(line.split(":", 1)[1]) <= want:
                    _fail(f"{s.name} pid {pid} cpus", line.split(":", 1)[1].strip(), sorted(want))
        out.append(Check("affinity", s.name, "cpus", s.gpu, placed))
    return out


GPU_QUERY = "index,persistence_mode,compute_mode,power.limit,clocks.applications.graphics,clocks.applications.memory"


SMI = f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits"


def gpu_rows(host) -> dict[int, dict] | None:
    """{index: {persistence_mode, compute_mode, ...}} from nvidia-smi; None without nvidia-smi."""
    r = host.run(SMI)
    if r.rc != 0:
        return None
    keys = GPU_QUERY.split(",")
    rows = [dict(zip(keys, (c.strip() for c in line.split(",")))) for line in r.stdout.splitlines() if line.strip()]
    return {int(x["index"]): x for x in rows}


def gpu_checks(host, gpu) -> list[Check]:
    """One check per GPU per setting (per setting when the host shows no GPU: skipped, saying why)."""
    wanted = [(k, getattr(gpu, k)) for k in ("persistence", "compute_mode", "power_limit_w", "application_clocks")
              if getattr(gpu, k, None) is not None]
    rows = gpu_rows(host)
    if rows is None:
        def none(host):
            pytest.skip("no nvidia-smi on this host (no GPU or driver)")
        return [Check("gpu", "gpu", k, v, none) for k, v in wanted]

    def make(idx, key, want):
        def run(host):
            row = (gpu_rows(host) or {}).get(idx)
            if row is None:
                _fail(f"gpu{idx}", None, key, "nvidia-smi no longer shows this GPU")
            if key == "persistence":
                if (row["persistence_mode"] == "Enabled") != want:
                    _fail(f"gpu{idx} persistence", row["persistence_mode"], "Enabled" if want else "Disabled")
            elif key == "compute_mode":
                if row["compute_mode"].lower() != str(want).lower():
                    _fail(f"gpu{idx} compute_mode", row["compute_mode"], want)
            elif key == "power_limit_w":
                pl = _num(row["power.limit"].split(".")[0])
                if pl != int(want):
                    _fail(f"gpu{idx} power limit (W)", row["power.limit"], want)
            else:
                cur = (row["clocks.applications.graphics"], row["clocks.applications.memory"])
                if cur != (str(want.sm), str(want.mem)):
                    _fail(f"gpu{idx} application clocks (MHz)", ",".join(cur), f"{want.sm},{want.mem}")
        return Check("gpu", f"gpu{idx}", key, want, run)
    idxs = sorted(rows) if gpu.gpus is None else list(gpu.gpus)
    return [make(i, k, v) for i in idxs for k, v in wanted]


def mps_checks(mps) -> list[Check]:
    def daemon(host):
        if gpu_rows(host) is None:
            pytest.skip("no nvidia-smi on this host (no GPU or driver)")
        running = bool(host.run("pgrep -x nvidia-cuda-mps-control").stdout.split())
        if running != mps.enabled:
            _fail("nvidia-cuda-mps-control", "running" if running else "stopped",
                  "running" if mps.enabled else "stopped")
        if mps.enabled and not host.file(mps.pipe_dir).is_directory:
            _fail("MPS pipe directory", None, mps.pipe_dir, "missing")
    return [Check("mps", "mps", "daemon", mps.enabled, daemon)]


def plan(host, profile) -> list[Check]:
    """Every setting of the profile as a check on this host (some read the host to know its queues
    and interrupts)."""
    host = Reader(host)
    out = [sysctl_check(host, s) for s in profile.sysctl]
    if profile.section("network"):
        out += network_checks(host, profile.network)
    if profile.section("affinity"):
        out += irq_checks(host, profile.section("affinity"))
    if profile.section("gpu"):
        out += gpu_checks(host, profile.section("gpu"))
    if profile.section("mps"):
        out += mps_checks(profile.section("mps"))
    for name in sorted(set(profile.sections) - {"sysctl", "network", "affinity", "gpu", "mps"}):
        def unchecked(host, name=name):
            pytest.skip(f"the {name} section has no independent check here yet")
        out.append(Check(name, "-", "section", None, unchecked))
    for c in out:
        c.reader = host
    return out
