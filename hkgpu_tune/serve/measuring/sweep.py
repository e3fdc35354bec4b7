"""`hkgpu-tune triton sweep`: the job of Triton's Model Analyzer, on the real server.

A server of the sweep's own (the profile's triton section on free loopback ports, its own copy of
the repository, explicit model control) is started, so the running service is never touched.
Each config (max_batch_size and preferred sizes, max_queue_delay_microseconds, instance count,
MPS on/off where the profile has an mps section) is loaded through the repository API with the
config as a parameter, then loaded with the load generator at rising concurrency until p99 passes
the SLO. The best config is the highest throughput whose p99 is within the SLO.

>>> rep = run(t, "resnet50", Grid(max_batch=[32, 64], delay_us=[500], instances=[1, 2]),
...           slo_ms=15, budget_s=300)                                     # doctest: +SKIP
>>> rep.best.label                                                          # doctest: +SKIP
'max_batch 64, delay 500 us, 2 instances'
"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import itertools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.serve.running import client
from hkgpu_tune.serve.measuring import loadgen, plain, plain_grpc

# the independent plain client of each protocol: the same run(host, port, ...) and figures
PLAIN = {"http": plain, "grpc": plain_grpc}
PER_LEVEL_OVERHEAD_S = 1.5   # process start and the warm-up part of each load run


@dataclass
class Grid:
    max_batch: list[int] = field(default_factory=list)      # [] = the profile's value
    delay_us: list[int] = field(default_factory=list)
    instances: list[int] = field(default_factory=list)
    preferred: list[str] = field(default_factory=list)      # "none" | "max" | "8,16" ...
    mps: list[bool] = field(default_factory=list)           # [] = as the profile (on if it has mps)
    concurrency: list[int] = field(default_factory=lambda: [8, 32, 128])


@dataclass
class Point:
    config: dict
    label: str
    mps: bool
    loads: list[dict] = field(default_factory=list)
    best: dict | None = None          # the best load within the SLO
    error: str = ""
    load_s: float = 0.0               # seconds the model took to load (CUDA graphs captured)
    confirmed: bool | None = None     # the chosen point's longer load held the SLO (None: not run)

    def to_dict(self) -> dict:
        return {"label": self.label, "mps": self.mps, "config": self.config, "loads": self.loads,
                "best": self.best, "error": self.error, "load_s": round(self.load_s, 2), "confirmed": self.confirmed}


@dataclass
class Report:
    model: str
    slo_ms: float
    budget_s: float
    points: list[Point] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    best: Point | None = None
    seconds: float = 0.0
    date: str = ""
    transport: str = "http-binary"
    check: dict | None = None          # the best load against the plain client's (plain.compare)

    def to_dict(self) -> dict:
        return {"model": self.model, "slo_ms": self.slo_ms, "budget_s": self.budget_s, "date": self.date,
                "seconds": round(self.seconds, 1), "points": [p.to_dict() for p in self.points],
                "skipped": self.skipped, "best": self.best.to_dict() if self.best else None,
                "transport": self.transport, "check": self.check}


# ---------------------------------------------------------------- configs
def preferred_choices(v: str) -> list[str]:
    """--preferred: choices of preferred sizes separated by ';' ("none;max;8,16")."""
    return [x.strip() for x in v.split(";") if x.strip()]


def _parse_preferred(v: str, max_batch: int) -> list[int] | None:
    if v == "none":
        return None
    if v == "max":
        return [max_batch]
    out = sorted({int(x) for x in v.split(",") if x.strip()})
    if not out or any(x < 1 for x in out):
        raise HkError(f"triton sweep: preferred sizes {v!r}: expected none, max or a list like 8,16")
    return out


def configs(model, grid: Grid, mps_available: bool) -> list[tuple[dict, str, bool]]:
    """Every (config, label, mps) of the grid, the profile's own config first."""
    base = copy.deepcopy(model.config)
    if not base.get("max_batch_size"):
        raise HkError(f"triton sweep: model {model.name} has no max_batch_size: nothing to batch")
    cur_delay = int(base.get("dynamic_batching", {}).get("max_queue_delay_microseconds", 0))
    groups = base.get("instance_group") or [{"count": 1}]
    cur_inst = int(groups[0].get("count", 1))
    mps_opts = grid.mps or ([True] if mps_available else [False])
    if any(mps_opts) and not mps_available:
        raise HkError("triton sweep: MPS asked for, but the profile has no mps section or its daemon is not running")
    out, seen = [], set()
    # MPS outermost: the sweep's server restarts only when it flips
    for mps, mb, delay, inst, pref in itertools.product(mps_opts, grid.max_batch or [base["max_batch_size"]],
                                                         grid.delay_us or [cur_delay],
                                                         grid.instances or [cur_inst],
                                                         grid.preferred or ["profile"]):
        if mb < 1 or delay < 0 or inst < 1:
            raise HkError(f"triton sweep: max_batch {mb}, delay {delay} us and instances {inst} must be positive")
        cfg = copy.deepcopy(base)
        cfg["max_batch_size"] = mb
        db = dict(cfg.get("dynamic_batching") or {})
        db["max_queue_delay_microseconds"] = delay
        if pref != "profile":
            p = _parse_preferred(pref, mb)
            if p is None:
                db.pop("preferred_batch_size", None)
            else:
                db["preferred_batch_size"] = [x for x in p if x <= mb] or [mb]
        elif db.get("preferred_batch_size"):
            db["preferred_batch_size"] = [x for x in db["preferred_batch_size"] if int(x) <= mb] or [mb]
        cfg["dynamic_batching"] = db
        gs = copy.deepcopy(groups)
        gs[0]["count"] = inst
        cfg["instance_group"] = gs
        label = f"max_batch {mb}, delay {delay} us, {inst} instance{'s' if inst > 1 else ''}"
        if db.get("preferred_batch_size"):
            label += f", preferred {','.join(str(x) for x in db['preferred_batch_size'])}"
        if mps_available:
            label += ", MPS" if mps else ", no MPS"
        key = json.dumps(cfg, sort_keys=True) + str(mps)
        if key not in seen:
            seen.add(key)
            out.append((cfg, label, mps))
    return out


