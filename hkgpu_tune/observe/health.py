"""Node health: GPU, kernel-log, NIC and drift checks against the profile's `health:` thresholds,
and the drain hooks run once per transition (healthy -> unhealthy, unhealthy -> healthy).

>>> cfg = parse_profile(...)                         # doctest: +SKIP  (the profile's health: section)
>>> rep = run(profile, cfg, "/var/lib/hkgpu-tune")    # doctest: +SKIP  (checks, hooks, state file)
>>> rep.status                                       # doctest: +SKIP
'degraded'

Semantics (docs/health.md):
- status: "degraded" when any check fails, else "error" when a check could not be read, else "healthy".
- Into unhealthy: at once, on the first degraded run; a new on_unhealthy hook is held down for
  hold_down_s after the last one that succeeded.
- Back to healthy: only after the node has been seen healthy on every run for hold_down_s.
- A run whose status is "error" changes nothing (no hook) and restarts the recovery clock.
- A hook that fails (exit status not 0, cannot start, or killed at hook_timeout_s) leaves the
  recorded state as it was, so the next run tries the same transition again.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

from hkgpu_tune.core.errors import HkError, StateError
from hkgpu_tune.core.fsutil import atomic_write
from hkgpu_tune.observe.health_config import HealthConfig, config_of
from hkgpu_tune.observe.hooks import run_hook

HEALTHY, DEGRADED, ERROR = "healthy", "degraded", "error"
STATUS_VALUE = {HEALTHY: 0, DEGRADED: 1, ERROR: 2}          # hkgpu_tune_health_status
OK, FAILING, SKIPPED, CHECK_ERROR = "ok", "failing", "skipped", "error"

CHECKS = ("gpu_count", "gpu_lost", "ecc_uncorrected", "remapped_rows", "retired_pages_pending", "xid",
          "temperature", "pcie_width", "pcie_gen", "nic_errors", "verify", "mig_device", "triton_ready")

STATE_FILE = "health.json"
STATE_MAX = 1 << 20
HOOK_LOG_MAX = 20


# ---------------------------------------------------------------- checks
@dataclass
class Check:
    name: str
    target: str
    status: str            # ok | failing | skipped | error
    value: object = None
    threshold: object = None
    reason: str = ""


@dataclass
class Report:
    status: str
    checks: list[Check] = field(default_factory=list)
    gpus: int | None = None
    seconds: float = 0.0
    action: dict = field(default_factory=dict)   # what run() did: transition, hook, hold-down

    @property
    def failing(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAILING]

    def failing_names(self) -> list[str]:
        return [f"{c.name}:{c.target}" if c.target else c.name for c in self.failing]

    def to_dict(self) -> dict:
        return {"status": self.status, "gpus": self.gpus, "seconds": round(self.seconds, 4),
                "checks": [asdict(c) for c in self.checks],
                "failing": self.failing_names(), "action": self.action}


def _status(checks: list[Check]) -> str:
    if any(c.status == FAILING for c in checks):
        return DEGRADED
    if any(c.status == CHECK_ERROR for c in checks):
        return ERROR
    return HEALTHY


LOST = "GPU is lost"   # NVML_ERROR_GPU_IS_LOST's string (nvmlErrorString)


def _lost(text) -> bool:
    return LOST.lower() in str(text).lower()


def _gpu_checks(cfg: HealthConfig, gpus: list[dict]) -> list[Check]:
    out: list[Check] = []
    for g in gpus:
        t = f"gpu{g.get('index')}"
        errs = g.get("errors") or {}
        if g.get("lost") or any(_lost(e) for e in errs.values()):
            out.append(Check("gpu_lost", t, FAILING, True, False, "NVML: GPU is lost (NVML_ERROR_GPU_IS_LOST)"))
            continue
        out.append(Check("gpu_lost", t, OK, False, False))

        ecc = ((g.get("ecc") or {}).get("volatile") or {}).get("uncorrected")
        if ecc is None:
            out.append(Check("ecc_uncorrected", t, SKIPPED, None, cfg.ecc_uncorrected_max,
                             "NVML reports no volatile ECC count (ECC off or not supported)"))
        else:
            out.append(Check("ecc_uncorrected", t, FAILING if ecc > cfg.ecc_uncorrected_max else OK,
                             ecc, cfg.ecc_uncorrected_max, "volatile uncorrected ECC errors since the driver loaded"))

        if cfg.remapped_rows:
            rr = g.get("remapped_rows")
            if not rr or (rr.get("pending") is None and rr.get("failed") is None):
                out.append(Check("remapped_rows", t, SKIPPED, None, "none pending or failed",
                                 "NVML reports no row remapping (not supported before Ampere)"))
            else:
                bad = [k for k in ("pending", "failed") if rr.get(k)]
                out.append(Check("remapped_rows", t, FAILING if bad else OK,
                                 {"pending": bool(rr.get("pending")), "failed": bool(rr.get("failed")),
                                  "uncorrectable": rr.get("uncorrectable")},
                                 "none pending or failed",
                                 ("row remapping " + " and ".join(bad) + ": the GPU needs a reset") if bad else ""))

        if cfg.retired_pages_pending:
            pend = (g.get("retired_pages") or {}).get("pending")
            if pend is None:
                out.append(Check("retired_pages_pending", t, SKIPPED, None, False,
                                 "NVML reports no page retirement (not supported, or rows are remapped instead)"))
            else:
                out.append(Check("retired_pages_pending", t, FAILING if pend else OK, bool(pend), False,
                                 "retired pages wait for a GPU reset" if pend else ""))

        temp = g.get("temp_c")
        if temp is None:
            out.append(Check("temperature", t, SKIPPED, None, cfg.temperature_max_c, "no temperature from NVML"))
        else:
            out.append(Check("temperature", t, FAILING if temp > cfg.temperature_max_c else OK,
                             temp, cfg.temperature_max_c, "degrees Celsius"))

        pcie = g.get("pcie") or {}
        for key, cur, mx, on in (("pcie_width", "width", "max_width", cfg.pcie_width),
                                 ("pcie_gen", "gen", "max_gen", cfg.pcie_gen)):
            if not on:
                continue
            c, m = pcie.get(cur), pcie.get(mx)
            if c is None or m is None:
                out.append(Check(key, t, SKIPPED, c, m, "NVML reports no PCIe link " + cur))
            elif cur == "gen" and c < m and "gpu_idle" in (g.get("throttle_reasons") or ()):
                out.append(Check(key, t, OK, c, m, "idle: a GPU lowers its link generation to save power"))
            else:
                out.append(Check(key, t, FAILING if c < m else OK, c, m,
                                 f"link {cur} {c} below the maximum {m}" if c < m else ""))
    return out


def read_gpus(nvml) -> tuple[list[dict] | None, list[Check]]:
    """(GPUs, checks about reading them). NVML that cannot start because a GPU is lost is a
    failing gpu_lost check; NVML missing altogether is left to gpu_count (expected or not)."""
    from hkgpu_tune.observe.collect import gpu as gpu_collector
    try:
        return gpu_collector.read(nvml), []
    except HkError as e:
        if _lost(e):
            return None, [Check("gpu_lost", "", FAILING, True, False, f"NVML: {e}")]
        return None, [Check("gpu_read", "", SKIPPED, None, None, f"NVML: {e}")]
    except Exception as e:  # noqa: BLE001 - a reader bug is this check's error, not a crash
        if _lost(e):
            return None, [Check("gpu_lost", "", FAILING, True, False, f"NVML: {e}")]
        return None, [Check("gpu_read", "", CHECK_ERROR, None, None, f"NVML: {type(e).__name__}: {e}")]


def _xid_checks(cfg: HealthConfig, events: list[dict] | None, err: str | None) -> list[Check]:
    if not cfg.xids:
        return []
    crit = sorted(cfg.xids)
    if events is None:
        return [Check("xid", "", CHECK_ERROR, None, crit, f"kernel log: {err}")]
    seen: dict[int, int] = {}
    for e in events:
        if e.get("kind") == "xid" and e.get("xid") in cfg.xids:
            seen[e["xid"]] = seen.get(e["xid"], 0) + 1
    if seen:
        return [Check("xid", "", FAILING, {str(k): v for k, v in sorted(seen.items())}, crit,
                      "critical XID(s) in the kernel log since boot: " + ", ".join(map(str, sorted(seen))))]
    return [Check("xid", "", OK, {}, crit, "")]


def read_kmsg() -> tuple[list[dict] | None, str | None]:
    """XID events since boot (a file named by HKGPU_TUNE_KMSG_REPLAY stands in for the kernel log:
    collect.kmsg.events)."""
    from hkgpu_tune.observe.collect import kmsg
    try:
        return kmsg.events(), None
    except Exception as e:  # noqa: BLE001 - one line, the check reports it
        return None, f"{type(e).__name__}: {e}" if not isinstance(e, HkError) else str(e)


def _nic_checks(cfg: HealthConfig, counters: dict | None, err: str | None, prev: dict) -> tuple[list[Check], dict]:
    """NIC errors (rx_errors + tx_errors) rising by more than max_increase since the last run."""
    out, now = [], {}
    for dev in cfg.nic_devices:
        c = (counters or {}).get(dev)
        if c is None:
            out.append(Check("nic_errors", dev, CHECK_ERROR, None, cfg.nic_errors_max_increase,
                             err or "no such network device"))
            continue
        total = int(c.get("rx_errors") or 0) + int(c.get("tx_errors") or 0)
        now[dev] = total
        before = prev.get(dev)
        if before is None or total < before:   # first run, or counters reset (driver reload)
            out.append(Check("nic_errors", dev, OK, 0, cfg.nic_errors_max_increase,
                             "first reading (or counters reset): nothing to compare yet"))
            continue
        rise = total - before
        out.append(Check("nic_errors", dev, FAILING if rise > cfg.nic_errors_max_increase else OK,
                         rise, cfg.nic_errors_max_increase, "rx+tx errors since the last health run"))
    return out, now


def named_mig(profile) -> list[str]:
    """The MIG devices the profile names (triton.gpu, mps.gpus: UUIDs or mig:GPU/SLOT positions),
    in that order."""
    from hkgpu_tune.serve.schema.config import each
    from hkgpu_tune.serve.schema.devices import is_mig
    out: list[str] = []
    for name in ("triton", "mps") if profile is not None else ():
        for one in each(profile.section(name)):   # triton.services: each service's
            for g in getattr(one, "gpus", None) or ():
                if is_mig(g) and g not in out:
                    out.append(g)
    return out


def _mig_checks(profile, nvml) -> list[Check]:
    """Each MIG device the profile names still exists: MIG devices do not survive a GPU reset or a
    reboot unless re-created, and a service named on a lost one cannot start."""
    from hkgpu_tune.serve.schema.devices import mig_check
    uuids = named_mig(profile)
    if not uuids:
        return []
    if nvml is None:
        from hkgpu_tune.observe.collect.gpu import _nvml
        nvml = _nvml(None)
    out = []
    for u in uuids:
        status, cur, why = mig_check(nvml, u)
        out.append(Check("mig_device", u, {"ok": OK, "drift": FAILING}.get(status, CHECK_ERROR), cur or None,
                         "present", why))
    return out


def _verify_checks(profile, res=None) -> list[Check]:
    if res is None:
        from hkgpu_tune.tune.engine import Engine
        try:
            res = Engine(profile).verify()
        except HkError as e:
            return [Check("verify", "", CHECK_ERROR, None, 0, str(e))]
    failed = [r for r in res if r.failed]
    return [Check("verify", "", FAILING if failed else OK, len(failed), 0,
                  "; ".join(f"{r.subsystem} {r.target} {r.key}: {r.status}" for r in failed[:5]))]


def _triton_checks(profile) -> list[Check]:
    """One per Triton service of the profile (triton.services: each by its unit): ready or not."""
    from hkgpu_tune.serve.running import client
    from hkgpu_tune.serve.schema.config import services
    try:
        every = services(profile) if profile is not None else ()
    except HkError as e:
        return [Check("triton_ready", "", CHECK_ERROR, None, True, str(e))]
    if not every:
        return [Check("triton_ready", "", CHECK_ERROR, None, True, "triton_ready: the profile has no triton section")]
    out = []
    for t in every:
        c = client.Client(t.http.host, t.http.port, timeout=5)
        try:
            ready = c.ready()
            why = "" if ready else f"{t.http.host}:{t.http.port}/v2/health/ready does not answer 200"
        except (HkError, OSError) as e:
            ready, why = False, f"{t.http.host}:{t.http.port}: {e}"
        finally:
            c.close()
        out.append(Check("triton_ready", t.unit, OK if ready else FAILING, ready, True, why))
    return out


def _read_nics(devices) -> dict:
    """/sys statistics of each device; a device that is gone is left out (its check says so)."""
    from hkgpu_tune.observe.collect.nic import SysNic
    src, out = SysNic(), {}
    for dev in devices:
        try:
            out[dev] = src.stats(dev)
        except OSError:
            pass
    return out


def _gpu_error_checks(err: str) -> list[Check]:
    if _lost(err):
        return [Check("gpu_lost", "", FAILING, True, False, f"NVML: {err}")]
    return [Check("gpu_read", "", SKIPPED, None, None, f"NVML: {err}")]


def check(profile, cfg: HealthConfig | None = None, *, nvml=None, gpus=None, gpu_error: str | None = None,
          kmsg_events=None, kmsg_error: str | None = None, nic_counters=None, nic_prev: dict | None = None,
          verify_results=None) -> Report:
    """Run every configured check. Readings can be passed in (the export run passes its collectors'
    data, tests their own); what is not passed is read here (NVML, the kernel log, /sys)."""
    t0 = time.monotonic()
    cfg = cfg or config_of(profile)
    checks: list[Check] = []
    if gpu_error is not None:
        gpus, extra = None, _gpu_error_checks(gpu_error)
    elif gpus is None:
        gpus, extra = read_gpus(nvml)
    else:
        extra = []
    checks += extra
    n = len(gpus) if gpus is not None else None
    if cfg.gpus_expected is None and n is None and profile is not None and profile.section("gpu") is not None:
        checks.append(Check("gpu_count", "", FAILING, None, "the GPUs of the gpu: section",
                            "NVML cannot list the GPUs: " + "; ".join(c.reason for c in extra)))
    elif cfg.gpus_expected is not None:
        if n is None:
            checks.append(Check("gpu_count", "", FAILING, None, cfg.gpus_expected,
                                "NVML cannot list the GPUs: " + "; ".join(c.reason for c in extra)))
        else:
            checks.append(Check("gpu_count", "", FAILING if n < cfg.gpus_expected else OK, n, cfg.gpus_expected,
                                f"{cfg.gpus_expected - n} GPU(s) missing" if n < cfg.gpus_expected else ""))
    checks += _gpu_checks(cfg, gpus or [])
    if not cfg.xids:
        events, err = None, None
    elif kmsg_error is not None:
        events, err = None, kmsg_error
    elif kmsg_events is None:
        events, err = read_kmsg()
    else:
        events, err = kmsg_events, None
    checks += _xid_checks(cfg, events, err)
    checks += _mig_checks(profile, nvml)
    nic_now: dict = {}
    if cfg.nic_devices and (nic_prev is not None or nic_counters is not None):
        if nic_counters is None:
            nic_counters = _read_nics(cfg.nic_devices)
        extra_nic, nic_now = _nic_checks(cfg, nic_counters, None, nic_prev or {})
        checks += extra_nic
    else:
        checks += [Check("nic_errors", dev, SKIPPED, None, cfg.nic_errors_max_increase,
                         "a rise needs the last health run's counters (hkgpu-tune health with its state)")
                   for dev in cfg.nic_devices]
    if cfg.verify_drift:
        checks += _verify_checks(profile, verify_results)
    if cfg.triton_ready:
        checks += _triton_checks(profile)
    rep = Report(_status(checks), checks, n, time.monotonic() - t0)
    rep.action["nic"] = nic_now
    return rep


def from_collectors(profile, results, verify_results=None):
    """A collect.Result "health" from an export run's own readings (the gpu and kmsg collectors'
    data, verify's results): no second NVML read, no hooks, no state. The NIC errors check needs
    the previous run's counters, so it is left to `hkgpu-tune health`.

    >>> cres.append(health.from_collectors(profile, cres, results))   # doctest: +SKIP"""
    from hkgpu_tune.observe.collect import Result, one_line
    t = time.perf_counter()
    try:
        by = {r.collector: r for r in results}
        kw: dict = {}
        g = by.get("gpu")
        if g is not None:
            if not g.up:
                kw["gpu_error"] = g.error or "the gpu collector failed"
            elif "unsupported" in g.data:
                kw["gpu_error"] = g.data["unsupported"]
            else:
                kw["gpus"] = g.data.get("gpus") or []
        k = by.get("kmsg")
        if k is not None:
            if k.up:
                kw["kmsg_events"] = k.data.get("events") or []
            else:
                kw["kmsg_error"] = k.error or "the kmsg collector failed"
        rep = check(profile, verify_results=verify_results, **kw)
        rep.action.pop("nic", None)
        return Result("health", True, to_families(rep), rep.to_dict(), None, time.perf_counter() - t)
    except Exception as e:  # noqa: BLE001 - a failing collector is a metric, not a crash
        return Result("health", False, [], {}, one_line(e), time.perf_counter() - t)


