"""Helpers of tests/gpu/run_multi_gpu.sh: everything the multi-GPU run checks, for any number of GPUs.

    python3 tests/gpu/multi_gpu.py profile OUT      # profile of this host's current GPU values (+ mps, triton)
    python3 tests/gpu/multi_gpu.py topo OUT         # affinity subsystem vs `nvidia-smi topo -m`, per GPU
    python3 tests/gpu/multi_gpu.py mps-clients OUT  # one CPU-pinned torch client per GPU through the running MPS
    python3 tests/gpu/multi_gpu.py triton OUT       # requests over all instances; each instance's CPU mask
    python3 tests/gpu/multi_gpu.py record OUT       # facts + the /sys,/proc tree as a replayable fixture
    python3 tests/gpu/multi_gpu.py settings FILE    # the GPU settings (nvidia-smi) as CSV

Never writes a GPU setting: NVML and nvidia-smi are only read. The MPS daemon and Triton are
started and stopped by the shell script through `hkgpu-tune`; this file only uses them.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))

from hkgpu_tune.backends.topology import format_cpulist, parse_cpulist  # noqa: E402

SETTINGS = ("index,pci.bus_id,persistence_mode,compute_mode,mig.mode.current,ecc.mode.current,power.limit,"
            "clocks.applications.graphics,clocks.applications.memory")
BASE = "/tmp/hkgpu-multi"                  # MPS and Triton directories (the GPU machine's rules: under /tmp)
MPS_PIPE, MPS_LOG = f"{BASE}/mps/pipe", f"{BASE}/mps/log"
MODEL = "pinned"


def _backends():
    from hkgpu_tune.backends import Backends
    return Backends()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def md_table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join("" if c is None else str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ nvidia-smi topo -m
def parse_topo(text: str) -> dict:
    """`nvidia-smi topo -m` -> {"columns": [...], "gpus": {0: {"cpus": [..] | None, "cpus_text": str,
    "numa": int | None, "gpu_numa_id": str | None, "links": {"GPU1": "NV18", "NIC0": "PXB"}}}}.

    The matrix is tab separated and its header row starts with a blank cell; the link columns (GPUn,
    NICn) come first, then "CPU Affinity", "NUMA Affinity" and (newer drivers) "GPU NUMA ID", which
    rows print after an extra tab. "N/A" (no NUMA node) reads as None. ANSI underlining, NIC rows
    and the legend are skipped.
    """
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    lines = [ansi.sub("", ln.rstrip("\n")) for ln in text.splitlines()]
    head_i = next((i for i, ln in enumerate(lines) if "CPU Affinity" in ln), None)
    if head_i is None:
        raise ValueError("no 'CPU Affinity' column in the nvidia-smi topo -m output")

    def cells(ln: str) -> list[str]:
        parts = ln.split("\t") if "\t" in ln else re.split(r"\s{2,}", ln)
        return [p.strip() for p in parts]

    head = [c for c in cells(lines[head_i]) if c]
    k = head.index("CPU Affinity")
    out = {"columns": head, "gpus": {}}
    for ln in lines[head_i + 1:]:
        if ln.strip().startswith("Legend"):
            break
        c = cells(ln)
        if not c or not re.fullmatch(r"GPU\d+", c[0]):
            continue   # NIC rows, blank lines
        vals = c[1:]
        cpu = vals[k] if len(vals) > k else "N/A"
        numa = vals[k + 1] if len(vals) > k + 1 else "N/A"
        rest = [v for v in vals[k + 2:] if v]
        out["gpus"][int(c[0][3:])] = {
            "cpus": None if cpu in ("N/A", "") else parse_cpulist(cpu),
            "cpus_text": cpu,
            "numa": None if numa in ("N/A", "") else int(numa),
            "gpu_numa_id": rest[-1] if rest and "GPU NUMA ID" in head else None,
            "links": {h: v for h, v in zip(head[:k], vals[:k])},
        }
    return out


def compare(pl: dict, tp: dict | None, nodes: dict[int, list[int]], allc: list[int]) -> tuple[str, str]:
    """The library's placement of one GPU against its `nvidia-smi topo -m` row: ("MATCH", note) or
    ("MISMATCH", why). topo's CPU affinity is NVML's; the placement narrows it to the GPU's node."""
    if tp is None:
        return "MISMATCH", "GPU missing from nvidia-smi topo -m"
    want_cpus = tp["cpus"] if tp["cpus"] is not None else allc
    if tp["numa"] is not None and nodes.get(tp["numa"]):
        want_cpus = sorted(set(want_cpus) & set(nodes[tp["numa"]])) or want_cpus
    why, note = [], ""
    if sorted(pl["cpus"]) != sorted(want_cpus):
        why.append(f"cpus {format_cpulist(pl['cpus'])} != {format_cpulist(want_cpus)}")
    if pl["numa_node"] != tp["numa"]:
        # topo derives "NUMA Affinity" from the CPU affinity; the library takes the GPU's own node (NVML,
        # else sysfs numa_node) and binds no memory when the firmware reports none. On a host with a
        # single node both mean "node 0, where all memory is": equivalent.
        if pl["numa_node"] is None and list(nodes) == [tp["numa"]]:
            note = (f"equivalent: the library reports no NUMA node (firmware gives the GPU none), "
                    f"topo derives node {tp['numa']} from the CPU affinity; the host has only that node")
        else:
            why.append(f"numa {pl['numa_node']} != {tp['numa']}")
    return ("MISMATCH", "; ".join(why)) if why else ("MATCH", note)