# ---------------------------------------------------------------- the sweep's own server
SWEEP_EXIT_S = 10.0


def sweep_section(t, workdir: str, mps: bool):
    """The profile's triton section, moved to free loopback ports and a repository of its own."""
    from hkgpu_tune.serve.schema.config import Endpoint
    http, grpc, metrics = client.free_ports(3)
    kw = dict(http=Endpoint(http), grpc=Endpoint(grpc), metrics=Endpoint(metrics),
              model_repository=os.path.join(workdir, "models"), run_dir=os.path.join(workdir, "run"),
              supervisor="process", launch="binary", unit=f"{t.unit}-sweep",
              # a config that failed to load stays a "live model" tritonserver waits its whole exit
              # timeout for at stop; this server has no clients of its own left to drain by then
              gate=dataclasses.replace(t.gate, stop_timeout_s=min(t.gate.stop_timeout_s, SWEEP_EXIT_S)))
    if hasattr(t, "mps") and not mps:
        kw["mps"] = None
    return dataclasses.replace(t, **kw)


def mps_running(t) -> bool:
    m = getattr(t, "mps", None)
    return bool(m) and os.path.exists(os.path.join(m.pipe_dir, "control"))


class Server:
    """A tritonserver of the sweep's own; stopped (no process left) on close."""

    def __init__(self, t, workdir: str, mps: bool, backends=None):
        from hkgpu_tune.serve.repository import render
        from hkgpu_tune.serve.running import launch
        self.launch = launch
        self.t = sweep_section(t, workdir, mps)
        self.b = backends
        render.write_repository(self.t, backends)
        t0 = time.monotonic()
        launch.start(self.t, backends)
        try:
            launch.wait_ready(self.t, backends)
        except BaseException:
            self.close()
            raise
        self.ready_s = time.monotonic() - t0
        self.c = client.Client(self.t.http.host, self.t.http.port, timeout=max(60.0, self.t.gate.ready_timeout_s),
                               grpc=(self.t.grpc.host, self.t.grpc.port))

    def load(self, name: str, cfg: dict) -> float:
        """Load `name` with `cfg` (no restart); returns seconds. Raises HkError with Triton's reason."""
        t0 = time.monotonic()
        self.c.load_model(name, cfg)
        return time.monotonic() - t0

    def close(self) -> None:
        try:
            self.c.close()
        except AttributeError:
            pass
        rep = self.launch.stop(self.t, self.b)
        if rep.get("left"):
            raise HkError(f"triton sweep: server processes left after stop: {rep['left']}")