# ---------------------------------------------------------------- the state file
def _state_dir(state_dir: str | None) -> str:
    from hkgpu_tune.tune.state import State
    st = State(state_dir)
    st.check_dir(create=True)           # trusted: ours, not a link, not group/world-writable
    return st.dir


def _is_time(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e11)


def load_state(directory: str) -> dict:
    """The last recorded health state; {} when there is none. A file that is not ours or not of
    the expected shape is refused (StateError), never half-read."""
    from hkgpu_tune.core import lockfile
    from hkgpu_tune.tune.host import owned_problem
    path = os.path.join(directory, STATE_FILE)
    data = lockfile.read_private(path, "health state file", STATE_MAX, owned_problem)
    if data is None:
        return {}
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise StateError(f"{path}: not valid JSON ({e}): refused (remove it to start afresh)") from None
    bad = None
    if not isinstance(doc, dict) or doc.get("format") != 1 or doc.get("kind") != "health":
        bad = "not a hkgpu-tune health state file (format 1)"
    elif doc.get("acted") not in (HEALTHY, "unhealthy"):
        bad = "'acted' is not healthy or unhealthy"
    elif doc.get("observed") not in (HEALTHY, DEGRADED, ERROR):
        bad = "'observed' is not healthy, degraded or error"
    elif not all(_is_time(doc.get(k)) for k in ("observed_since", "last_unhealthy_hook", "last_run")):
        bad = "a time that is not a number of seconds"
    elif not isinstance(doc.get("nic", {}), dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in doc.get("nic", {}).items()):
        bad = "'nic' is not a mapping of device to error count"
    elif not isinstance(doc.get("hooks", []), list):
        bad = "'hooks' is not a list"
    elif not isinstance(doc.get("hook_running") or {}, dict):
        bad = "'hook_running' is not a mapping"
    if bad:
        raise StateError(f"{path}: {bad}: refused (remove it to start afresh)")
    return doc