def topo(out: str) -> int:
    from hkgpu_tune.backends.procfs import SysFs
    from hkgpu_tune.backends.topology import numa_nodes, online_cpus, pci_device, service_placement, sysfs_pci
    r = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True)
    if r.returncode != 0 or "CPU Affinity" not in r.stdout:
        print(f"nvidia-smi topo -m failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[:500]}")
        print("AFFINITY-VS-TOPO: TOPO-UNAVAILABLE")
        return 1
    text = r.stdout
    _write(f"{out}/topo-m.txt", text)
    t = parse_topo(text)
    b = _backends()
    fs = SysFs("/")
    rows, doc, bad = [], [], 0
    try:
        n = b.nvml.count()
        nodes = numa_nodes(fs)
        allc = online_cpus(fs)
        for i in range(n):
            pl = service_placement(b, i)
            g = b.nvml.gpu(i, ("pci_bus_id", "cpu_affinity", "numa_node", "nvlink_peers"))
            dev = pci_device(fs, sysfs_pci(g["pci_bus_id"]))
            tp = t["gpus"].get(i)
            verdict, why = compare(pl, tp, nodes, allc)
            bad += verdict != "MATCH"
            links = tp["links"] if tp else {}
            nv = sorted({v for k, v in links.items() if v.startswith("NV")})
            rows.append([i, g["pci_bus_id"], format_cpulist(pl["cpus"]), pl["numa_node"],
                         format_cpulist(g.get("cpu_affinity") or []), g.get("numa_node"),
                         dev["numa_node"], format_cpulist(dev["local_cpus"]),
                         tp["cpus_text"] if tp else None, tp["numa"] if tp else None,
                         f"{sum(v.startswith('NV') for v in links.values())} GPUs {'/'.join(nv)}".strip()
                         if links else "-", len(g.get("nvlink_peers") or []), verdict, why or pl["source"]])
            doc.append({"gpu": i, "placement": pl, "nvml": g, "sysfs": dev, "topo": tp, "verdict": verdict,
                        "why": why})
    finally:
        b.close()
    head = ["GPU", "PCI", "placement CPUs", "placement NUMA", "NVML CPUs", "NVML NUMA", "sysfs NUMA",
            "sysfs local CPUs", "topo CPU Affinity", "topo NUMA Affinity", "topo NVLink", "NVML NVLink links",
            "verdict", "why / source"]
    table = md_table(head, rows)
    _write(f"{out}/affinity-vs-topo.md", table)
    with open(f"{out}/affinity-vs-topo.json", "w") as f:
        json.dump({"topo": t, "gpus": doc}, f, indent=1, default=str)
    print(table)
    for r in rows:
        print(f"GPU{r[0]}: {r[-2]} placement {r[2]} node {r[3]} vs topo {r[8]} node {r[9]} ({r[-1]})")
    print("AFFINITY-VS-TOPO:", "ALL-MATCH" if not bad else f"{bad} MISMATCH")
    return 0 if not bad else 1


# ------------------------------------------------------------------ profile of this host
def free_ports(n: int) -> list[int]:
    from hkgpu_tune.serve.running import client
    return client.free_ports(n)