# ---------------------------------------------------------------- the load
def spec_for(t, model, concurrency: int, duration_s: float, processes: int | None, shm: bool,
             protocol: str = "http") -> loadgen.LoadSpec:
    """One load: every input of the model (shared memory holds the first only), every output in binary,
    `processes` load-generator processes (None: as the gate sizes them for this many in flight), over
    HTTP or gRPC (`protocol`)."""
    req = client.request_for(model)
    name, dt, shape, _ = req[0]
    return loadgen.LoadSpec(t.http.host, t.http.port, model.name, name, dt, shape, None, concurrency=concurrency,
                            processes=loadgen.processes_for(concurrency, processes),
                            duration_s=duration_s, warmup_s=min(1.0, duration_s / 4),
                            metrics_port=t.metrics.port, shm=shm, request=None if shm else req,
                            protocol=protocol, grpc_port=t.grpc.port)


REFINE_STEPS = 2   # extra loads that bisect between the highest passing and lowest failing level


def measure(server: Server, model, point: Point, levels: list[int], duration_s: float, processes: int,
            shm: bool, slo_ms: float, log=None, protocol: str = "http") -> None:
    """Ramp through levels until p99 passes the SLO; halve below the lowest level when even it is
    over; then bisect between the highest level within the SLO and the lowest over it, so the
    answer does not depend on how coarse the levels were (96 over, 48 within: try 72, then 60 or 84)."""
    def one(conc: int) -> bool:
        nonlocal failed_err
        r = loadgen.run(spec_for(server.t, model, conc, duration_s, processes, shm, protocol))
        point.loads.append(r)
        if log:
            log(f"  {point.label}, {conc} in flight: {loadgen.line(r)}")
        within = r["errors"] == 0 and r["p99_ms"] <= slo_ms and r["requests"] > 0
        if within and (point.best is None or r["img_s"] > point.best["img_s"]):
            point.best = r
        failed_err = failed_err or bool(r["errors"])
        return within

    passed, failed, failed_err = 0, None, False
    for conc in levels:
        if one(conc):
            passed = conc          # levels ascend
        else:
            failed = conc
            break   # more load only adds queueing
    conc, halvings = min(levels), 0
    while point.best is None and point.loads and not point.loads[-1]["errors"] and conc > 1 and halvings < 3:
        conc, halvings = conc // 2, halvings + 1
        if one(conc):
            passed = conc
        else:
            failed = conc
    for _ in range(REFINE_STEPS):
        if not passed or failed is None or failed_err:
            break   # nothing fits, nothing failed, or a load had errors (a broken server)
        if failed - passed <= max(1, passed // 8):
            break   # close enough: within an eighth
        mid = (passed + failed) // 2
        if one(mid):
            passed = mid
        else:
            failed = mid


CONFIRM_STEPS = 3   # a confirming load over the SLO steps the load down a fifth, at most this often


def confirm(server: Server, model, point: Point, confirm_s: float, processes: int, shm: bool, slo_ms: float,
            log=None, protocol: str = "http") -> None:
    """Measure the chosen level again with one longer load: on the H200 the p99 of 2.5 s loads
    understated that of the served 10 s load by 3 to 5 ms (docs/perf, 2026-12-03). Over the SLO,
    step the load down a fifth and measure again. The point's best becomes the load that held."""
    conc = point.best["concurrency"]
    point.confirmed = False
    for _ in range(CONFIRM_STEPS):
        r = loadgen.run(spec_for(server.t, model, conc, confirm_s, processes, shm, protocol))
        r["confirm"] = True
        point.loads.append(r)
        if log:
            log(f"  {point.label}, {conc} in flight, confirming over {confirm_s:g} s: {loadgen.line(r)}")
        if r["errors"] == 0 and r["requests"] > 0 and r["p99_ms"] <= slo_ms:
            point.best, point.confirmed = r, True
            return
        if r["errors"] or conc <= 1:
            return
        conc = max(1, conc * 4 // 5)


def check(server: Server, model, point: Point, seconds: float, protocol: str = "http") -> dict:
    """The chosen load against the independent plain client (over gRPC: tritonclient's own client,
    plain_grpc) at the same config and in-flight count: img/s and p99 ratios (the load generator's
    over the plain client's). Under 0.9 of its img/s, the load generator, not the server, limited the sweep."""
    b = point.best
    req = [(n, dt, shape) for n, dt, shape, _ in client.request_for(model)]
    client_of = PLAIN[protocol]
    ep = getattr(server.t, client_of.ENDPOINT)
    r = client_of.run(ep.host, ep.port, model.name, req, b["concurrency"], processes=b["processes"],
                      duration_s=seconds)
    return plain.compare(b, r)


CHECK_MIN_RATIO = 0.9


def run(t, model_name: str, grid: Grid, slo_ms: float, budget_s: float, duration_s: float = 5.0,
        processes: int | None = None, shm: bool = False, backends=None, log=print, verbose: bool = False,
        confirm_s: float | None = None, check_s: float | None = None, protocol: str = "http") -> Report:
    """Sweep the grid on a server of the sweep's own, then confirm the best with a longer load
    (confirm_s, default 3 x duration_s; 0: none) and check that load against the plain client
    (check_s, default duration_s; 0: none); raises HkError when nothing fits the SLO."""
    confirm_s = 3 * duration_s if confirm_s is None else confirm_s
    check_s = duration_s if check_s is None else check_s
    model = t.model(model_name)
    if slo_ms is None or slo_ms <= 0:
        raise HkError("triton sweep: no p99 SLO (give --slo-ms or the profile's gate.p99_ms)")
    mps_ok = mps_running(t)
    todo = configs(model, grid, mps_ok)
    levels = sorted(set(grid.concurrency))
    per_load = duration_s + min(1.0, duration_s / 4) + PER_LEVEL_OVERHEAD_S
    if budget_s < per_load * len(levels):
        raise HkError(f"triton sweep: a budget of {budget_s:g} s is too small: one config alone needs about "
                      f"{per_load * len(levels):.0f} s ({len(levels)} load levels of {duration_s:g} s)")
    reserve = (confirm_s + PER_LEVEL_OVERHEAD_S if confirm_s > 0 else 0.0) + (
        check_s + 2 * PER_LEVEL_OVERHEAD_S if check_s > 0 else 0.0)
    rep = Report(model_name, slo_ms, budget_s, date=datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), transport="grpc" if protocol == "grpc" else "http+shm" if shm else "http-binary")
    t0 = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="hkgpu-sweep-")
    server, server_mps = None, None
    try:
        for i, (cfg, label, mps) in enumerate(todo):
            spent = time.monotonic() - t0
            est = (spent / len(rep.points)) if rep.points else per_load * len(levels)
            if rep.points and spent + est + reserve > budget_s:   # leave time to confirm the best
                rep.skipped = [lb for _, lb, _ in todo[i:]]
                log(f"budget: {len(rep.skipped)} config(s) left unmeasured")
                break
            if server is None or server_mps != mps:
                if server is not None:
                    server.close()
                server = None
                server = Server(t, workdir, mps, backends)
                server_mps = mps
                log(f"sweep server ready in {server.ready_s:.1f} s ({'MPS' if mps else 'no MPS'})")
            point = Point(cfg, label, mps)
            rep.points.append(point)
            try:
                point.load_s = server.load(model_name, cfg)
                if log and verbose:
                    log(f"{label}: loaded in {point.load_s:.1f} s")
            except HkError as e:
                point.error = str(e)
                log(f"{label}: {e}")
                continue
            measure(server, model, point, levels, duration_s, processes, shm, slo_ms, log if verbose else None,
                    protocol)
            b = point.best
            log(f"{label}: " + (f"{b['img_s']:.0f} img/s at p99 {b['p99_ms']:.2f} ms (concurrency {b['concurrency']})"
                                if b else f"nothing within p99 {slo_ms:g} ms "
                                f"(lowest load: p99 {point.loads[0]['p99_ms']:.2f} ms)"))
        fits = [p for p in rep.points if p.best]
        if fits:
            rep.best = max(fits, key=lambda p: (p.best["img_s"], -p.best["p99_ms"]))
        if rep.best and (confirm_s > 0 or check_s > 0):
            best, before = rep.best, rep.best.best
            reload = best is not rep.points[-1]   # the server holds the last point's config
            try:
                if server_mps != best.mps:
                    server.close()
                    server = None
                    server = Server(t, workdir, best.mps, backends)
                    server_mps, reload = best.mps, True
                if reload:
                    server.load(model_name, best.config)
                if confirm_s > 0:
                    confirm(server, model, best, confirm_s, processes, shm, slo_ms, log if verbose else None,
                            protocol)
            except HkError as e:
                best.confirmed = False
                log(f"{best.label}: confirming failed: {e}")
            else:
                if confirm_s > 0:
                    log(f"{best.label}: " + (
                        f"confirmed over {confirm_s:g} s: {best.best['img_s']:.0f} img/s at p99 "
                        f"{best.best['p99_ms']:.2f} ms (concurrency {best.best['concurrency']})" if best.confirmed else
                        f"did not hold p99 {slo_ms:g} ms over {confirm_s:g} s at {before['concurrency']} in flight "
                        f"or less"))
                if check_s > 0 and not shm:   # the plain client sends its tensors over the socket
                    rep.check = check(server, model, best, check_s, protocol)
                    c = rep.check
                    log(f"load generator check at {c['concurrency']} in flight: {c['loadgen']['img_s']:.0f} img/s "
                        f"against the plain client's {c['plain']['img_s']:.0f} (ratio {c['img_s_ratio']}), p99 "
                        f"ratio {c['p99_ratio']}" + ("" if (c["img_s_ratio"] or 0) >= CHECK_MIN_RATIO else
                                                     f": under {CHECK_MIN_RATIO}, the load generator limited the sweep"))
    finally:
        try:
            if server is not None:
                server.close()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    rep.seconds = time.monotonic() - t0
    return rep