def save_state(directory: str, doc: dict) -> None:
    atomic_write(os.path.join(directory, STATE_FILE), json.dumps(doc, indent=1, default=str) + "\n", mode=0o600)


# ---------------------------------------------------------------- transitions
def run(profile, cfg: HealthConfig | None = None, state_dir: str | None = None, *, hooks: bool = True,
        now: float | None = None, **readers) -> Report:
    """Check, then record the run and run at most one hook (semantics at the top of this module),
    all under the state directory's lock (one apply, rollback or health run at a time). readers: nvml, kmsg_events, nic_counters (tests).
    hooks=False: check only; nothing is run or recorded."""
    cfg = cfg or config_of(profile)
    directory = _state_dir(state_dir) if hooks else None
    if directory is None:
        rep = check(profile, cfg, **readers)
        rep.action = {"state": None, "transition": None, "hook": None, "held_down": None,
                      "skipped": "--no-hooks: no hook run, nothing recorded"}
        return rep
    from hkgpu_tune.tune.state import State
    with State(directory).lock():
        doc = load_state(directory)
        rep = check(profile, cfg, nic_prev=doc.get("nic") or {}, **readers)
        pending = _transition(rep, cfg, doc, directory, time.time() if now is None else now)
    if pending is None:
        return rep
    # the hook (a drain: up to hook_timeout_s) runs outside the lock: apply and rollback are never
    # refused for its whole run; the claim recorded above keeps a second health run from starting it
    name, argv, env, want, t = pending
    rec = {"hook": name, "time": t, **run_hook(argv, env, cfg.hook_timeout_s)}
    st = State(directory)
    st.lock_wait_s = HOOK_RECORD_WAIT_S
    with st.lock():
        doc = load_state(directory) or doc
        _hook_done(rep, doc, rec, want, t)
        save_state(directory, doc)
    return rep