def profile_doc(gpus: list[dict], place: dict[int, dict], ports=(8000, 8001, 8002)) -> tuple[dict, list[str]]:
    """The profile (as a dict) for GPUs whose NVML values are `gpus` and whose placements are `place`:
    gpu: this host's current values (GPU 0's; the keys where other GPUs differ are returned), mps: every
    GPU with its directories under /tmp, triton: one Python-backend instance per GPU (KIND_GPU, gpus
    [0..N-1]) whose model pins each instance to the CPUs in the parameter cpus_gpu<N>."""
    n = len(gpus)
    g0 = gpus[0]
    gpu = {"gpus": "all", "persistence": g0["persistence"], "compute_mode": g0["compute_mode"], "pcie_check": True}
    if g0.get("power_limit_w"):
        gpu["power_limit_w"] = int(round(g0["power_limit_w"]))
    ac = g0.get("app_clocks_mhz") or {}
    if ac.get("sm") and ac.get("mem"):
        gpu["application_clocks"] = {"sm": ac["sm"], "mem": ac["mem"]}
    differ = [f"gpu{g['index']} {k}" for g in gpus[1:] for k in ("persistence", "compute_mode", "power_limit_w")
              if g.get(k) != g0.get(k)]
    differ += [f"gpu{g['index']} app_clocks_mhz" for g in gpus[1:]
               if {k: (g.get("app_clocks_mhz") or {}).get(k) for k in ("sm", "mem")}
               != {k: ac.get(k) for k in ("sm", "mem")}]
    http, grpc, metrics = ports
    params = {f"cpus_gpu{i}": {"string_value": ",".join(map(str, p["cpus"]))} for i, p in sorted(place.items())}
    params["delay_ms"] = {"string_value": "20"}
    doc = {
        "name": f"multi-gpu-host-{n}",
        "gpu": gpu,
        "mps": {"enabled": True, "pipe_dir": MPS_PIPE, "log_dir": MPS_LOG, "gpus": "all",
                "default_active_thread_percentage": 50,
                "default_pinned_mem_limit": ",".join(f"{i}=16G" for i in range(n))},
        "affinity": {"nics": [{"match": {"default_route": True}, "irq_cpus": "local", "optional": True}],
                     "irqbalance_ban": False},
        "triton": {
            "server": "pytriton", "model_repository": f"{BASE}/triton/models", "run_dir": f"{BASE}/triton/run",
            "gpu": None,   # the server sees every GPU; each instance pins itself to its GPU's CPUs
            "user": "root",   # named: the GPU machine has no unprivileged server user
            "http": {"port": http}, "grpc": {"port": grpc}, "metrics": {"port": metrics},
            "models": [{
                "name": MODEL, "backend": "python", "model_file": os.path.join(HERE, "data", "pinned_model.py"),
                "max_batch_size": 8,
                "inputs": [{"name": "INPUT0", "data_type": "FP32", "dims": [4]}],
                "outputs": [{"name": "OUTPUT0", "data_type": "FP32", "dims": [4]},
                            {"name": "GPU", "data_type": "INT32", "dims": [1]},
                            {"name": "PID", "data_type": "INT32", "dims": [1]}],
                "dynamic_batching": {"max_queue_delay_microseconds": 500},
                "instance_group": [{"count": 1, "kind": "KIND_GPU", "gpus": list(range(n))}],
                "config": {"parameters": params},
            }],
            "gate": {"ready_timeout_s": 300, "warmup_requests": 4, "load": {"requests": 40 * n, "concurrency": 2 * n},
                     "p99_ms": 5000, "stop_timeout_s": 60},
        },
    }
    return doc, differ


def profile(out: str) -> int:
    """Write OUT/profile-host.yaml (profile_doc of this host) and OUT/placement.json."""
    import yaml
    from hkgpu_tune.backends.topology import service_placement
    b = _backends()
    try:
        n = b.nvml.count()
        gpus = [b.nvml.gpu(i, ("persistence", "compute_mode", "app_clocks_mhz", "power_limit_w", "pci_bus_id"))
                for i in range(n)]
        place = {i: service_placement(b, i) for i in range(n)}
    finally:
        b.close()
    doc, differ = profile_doc(gpus, place, free_ports(3))
    path = f"{out}/profile-host.yaml"
    _write(path, "# generated by tests/gpu/multi_gpu.py profile: this host's current GPU values\n"
           + yaml.safe_dump(doc, sort_keys=False))
    with open(f"{out}/placement.json", "w") as f:
        json.dump(place, f, indent=1)
    print(f"wrote {path} ({n} GPUs)")
    for i, p in place.items():
        print(f"  GPU{i} {gpus[i]['pci_bus_id']}: CPUs {format_cpulist(p['cpus'])} NUMA node {p['numa_node']} "
              f"({p['source']})")
    if differ:
        print("NOTE: the GPUs' settings differ from GPU 0's (verify reports them as drift):", ", ".join(differ))
    return 0