def failure(rep: Report) -> str | None:
    """One line when the sweep found nothing usable (the CLI exits 1 with it)."""
    if rep.best and rep.best.confirmed is False:
        held = [x for x in rep.best.loads if x.get("confirm")]
        last = held[-1] if held else None
        return (f"triton sweep: the best config ({rep.best.label}) did not hold p99 <= {rep.slo_ms:g} ms under "
                f"a longer load" + (f" (last: {last['concurrency']} in flight, p99 {last['p99_ms']:.2f} ms, "
                                    f"{last['errors']} errors)" if last else ""))
    if rep.best:
        return None
    errs = [p for p in rep.points if p.error]
    if errs and len(errs) == len(rep.points):
        return f"triton sweep: {errs[0].error}"
    low = min((p.loads[0]["p99_ms"] for p in rep.points if p.loads), default=None)
    return (f"triton sweep: no config of {len(rep.points)} meets p99 <= {rep.slo_ms:g} ms"
            + (f" (the lowest p99 seen was {low:.2f} ms)" if low is not None else ""))


# ---------------------------------------------------------------- --write
WRITTEN = ("max_batch_size", "dynamic_batching", "instance_group")   # the config parts a sweep changes


def _leaf_end(node) -> int:
    """Where a node's text ends: PyYAML ends a block collection where the next token starts (on a
    later line, indented), so go down to its last scalar or flow collection."""
    import yaml
    while not isinstance(node, yaml.ScalarNode) and not node.flow_style and node.value:
        node = node.value[-1][1] if isinstance(node, yaml.MappingNode) else node.value[-1]
    return node.end_mark.index