HOOK_RECORD_WAIT_S = 120.0   # waiting for an apply or rollback to finish before recording the hook


def _claimed(doc: dict) -> dict | None:
    """The hook another health run is running now (its claim, its process alive), or None."""
    c = doc.get("hook_running")
    if not isinstance(c, dict) or not isinstance(c.get("pid"), int) or isinstance(c.get("pid"), bool):
        return None
    try:
        os.kill(c["pid"], 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return c


def _hook_done(rep: Report, doc: dict, rec: dict, want: str, now: float) -> None:
    doc.pop("hook_running", None)
    doc["hooks"] = (doc.get("hooks") or [])[-(HOOK_LOG_MAX - 1):] + [
        {k: rec[k] for k in ("hook", "time", "rc", "ok", "timed_out", "error", "pid")}]
    rep.action["hook"] = rec
    if rec["ok"]:
        doc["acted"] = want
        rep.action["transition"] = want
        if want == "unhealthy":
            doc["last_unhealthy_hook"] = now
    # a failed hook: the recorded state stays, so the next run tries the same transition again
    rep.action["state"] = doc["acted"]


def _transition(rep: Report, cfg: HealthConfig, doc: dict, directory: str, now: float):
    """Record this run; returns the hook to run outside the lock (name, argv, env, want, now), or None."""
    first = not doc
    if first:
        doc.update({"format": 1, "kind": "health", "tool": "hkgpu-tune", "acted": HEALTHY,
                    "observed": HEALTHY, "observed_since": now, "last_unhealthy_hook": None,
                    "last_run": None, "nic": {}, "hooks": []})
    if rep.status != doc["observed"] or first:
        doc["observed"], doc["observed_since"] = rep.status, now
    doc["last_run"] = now
    nic = rep.action.pop("nic", None)
    if nic:
        doc["nic"] = {**doc.get("nic", {}), **nic}
    action = {"state": doc["acted"], "transition": None, "hook": None, "held_down": None,
              "state_dir": directory}
    want = None
    if rep.status == DEGRADED and doc["acted"] == HEALTHY:
        last = doc.get("last_unhealthy_hook")
        if last is not None and 0 <= now - last < cfg.hold_down_s:
            action["held_down"] = (f"on_unhealthy ran {now - last:.0f} s ago; held down for "
                                   f"{cfg.hold_down_s:g} s (hold_down_s)")
        else:
            want = "unhealthy"
    elif rep.status == HEALTHY and doc["acted"] == "unhealthy":
        healthy_for = now - doc["observed_since"]
        if healthy_for >= cfg.hold_down_s:
            want = HEALTHY
        else:
            action["held_down"] = (f"healthy for {max(healthy_for, 0):.0f} s; on_healthy waits until "
                                   f"{cfg.hold_down_s:g} s (hold_down_s)")
    pending = None
    running = _claimed(doc) if want else None
    if running:
        action["held_down"] = f"{running.get('hook')} is running (pid {running['pid']}) in another health run"
        want = None
    if want:
        name = "on_unhealthy" if want == "unhealthy" else "on_healthy"
        argv = cfg.on_unhealthy if want == "unhealthy" else cfg.on_healthy
        if argv:
            env = {"HKGPU_HEALTH_STATUS": rep.status, "HKGPU_HEALTH_TRANSITION": want,
                   "HKGPU_HEALTH_FAILING": " ".join(rep.failing_names()),
                   "HKGPU_HEALTH_FAILING_JSON": json.dumps([asdict(c) for c in rep.failing], default=str)}
            doc["hook_running"] = {"hook": name, "pid": os.getpid(), "since": now}
            pending = (name, argv, env, want, now)
        else:
            doc["acted"] = want
            action["transition"] = want
    action["state"] = doc["acted"]
    save_state(directory, doc)
    rep.action.update(action)
    return pending


# ---------------------------------------------------------------- export
def to_families(rep: Report) -> list:
    """hkgpu_tune_health_status (0 healthy, 1 degraded, 2 error), hkgpu_tune_health_check{check}
    (1 failing, per check kind over all GPUs and devices) and hkgpu_tune_mig_device_present{uuid}
    (1 present, 0 missing or unreadable, per MIG device the profile names) as collect.Family objects."""
    from hkgpu_tune.observe.collect import Family
    by: dict[str, float] = {}
    for c in rep.checks:
        by[c.name] = max(by.get(c.name, 0.0), 1.0 if c.status == FAILING else 0.0)
    out = [
        Family("hkgpu_tune_health_status", "gauge", "Node health: 0 healthy, 1 degraded, 2 error.",
               [({}, float(STATUS_VALUE[rep.status]))]),
        Family("hkgpu_tune_health_check", "gauge", "One health check: 1 failing, 0 not failing.",
               [({"check": k}, v) for k, v in sorted(by.items())]),
    ]
    mig = [({"uuid": c.target}, 1.0 if c.status == OK else 0.0) for c in rep.checks if c.name == "mig_device"]
    if mig:
        out.append(Family("hkgpu_tune_mig_device_present", "gauge",
                          "A MIG device the profile names: 1 present on this host, 0 missing or unreadable.", mig))
    return out