# ------------------------------------------------------------------ MPS: one client per GPU
CLIENT = r"""
import os, sys, time
cpus = {int(c) for c in sys.argv[1].split(",")}
for tid in os.listdir("/proc/self/task"):
    os.sched_setaffinity(int(tid), cpus)
import torch
t0 = time.monotonic()
x = torch.ones(1 << 22, device="cuda")
s = float((x * 2).sum().item())
torch.cuda.synchronize()
print(f"READY gpu={sys.argv[2]} pid={os.getpid()} sum={s:.0f} devname={torch.cuda.get_device_name(0)} "
      f"cuda_s={time.monotonic() - t0:.2f} cpus={sorted(os.sched_getaffinity(0))[:3]}", flush=True)
sys.stdin.read()          # hold the context until the test releases it (closes stdin)
print("DONE", flush=True)
"""


def mps_clients(out: str) -> int:
    from hkgpu_tune.backends.mps import MpsControl, mps_env
    place = {int(k): v for k, v in json.load(open(f"{out}/placement.json")).items()}
    n = len(place)
    env0 = {**os.environ, **mps_env(MPS_PIPE, MPS_LOG), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    procs, t0 = {}, time.monotonic()
    for i in range(n):
        env = {**env0, "CUDA_VISIBLE_DEVICES": str(i)}
        procs[i] = subprocess.Popen([sys.executable, "-c", CLIENT, ",".join(map(str, place[i]["cpus"])), str(i)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
    ready, rc = {}, 0
    for i, p in procs.items():
        line = p.stdout.readline().strip()
        ready[i] = line
        if not line.startswith("READY"):
            rc = 1
    up_s = time.monotonic() - t0
    mps = MpsControl()
    seen = {}
    try:
        seen["get_server_list"] = mps.send(MPS_PIPE, "get_server_list")
        for srv in seen["get_server_list"].split():
            seen[f"get_device_client_list {srv}"] = mps.send(MPS_PIPE, f"get_device_client_list {srv}")
            seen[f"get_server_status {srv}"] = mps.send(MPS_PIPE, f"get_server_status {srv}")
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on to release the clients
        seen["error"] = str(e)
        rc = 1
    smi = _smi("--query-compute-apps=gpu_bus_id,pid,process_name,used_memory")
    masks = {}
    for i, p in procs.items():
        try:
            masks[i] = _mask(p.pid)
        except OSError:
            masks[i] = ["?"]
    for i, p in procs.items():
        try:
            o, e = p.communicate("", timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        if p.returncode != 0 or "DONE" not in o:
            rc = 1
            print(f"client gpu{i} rc={p.returncode} stderr tail: {e.strip()[-600:]}")
    rows = []
    for i in range(n):
        want = format_cpulist(place[i]["cpus"])
        ok = ready[i].startswith("READY") and masks[i] == [want]
        rc |= not ok
        rows.append([i, want, ",".join(masks[i]), ready[i][:120], "ok" if ok else "FAIL"])
    table = md_table(["GPU", "placement CPUs", "client threads' Cpus_allowed_list", "client says", "status"], rows)
    print(table)
    print(f"{n} clients up in {up_s:.2f} s (torch import + CUDA context through MPS, in parallel)")
    for k, v in seen.items():
        print(f"mps {k}: {v!r}")
    print("nvidia-smi compute apps while the clients held their contexts:\n" + smi)
    _write(f"{out}/mps-clients.md", table + f"\nclients up in {up_s:.2f} s\n\n```\n"
           + "\n".join(f"{k}: {v}" for k, v in seen.items()) + "\n" + smi + "```\n")
    print("MPS-CLIENTS:", "OK" if rc == 0 else "FAIL")
    return rc


# ------------------------------------------------------------------ Triton: requests over every instance
def _smi(query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _mask(pid: int) -> list[str]:
    out = set()
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add(open(f"/proc/{pid}/task/{t}/status").read().split("Cpus_allowed_list:")[1].split()[0])
        except (OSError, IndexError):
            continue
    return sorted(out)


def triton(out: str, name: str = "") -> int:
    import numpy as np
    from hkgpu_tune.core.profile import load_profile
    from hkgpu_tune.serve.running import client, launch
    t = load_profile(f"{out}/profile-host.yaml").section("triton")
    place = {int(k): v for k, v in json.load(open(f"{out}/placement.json")).items()}
    n = len(place)
    hits: dict[int, dict] = {}
    errors: list[str] = []
    lock = threading.Lock()
    wrong = []

    def worker(k: int, count: int):
        c = client.Client(t.http.host, t.http.port, timeout=30)
        try:
            for j in range(count):
                x = np.full((1, 4), float(k * 1000 + j), dtype=np.float32)
                try:
                    y, gpu, pid = _infer(c, x)
                except Exception as e:  # noqa: BLE001
                    with lock:
                        errors.append(str(e))
                    continue
                with lock:
                    if not np.allclose(y, 2 * x):
                        wrong.append((k, j))
                    h = hits.setdefault(int(gpu), {"requests": 0, "pids": set()})
                    h["requests"] += 1
                    h["pids"].add(int(pid))
        finally:
            c.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k, 12)) for k in range(3 * n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    secs = time.monotonic() - t0
    st = launch._load_state(t) or {}
    server_pid = st.get("pid")
    # which GPU each process holds a context on, as the driver sees it (NVML index <- PCI bus id)
    bus = dict(ln.split(", ")[::-1] for ln in _smi("--query-gpu=index,pci.bus_id").splitlines() if ", " in ln)
    on_gpu: dict[int, set] = {}
    for ln in _smi("--query-compute-apps=gpu_bus_id,pid").splitlines():
        if ", " in ln:
            b_, pid_ = ln.split(", ")[:2]
            if b_ in bus and pid_.strip().isdigit():
                on_gpu.setdefault(int(bus[b_]), set()).add(int(pid_))
    rows, rc = [], 0
    for i in range(n):
        h = hits.get(i, {"requests": 0, "pids": set()})
        want = format_cpulist(place[i]["cpus"])
        masks = {p: _mask(p) for p in sorted(h["pids"])}
        ok = h["requests"] > 0 and len(h["pids"]) == 1 and all(m == [want] for m in masks.values())
        seen = "n/a (no pids listed)" if not on_gpu else \
            ("yes" if h["pids"] and h["pids"] <= on_gpu.get(i, set()) else "NO")
        ok = ok and seen != "NO"
        rc |= not ok
        rows.append([i, h["requests"], ",".join(map(str, h["pids"])) or "-",
                     "; ".join(",".join(m) for m in masks.values()) or "-", want, place[i]["numa_node"], seen,
                     "ok" if ok else "FAIL"])
    table = md_table(["GPU", "requests answered", "instance pid", "instance threads' Cpus_allowed_list",
                      "placement CPUs", "NUMA node", "nvidia-smi: pid on this GPU", "status"], rows)
    stubs = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if open(f"/proc/{pid}/comm").read().strip().startswith("triton_python"):
                    stubs.append(int(pid))
            except OSError:
                pass
    extra = (f"{sum(h['requests'] for h in hits.values())} requests from {3 * n} threads in {secs:.2f} s, "
             f"{len(errors)} failed, {len(wrong)} wrong answers; server pid {server_pid} threads' CPUs "
             f"{_mask(server_pid) if server_pid else '?'} (placement: {st.get('placement', {}).get('source')}); "
             f"{len(stubs)} Python-backend stub processes")
    if errors or wrong:
        rc = 1
    print(table)
    print(extra)
    if errors:
        print("first error:", errors[0])
    try:
        counts = client.model_counts(t.metrics.host, t.metrics.port, MODEL)
        print("metrics:", counts)
        extra += f"; metrics {counts}"
    except Exception as e:  # noqa: BLE001
        print("metrics:", e)
    _write(f"{out}/triton-instances{'-' + name if name else ''}.md", table + "\n" + extra + "\n")
    print("TRITON-INSTANCES:", "OK" if rc == 0 else "FAIL")
    return rc


def _infer(c, x):
    """One request -> (OUTPUT0, GPU, PID), from the binary outputs (a size that does not fit the
    shape, as an empty GPU output once was, fails the reshape)."""
    import numpy as np
    h = c.infer(MODEL, [("INPUT0", "FP32", list(x.shape), x.tobytes())], outputs=("OUTPUT0", "GPU", "PID"))
    v = {o["name"]: np.frombuffer(o["raw"], dtype={"FP32": np.float32, "INT32": np.int32}[o["datatype"]])
         .reshape(o["shape"]) for o in h["outputs"]}
    return v["OUTPUT0"], v["GPU"].ravel()[0], v["PID"].ravel()[0]


# ------------------------------------------------------------------ fixture: facts + tree
def record(out: str) -> int:
    """facts of gpu/mps/affinity (the h200.json layout) and, for the unit tests' replay, the same
    host in the layout of dgx-h100-8gpu.json ({"source", "gpu", "tree": {"files", "links"}})."""
    from tests.gpu.record_h200 import record as record_tree
    facts, tree, count = record_tree(f"{out}/profile-host.yaml", f"{out}/multi-gpu-tree.tar.gz")
    n = len(facts["gpu"].get("gpus", []))
    files, links = {}, {}   # the tree as tests/gpu_unit/conftest.materialize takes it
    for d, dirs, fnames in os.walk(tree):
        for name in dirs + fnames:
            p = os.path.join(d, name)
            rel = "/" + os.path.relpath(p, tree)
            if os.path.islink(p):
                links[rel] = os.readlink(p)
            elif os.path.isfile(p):
                files[rel] = open(p, errors="replace").read()
    with open(f"{out}/multi-gpu-facts.json", "w") as f:
        json.dump(facts, f, indent=1, default=str)
    with open(f"{out}/multi-gpu-fixture.json", "w") as f:
        json.dump({"source": f"recorded by tests/gpu/run_multi_gpu.sh on the device tool's {n}-GPU machine, "
                             f"{time.strftime('%Y-%m-%d', time.gmtime())}",
                   "gpu": facts["gpu"], "tree": {"files": files, "links": links}}, f, indent=1, default=str)
    print(f"recorded {count} paths; {n} GPUs; wrote multi-gpu-facts.json, multi-gpu-fixture.json, multi-gpu-tree.tar.gz")
    return 0


VARIANTS = {
    # Triton places one instance on each GPU of the group; the outputs go back as numpy (host) arrays
    "gpu-numpy": {"kind": "KIND_GPU", "output_mode": "numpy"},
    # the same, the outputs handed over as GPU tensors (DLPack)
    "gpu-dlpack": {"kind": "KIND_GPU", "output_mode": "dlpack"},
    # N CPU instances, instance k drives GPU k itself (for servers whose GPU instances do not answer)
    "cpu-instances": {"kind": "KIND_CPU", "output_mode": "numpy"},
}


def variant(out: str, name: str) -> int:
    """Rewrite the triton model of OUT/profile-host.yaml to one of VARIANTS."""
    import yaml
    path = f"{out}/profile-host.yaml"
    doc = yaml.safe_load(open(path))
    m = doc["triton"]["models"][0]
    n = len(json.load(open(f"{out}/placement.json")))
    v = VARIANTS[name]
    params = m["config"]["parameters"]
    params["output_mode"] = {"string_value": v["output_mode"]}
    params.pop("gpus", None)
    if v["kind"] == "KIND_GPU":
        m["instance_group"] = [{"count": 1, "kind": "KIND_GPU", "gpus": list(range(n))}]
    else:
        m["instance_group"] = [{"count": n, "kind": "KIND_CPU"}]
        params["gpus"] = {"string_value": str(n)}
    _write(path, f"# generated by tests/gpu/multi_gpu.py (triton variant {name})\n" + yaml.safe_dump(doc, sort_keys=False))
    print(f"triton variant {name}: instance_group {m['instance_group']}, outputs as {v['output_mode']}")
    return 0


def settings(path: str) -> int:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={SETTINGS}", "--format=csv"], capture_output=True,
                         text=True, check=True).stdout
    _write(path, out)
    print(out, end="")
    return 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit({"profile": profile, "topo": topo, "mps-clients": mps_clients, "triton": triton, "record": record,
              "settings": settings, "variant": variant}[cmd](*args))