def _line_end(text: str, node) -> int:
    """The index just past the line break that ends `node` (and any comment on its last line)."""
    nl = text.find("\n", _leaf_end(node))
    return len(text) if nl < 0 else nl + 1


def _add_key(text: str, node, key: str, value: str, nl: str) -> tuple[int, int, str]:
    """An edit adding `key: value` to a YAML mapping node (not empty), in its own style (flow or block)."""
    last_key, last_val = node.value[-1]
    if node.flow_style:
        return last_val.end_mark.index, last_val.end_mark.index, f", {key}: {value}"
    end = _line_end(text, last_val)
    pre = "" if text[end - 1:end] == "\n" else nl   # the file's last line had no line break
    return end, end, f"{pre}{' ' * last_key.start_mark.column}{key}: {value}{nl}"


def _drop_key(text: str, node, key: str) -> tuple[int, int, str]:
    """An edit removing `key` (and its value) from a YAML mapping node of two keys or more."""
    pairs = node.value
    i = next(i for i, (k, _) in enumerate(pairs) if k.value == key)
    k, v = pairs[i]
    if node.flow_style:   # from the comma after the previous value, or up to the next key
        return ((pairs[i - 1][1].end_mark.index, v.end_mark.index, "") if i > 0
                else (k.start_mark.index, pairs[1][0].start_mark.index, ""))
    return text.rfind("\n", 0, k.start_mark.index) + 1, _line_end(text, v), ""


def _expected_doc(text: str, model_name: str, cfg: dict):
    """The profile as data with only the swept values changed: what the rewritten file must load as."""
    import yaml
    doc = yaml.safe_load(text)
    m = next(m for m in doc["triton"]["models"] if m.get("name") == model_name)
    m["max_batch_size"] = cfg["max_batch_size"]
    # copies: a YAML alias may share these with another model, which must come out unchanged
    db = m["dynamic_batching"] = dict(m["dynamic_batching"])
    m["instance_group"] = [dict(g) for g in m["instance_group"]]
    db["max_queue_delay_microseconds"] = cfg["dynamic_batching"]["max_queue_delay_microseconds"]
    pref = cfg["dynamic_batching"].get("preferred_batch_size")
    if pref:
        db["preferred_batch_size"] = list(pref)
    else:
        db.pop("preferred_batch_size", None)
    m["instance_group"][0]["count"] = cfg["instance_group"][0]["count"]
    return doc


def write_back(profile_path: str, model_name: str, rep: Report) -> str:
    """Put the best config's max_batch_size, queue delay, preferred sizes and instance count into the
    profile file in place (comments and layout kept: only those values change), with a comment saying
    when and what was measured. Nothing is written unless the result loads as the old profile with
    just those values changed, and renders the measured config under the same MPS setting."""
    import yaml
    from hkgpu_tune.core.errors import ProfileError
    from hkgpu_tune.core.fsutil import atomic_write
    from hkgpu_tune.core.profile import parse_profile_text
    from hkgpu_tune.serve.schema.config import section as triton_section
    if not rep.best:
        raise HkError("triton sweep: nothing to write: no config met the SLO")
    with open(profile_path, newline="") as f:   # line endings kept as they are
        text = f.read()
    nl = "\r\n" if "\r\n" in text else "\n"
    old_text = text
    root = yaml.compose(text)
    cfg = rep.best.config

    def get(node, key):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == key:
                    return v
        return None
    tri = get(root, "triton")
    models = get(tri, "models")
    mnode = next((m for m in (models.value if models else []) if getattr(get(m, "name"), "value", None) == model_name),
                 None)
    if mnode is None:
        raise HkError(f"{profile_path}: no model {model_name} under triton.models")
    edits = []   # (start, end, new text)

    def set_scalar(node, key, value, path):
        v = get(node, key)
        if v is None or not isinstance(v, yaml.ScalarNode):
            raise HkError(f"{profile_path}: triton.models[{model_name}].{path} is not set as a plain value: "
                          f"give it in the profile first, then --write can change it")
        edits.append((v.start_mark.index, v.end_mark.index, str(value)))

    set_scalar(mnode, "max_batch_size", cfg["max_batch_size"], "max_batch_size")
    db = get(mnode, "dynamic_batching")
    set_scalar(db, "max_queue_delay_microseconds", cfg["dynamic_batching"]["max_queue_delay_microseconds"],
               "dynamic_batching.max_queue_delay_microseconds")
    pref = cfg["dynamic_batching"].get("preferred_batch_size")
    pnode = get(db, "preferred_batch_size")
    pref_text = "[" + ", ".join(str(x) for x in pref or []) + "]"
    if pnode is not None and pref:
        edits.append((pnode.start_mark.index, _leaf_end(pnode), pref_text))
    elif pnode is not None:   # measured without preferred sizes: the key goes
        edits.append(_drop_key(text, db, "preferred_batch_size"))
    elif pref:                # measured with them: the key is added
        edits.append(_add_key(text, db, "preferred_batch_size", pref_text, nl))
    ig = get(mnode, "instance_group")
    if not isinstance(ig, yaml.SequenceNode) or not ig.value:
        raise HkError(f"{profile_path}: triton.models[{model_name}].instance_group is not set: "
                      f"give it in the profile first, then --write can change it")
    set_scalar(ig.value[0], "count", cfg["instance_group"][0]["count"], "instance_group[0].count")
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    b = rep.best.best
    line_start = text.rfind("\n", 0, mnode.start_mark.index) + 1
    prefix = text[line_start:mnode.start_mark.index]
    indent = " " * (len(prefix) - len(prefix.lstrip()))
    note = (f"{indent}# hkgpu-tune triton sweep {rep.date}: best of {len(rep.points)} configs under p99 "
            f"{rep.slo_ms:g} ms: {rep.best.label}: {b['img_s']:.0f} img/s, p99 {b['p99_ms']:.2f} ms "
            f"at concurrency {b['concurrency']} ({b['transport']}){nl}")
    # one sweep comment per model: a later sweep replaces the earlier one
    prev_start = text.rfind("\n", 0, line_start - 1) + 1
    if text[prev_start:line_start].lstrip().startswith("# hkgpu-tune triton sweep"):
        text = text[:prev_start] + note + text[line_start:]
    else:
        text = text[:line_start] + note + text[line_start:]
    unchanged = "the profile is unchanged"
    try:
        prof = parse_profile_text(text, profile_path)
        same = yaml.safe_load(text) == _expected_doc(old_text, model_name, cfg)
    except (ProfileError, yaml.YAMLError) as e:
        raise HkError(f"{profile_path}: --write could not edit this layout (the rewritten text would not load: "
                      f"{str(e).splitlines()[0]}); {unchanged}") from None
    if not same:   # an edit reached past the values it meant to change
        raise HkError(f"{profile_path}: --write could not edit this layout (the rewritten text changes more "
                      f"than the swept values); {unchanged}")
    if (triton_section(prof).mps is not None) != rep.best.mps:   # node-wide: --write does not change it
        raise HkError(f"{profile_path}: the best config was measured {'with' if rep.best.mps else 'without'} MPS, "
                      f"but this profile {'runs' if rep.best.mps is False else 'does not run'} Triton as an MPS "
                      f"client: sweep with --mps {'on' if rep.best.mps is False else 'off'} (the MPS daemon "
                      f"running) or change the mps section; {unchanged}")
    served = prof.section("triton").model(model_name).config
    diff = [k for k in WRITTEN if served.get(k) != cfg.get(k)]
    if diff:   # what the node would serve is not what was measured: write nothing
        raise HkError(f"{profile_path}: triton.models[{model_name}]: after --write, {', '.join(diff)} would "
                      f"differ from the measured config ({rep.best.label}); {unchanged}")
    st = os.stat(profile_path)
    atomic_write(profile_path, text, mode=st.st_mode & 0o7777)
    return profile_path
