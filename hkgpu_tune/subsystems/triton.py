"""The Triton subsystem: verify and apply of the `triton:` profile section (its schema and parsing: serve.schema.config)."""
from __future__ import annotations

import re

import os

from hkgpu_tune.core.errors import CheckFailed, HkError
from hkgpu_tune.core.report import DRIFT, ERROR, OK, UNSUPPORTED
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Check, Spec, Subsystem

__all__ = ["Plugin", "Build", "Endpoint", "Gate", "Model", "Services", "Triton", "check_models", "parse_profile",
           "section", "services"]
# the service code (serve/) loads on first use: the registry imports every subsystem module
_LAZY = {"Build": "schema.config", "Endpoint": "schema.config", "Gate": "schema.gate_spec", "Model": "schema.config",
         "Services": "schema.config", "Triton": "schema.config", "engine_facts": "schema.config",
         "section": "schema.config", "services": "schema.config", "parse_profile": "schema.services",
         "check_models": "repository.render", "check_layout": "schema.devices"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"hkgpu_tune.serve.{_LAZY[name]}"), name)
    raise AttributeError(name)


class Plugin(Subsystem):
    """Every Triton service of the profile: one, or several (triton.services), each verified,
    applied and gated on its own. With several, each result's target names its service's unit
    (`hkgpu-triton-gpu1/resnet50`) and each change carries the unit it belongs to."""

    name = "triton"

    @property
    def services(self) -> list["Service"]:
        svcs = self.__dict__.get("_svcs")
        if svcs is None:
            from hkgpu_tune.serve.schema.config import services
            ts = services(self.profile)
            if not ts:
                raise HkError("triton: the profile has no triton section")
            svcs = [Service(self.profile, self.b, t, self.notes, several=len(ts) > 1) for t in ts]
            self.__dict__["_svcs"] = svcs
        return svcs

    @property
    def t(self) -> Triton:
        """The profile's one service (an error naming the units where there are several)."""
        svcs = self.services
        if len(svcs) > 1:
            from hkgpu_tune.serve.schema.config import section
            section(self.profile)   # raises, naming them
        return svcs[0].t

    def _of(self, data: dict) -> "Service":
        svcs = self.services
        if len(svcs) == 1:
            return svcs[0]
        for s in svcs:
            if s.t.unit == data.get("unit"):
                return s
        raise HkError(f"triton: the change names service {data.get('unit')!r}, which the profile lacks")

    def read(self) -> dict:
        svcs = self.services
        if len(svcs) == 1:
            return svcs[0].read()
        return {"services": {s.t.unit: s.read() for s in svcs}}

    def compare(self, state: dict):
        svcs = self.services
        if len(svcs) == 1:
            return svcs[0].compare(state)
        return [r for s in svcs for r in s.compare(state["services"][s.t.unit])]

    def plan(self, state=None):
        changes, results = super().plan(state)
        # a server's launch (unit, command) is written first, so the journal undoes it last: the
        # previous server starts once every model directory is back, never on the new files
        return sorted(changes, key=lambda c: c.key not in ("unit", "command")), results

    def write(self, target, key, value, data):
        self._of(data).write(target, key, value, data)

    def _each(self, changes):
        svcs = self.services
        if len(svcs) == 1:
            return [(svcs[0], changes)] if changes else []
        out = []
        for s in svcs:   # in profile order
            mine = [c for c in changes if c.data.get("unit") == s.t.unit]
            if mine:
                out.append((s, mine))
        return out

    def after_apply(self, changes):
        for s, mine in self._each(changes):
            s.after_apply(mine)

    def checks(self, changes):
        # one gate per service; a failed one undoes the whole apply (the engine's journal)
        return [ck for s, mine in self._each(changes) for ck in s.checks(mine)]

    def committed(self, changes):
        for s, mine in self._each(changes):
            s.committed(mine)

    def restore(self, change):
        # from the saved record only: the profile may no longer name the service
        Service(self.profile, self.b, None, self.notes).restore(change)

    def facts(self) -> dict:
        svcs = self.services
        if len(svcs) == 1:
            return svcs[0].facts()
        return {"services": {s.t.unit: s.facts() for s in svcs}}


class Service(Subsystem):
    """One Triton service. Results: the rendered repository (fixable: re-render, then load through the repository API),
    the service (fixable: start), server and model readiness, the served config of each model
    against the profile (fixable: load), under MPS whether the server is an MPS client, metrics.

    A changed model is loaded into the running server (explicit model control, no restart) and
    gated; when the load or the gate fails, the apply fails and the engine undoes it through its
    journal: restore() of each change puts the copy kept of the previous model directory back and
    loads it again (or restarts the previous server). restore() needs only the saved record."""

    name = "triton"

    def __init__(self, profile, backends, t: Triton | None, notes: list, several: bool = False):
        super().__init__(profile, backends)
        self.notes, self.several, self._triton = notes, several, t

    @property
    def t(self) -> Triton:
        t = self.__dict__.get("_t")
        if t is None:
            if self._triton is None:
                raise HkError("triton: the profile has no triton section")
            from hkgpu_tune.serve.repository.render import check_models
            self.__dict__["_t"] = t = check_models(self._triton)
        return t

    @property
    def _gate_name(self) -> str:
        return f"triton gate ({self.t.unit})" if self.several else "triton gate"

    def result(self, target, key, current, desired, status, reason="", **kw):
        if self.several:   # the unit names the service: its targets and changes say which
            from hkgpu_tune.serve.running.forms import unit_name
            unit, name = self.t.unit, unit_name(self.t)
            if str(target) not in (unit, name) and not str(target).endswith("/" + name):
                target = f"{unit}/{target}"
            if "data" in kw:
                kw["data"] = {**kw["data"], "unit": self.t.unit}
        return super().result(target, key, current, desired, status, reason, **kw)

    def read(self) -> dict:
        from hkgpu_tune.serve.repository import render
        from hkgpu_tune.serve.running import client, forms, launch
        from hkgpu_tune.serve.schema.config import engine_facts
        t = self.t
        state = {"repository": render.repository_state(t, self.b), "service": launch.status(t, self.b),
                 "engines": {m.name: engine_facts(m) for m in t.models if m.engine}, "ref": self._ref()}
        if t.mig:   # the MIG device it names must exist here (a layout lost at reboot is not ok)
            from hkgpu_tune.serve.schema.devices import mig_check
            state["mig"] = mig_check(self.b.nvml, t.mig)
        if state["ref"]["supervisor"] == "systemd":
            unit = forms.unit_state(t, self.b)
            state["unit"] = {k: v for k, v in unit.items() if k != "text"}
            state["unit"]["before"] = self.b.systemd.read_unit(forms.unit_name(t))
            state["unit"]["restart"] = forms.unit_needs_restart(state["unit"]["before"], unit["text"])
        if state["service"]["active"]:
            if state["ref"]["supervisor"] == "process":
                rec = launch.process_record(t) or {}
                try:    # a MIG position resolved now: where it names nothing, the mig row says so
                    want = launch.launched_as(t, self.b)
                except HkError as e:
                    want = {"error": str(e)}
                state["process"] = {"argv": rec.get("argv"), "env": rec.get("env", {}), "want": want,
                                    "record": launch.respawn_record(rec)}
            with client.Client(t.http.host, t.http.port, timeout=5) as c:
                state["server_ready"] = c.ready()
                state["models"] = {}
                for m in t.models:
                    entry = {"ready": c.model_ready(m.name)}
                    try:
                        entry["config"] = c.model_config(m.name)
                    except HkError as e:
                        entry["config_error"] = str(e)
                    state["models"][m.name] = entry
            state["metrics"] = client.metrics_answer(t.metrics.host, t.metrics.port)
            if t.gpu is not None or t.mig:
                state["placement"] = self._placement(t)
            if t.mps is not None and (t.gpu is not None or t.mig):
                state["mps"] = self._mps_clients(t)
        return state

    def _placement(self, t) -> dict:
        """The CPUs and memory nodes the server's processes may use, against its GPU's (the
        launcher pins each service to its first GPU's local CPUs and NUMA node)."""
        from hkgpu_tune.serve.running import forms, launch
        procs = []
        for pid in launch.server_pids(t, self.b):
            text = self.b.sysfs.read(f"/proc/{pid}/status") or ""
            st = dict(ln.split(":\t", 1) for ln in text.splitlines() if ":\t" in ln)
            if "Cpus_allowed_list" in st:
                procs.append({"pid": pid, "cpus": st["Cpus_allowed_list"].strip(),
                              "mems": st.get("Mems_allowed_list", "").strip()})
        return {"want": forms.placement(t, self.b), "procs": procs}

    def _ref(self) -> dict:
        from hkgpu_tune.serve.running import forms
        return forms.ServiceRef.of(self.t, self.b).to_dict()

    def _mps_clients(self, t) -> dict:
        """Triton's processes against NVML's MPS client list of its GPU."""
        from hkgpu_tune.serve.running import forms, launch
        pids = launch.server_pids(t, self.b)
        gpu = t.gpu
        try:
            gpu = gpu if gpu is not None else forms.parent_gpu(self.b, t.mig)   # a MIG device's GPU
            procs = self.b.nvml.processes(gpu)
        except HkError as e:
            return {"unsupported": f"cannot list GPU {gpu if gpu is not None else t.mig}'s processes: {e}"}
        return {"pids": pids, "mps": sorted(set(pids) & set(procs["mps"])),
                "own": sorted(set(pids) & set(procs["compute"]) - set(procs["mps"]))}

    def compare(self, state: dict):
        from hkgpu_tune.serve.repository import redeploy, render
        t, res = self.t, []
        ref = state.get("ref") or self._ref()
        if "mig" in state:
            status, current, why = state["mig"]
            res.append(self.result(t.mig, "mig_device", current or None, "present",
                                   {"ok": OK, "drift": DRIFT}.get(status, UNSUPPORTED), why))
        for name, e in state.get("engines", {}).items():
            res.append(self.result(name, "engine", e["engine"], e["engine"], UNSUPPORTED if e.get("missing") else OK,
                                   e.get("missing") or ", ".join(x for x in (e.get("detail"), e["why"]) if x)))
        for name, st in state["repository"].items():
            if st.get("unsupported"):
                res.append(self.result(name, "repository", st["current"], st["desired"], UNSUPPORTED,
                                       st["unsupported"]))
                continue
            same = st["current"] == st["desired"]
            old = redeploy.copies(t.model_repository, name)
            # what restore needs, saved with the original: no profile, no tritonclient
            data = {"model": name, "repository": t.model_repository,
                    "model_dir": os.path.join(t.model_repository, name), "existed": st["current"] != "absent",
                    "backup": redeploy.backup_path(t.model_repository, name, redeploy.new_token()),
                    "original": old[0] if old else None, "service": ref}
            res.append(self.result(name, "repository", st["current"], st["desired"], OK if same else DRIFT,
                                   st.get("note", "") if same else st["reason"], write=None if same else "rendered",
                                   data=data))
        if "unit" in state:
            u = state["unit"]
            ok = u["current"] == u["desired"]
            why = ("" if ok else "the unit file is not the one the profile renders" if u.get("restart", True)
                   else "the unit's stop settings are not the ones the profile renders (a reload, no restart)")
            res.append(self.result(u["path"], "unit", u["current"], u["desired"], OK if ok else DRIFT, why,
                                   write=None if ok else "rendered", data={"before": u.get("before"), "service": ref}))
        svc = state["service"]
        target = svc["target"]
        if not svc["active"]:
            res.append(self.result(target, "service", svc["state"], "running", DRIFT, svc.get("reason", ""),
                                   write="running", data={"service": ref}))
            return self._undo_order(res)
        res.append(self.result(target, "service", svc["state"], "running", OK, svc.get("reason", "")))
        if "process" in state:
            pr = state["process"]
            have = {"argv": pr["argv"], "env": pr["env"]}
            if have != pr["want"]:
                why = [f"{k} differs" for k in ("argv", "env") if have[k] != pr["want"][k]]
                res.append(self.result(target, "command", "differs", "as rendered", DRIFT,
                                       f"the running server's {' and '.join(why)} (apply restarts it)",
                                       write="restarted", data={"before": pr["record"], "service": ref}))
            else:
                res.append(self.result(target, "command", "as rendered", "as rendered", OK, ""))
        ready = state.get("server_ready")
        res.append(self.result(target, "server_ready", ready, True, OK if ready else DRIFT,
                               "" if ready else "/v2/health/ready does not answer 200"))
        for m in t.models:
            ms = state["models"][m.name]
            res.append(self.result(m.name, "model_ready", ms["ready"], True, OK if ms["ready"] else DRIFT,
                                   "" if ms["ready"] else f"/v2/models/{m.name}/ready does not answer 200"))
            if "config_error" in ms:
                res.append(self.result(m.name, "served_config", None, "as rendered", ERROR, ms["config_error"]))
                continue
            diffs = render.config_diff(m.config, ms["config"])
            if diffs:
                first = diffs[0]
                res.append(self.result(m.name, "served_config", first[1], first[2], DRIFT,
                                       "; ".join(f"{p}: served {c!r}, profile {d!r}" for p, c, d in diffs)
                                       + " (apply loads it through the repository API)",
                                       write="loaded", data={"model": m.name, "served": ms["config"], "service": ref}))
            else:
                res.append(self.result(m.name, "served_config", "as rendered", "as rendered", OK,
                                       f"{len(render.flat(m.config))} field(s) compared"))
        if "mps" in state:
            res.append(self._mps_result(t, state["mps"]))
        if "placement" in state:
            res += self._placement_results(t, target, state["placement"])
        met = state.get("metrics") or {}
        res.append(self.result(target, "metrics", met.get("status"), "answering", OK if met.get("ok") else DRIFT,
                               met.get("reason", "")))
        return self._undo_order(res)

    @staticmethod
    def _undo_order(res):
        """Mark in a model change's record what its undo leaves to another change of the same plan
        (the journal undoes them newest first): the previous server's restart (`restart`: a unit or
        command change, undone after the files) loads the files itself; the model's files
        (`files`, on served_config) are loaded from by the repository change's undo, so a load
        never pairs the previous config with the new files."""
        fix = [r for r in res if r.status == DRIFT and r.write is not None]
        restart = any(r.key in ("unit", "command") for r in fix)
        files = {r.data.get("model") for r in fix if r.key == "repository"}
        for r in fix:
            if r.key in ("repository", "served_config") and restart:
                r.data["restart"] = True
            if r.key == "served_config" and r.data.get("model") in files:
                r.data["files"] = True
        return res

    def _placement_results(self, t, target, st: dict) -> list:
        from hkgpu_tune.backends.topology import format_cpulist, parse_cpulist
        want, gpu = st["want"], t.mig or f"GPU {t.gpu}"
        src = want.get("source", "")
        if not want.get("known", True):   # the fallback: every CPU, no NUMA node
            return [self.result(target, "cpus", None, None, UNSUPPORTED, f"{gpu}'s local CPUs unknown: {src}",
                                required=False)]
        if not st["procs"]:
            return [self.result(target, "cpus", None, format_cpulist(want["cpus"]), UNSUPPORTED,
                                "the server's processes cannot be read", required=False)]
        out, fix = [], "restart the service (its unit or command pins it)"
        for key, allowed in (("cpus", want["cpus"]), ("mems", want.get("mems") or [])):
            if not allowed:
                continue
            stray = [p for p in st["procs"] if not parse_cpulist(p[key]) or
                     not set(parse_cpulist(p[key])) <= set(allowed)]
            have = sorted({p[key] for p in st["procs"]})
            what = "local CPUs" if key == "cpus" else "NUMA node"
            out.append(self.result(target, key, ", ".join(have), format_cpulist(allowed), DRIFT if stray else OK,
                                   f"pid {', '.join(str(p['pid']) for p in stray)} not on {gpu}'s {what}: {fix}"
                                   if stray else f"{len(st['procs'])} process(es) on {gpu}'s {what}"))
        return out

    def _mps_result(self, t, st: dict):
        target, want = t.mig or f"gpu{t.gpu}", "MPS client"
        if "unsupported" in st:
            return self.result(target, "mps_client", None, want, UNSUPPORTED, st["unsupported"])
        if st["mps"]:
            return self.result(target, "mps_client", want, want, OK,
                               f"pid {', '.join(map(str, st['mps']))} in NVML's MPS client list")
        if st["own"]:
            return self.result(target, "mps_client", "own context", want, DRIFT,
                               f"pid {', '.join(map(str, st['own']))} holds a CUDA context of its own, not through "
                               f"MPS (is the MPS daemon running with pipe directory {t.mps.pipe_dir}?)")
        return self.result(target, "mps_client", "no context", want, DRIFT,
                           f"no Triton process (pids {', '.join(map(str, st['pids'])) or 'none'}) is an MPS client "
                           f"of GPU {t.mig or t.gpu}")

    # ------------------------------------------------------------ apply
    def write(self, target, key, value, data):
        from hkgpu_tune.serve.repository import redeploy, render
        from hkgpu_tune.serve.running import forms, launch
        if key == "repository":
            if data.get("existed"):
                redeploy.save(data["model_dir"], data["backup"])
            render.write_model(self.t, self.t.model(data["model"]), self.b)
        elif key == "unit":
            forms.install_unit(self.t, self.b)
        elif key in ("served_config", "command"):
            pass  # after_apply loads the models, or restarts once, for the whole batch
        elif key == "service":
            if value == "running":
                launch.start(self.t, self.b)
                launch.wait_ready(self.t)
            else:
                launch.stop(self.t, self.b)
        else:
            raise HkError(f"triton: cannot set {key}")

    def after_apply(self, changes):
        """Bring the running server to what was written: a load per changed model through the
        repository API; a restart only when its unit or command changed. A failed load fails the
        apply; the engine undoes it (restore() of each change puts the previous models back)."""
        from hkgpu_tune.serve.running import forms, launch
        t = self.t
        started = any(c.key == "service" for c in changes)
        reload = [c for c in changes if c.key in ("repository", "served_config")]
        restart = [c for c in changes if c.key == "command" or c.key == "unit" and forms.unit_needs_restart(
            c.data.get("before"), self.b.systemd.read_unit(forms.unit_name(t)))]
        active = not started and launch.status(t, self.b)["active"]
        if active and reload and not launch.explicit(t, self.b):
            restart.append(None)  # a server from before explicit model control: restart once
        self._gated, self._before = None, {}
        if active and restart:
            launch.restart(t, self.b)
            self._gated = "restarted"
        elif active and reload:
            from hkgpu_tune.serve.measuring.gate import before_reload
            names = list(dict.fromkeys(ch.data["model"] for ch in reload))
            self._before = before_reload(t, names)   # the old config under live traffic, if any
            c = forms.ServiceRef.of(t, self.b).client()
            try:
                for name in names:
                    try:
                        c.load_model(name)
                    except HkError as e:
                        raise CheckFailed(str(e), **self.UNDO) from None
                    self._gated = "reloaded"
            finally:
                c.close()
        if started and self._gated is None:
            self._gated = "started"

    # what the failed apply's message says once the engine has undone it (or could not)
    UNDO = {"undone": "the previous config is serving again",
            "undo_failed": "putting the previous config back failed"}

    def checks(self, changes):
        """The gate (warm-up, load, p99 under the SLO) of a server this apply started, restarted or
        loaded models into: a check of the apply's transaction."""
        return [] if getattr(self, "_gated", None) is None else [Check(self._gate_name, self._gate)]

    def _gate(self) -> None:
        from hkgpu_tune.serve.measuring.gate import run_gate
        rep = run_gate(self.t, before=getattr(self, "_before", None))
        if rep.client_bound:   # the client, not the server, missed: the deployment stays
            self.notes.append(f"{self._gate_name} client-bound, deployment kept: {rep.message}")
        elif rep.passed:
            self.notes.append(f"{self._gate_name} passed: {rep.message}")
        else:   # a server this apply started is stopped by the undo: nothing was serving before
            raise CheckFailed(f"{self._gate_name} failed: {rep.message}",
                              **(self.UNDO if self._gated != "started" else {}))

    def committed(self, changes):
        """The deployment stays: only the oldest copy of each model (rollback's original) is kept."""
        from hkgpu_tune.serve.repository import redeploy
        for ch in changes:
            if ch.key == "repository":
                redeploy.drop_newer(ch.data["repository"], ch.data["model"])

    # ------------------------------------------------------------ restore (from the saved record only)
    def _put_files_back(self, ch) -> str:
        from hkgpu_tune.serve.repository import redeploy
        d = ch.data
        redeploy.check_record(d)
        return redeploy.put_back(d["model_dir"], d["backup"], d["existed"], d.get("original"))

    def _restore_model(self, ch) -> None:
        """A model as it was before: its directory back, and loaded (or unloaded) where the server runs."""
        if ch.key == "repository":
            self._put_files_back(ch)
        self._load_previous(ch)

    def _load_previous(self, ch) -> None:
        from hkgpu_tune.serve.running import forms
        d = ch.data
        if d.get("restart") or (ch.key == "served_config" and d.get("files")):
            return   # the undo of the plan's launch or repository change loads it (_undo_order)
        c = forms.ServiceRef.from_dict(d["service"]).client()
        try:
            if not c.live():
                return
            if ch.key == "served_config":
                c.load_model(d["model"], d["served"])
            elif d.get("existed"):
                c.load_model(d["model"])
            else:
                c.unload_model(d["model"])
        finally:
            c.close()

    def _restore_launch(self, ch) -> None:
        from hkgpu_tune.serve.running import forms, launch
        ref = forms.ServiceRef.from_dict(ch.data["service"])
        if ch.key == "unit":
            before = ch.data.get("before")
            if before is not None:   # a unit text from disk: its programs must pass the trust rule
                from hkgpu_tune.serve.running.records import check_unit_text
                check_unit_text(before)
            self.b.systemd.write_unit(forms.unit_name(ref), before)  # None: the unit did not exist
            self.b.systemd.daemon_reload()
            if before is not None and self.b.systemd.is_active(forms.unit_name(ref)):
                launch.stop(ref, self.b)
                self.b.systemd.enable(forms.unit_name(ref), now=True)
                self._wait_back(ref)
        elif ch.key == "command":
            launch.respawn(ref, ch.data["before"], self.b)
            self._wait_back(ref)

    @staticmethod
    def _wait_back(ref) -> None:
        """Poll until the previous server answers ready (with every model, under the server's
        strict readiness), at most its load timeout."""
        import time
        c = ref.client()
        end = time.monotonic() + ref.load_timeout_s
        try:
            while not c.ready():
                if time.monotonic() > end:
                    raise HkError(f"triton: the previous server on {ref.http_host}:{ref.http_port} is not ready "
                                  f"after {ref.load_timeout_s:.0f} s")
                time.sleep(0.1)
        finally:
            c.close()

    def restore(self, change):
        from hkgpu_tune.serve.running import forms, launch
        d = change.data
        if change.key in ("repository", "served_config"):
            self._restore_model(change)
            if change.key == "repository":
                self._drop_copies(d)
        elif change.key == "service" and change.current != "running":
            launch.stop(forms.ServiceRef.from_dict(d["service"]), self.b)
        elif change.key in ("unit", "command"):
            self._restore_launch(change)

    @staticmethod
    def _drop_copies(d) -> None:
        """The kept copies of a model once it is back; the copy of an earlier apply (`original`) stays
        while its entry, still in the journal, needs it for a later rollback."""
        import shutil
        from hkgpu_tune.serve.repository import redeploy
        keep = d.get("original") if d.get("original") != d.get("backup") else None
        for p in redeploy.copies(d["repository"], d["model"]):
            if p != keep:
                shutil.rmtree(p, ignore_errors=True)

    def facts(self) -> dict:
        from hkgpu_tune.serve.running import forms
        st = self.read()
        st["placement"] = forms.placement(self.t, self.b)
        return st


# ---------------------------------------------------------------- the setting types (state.json)
_NAME = re.compile(r"[A-Za-z0-9_.@:+-]{1,128}")


def _check_service(c) -> None:
    fields.text(c.target, "target", maxlen=4096)
    fields.one_of(c.key, "key", ("repository", "unit", "served_config", "service", "command"))
    if "unit" in c.data:   # the service of several (triton.services) the change belongs to
        u = c.data["unit"]
        from hkgpu_tune.serve.schema.config import UNIT_RE   # the profile's own rule for a unit name
        if not (isinstance(u, str) and re.fullmatch(UNIT_RE, u)):
            fields.fail(f"data.unit: {u!r} is not a unit name")
    if c.key == "repository":
        m = c.data.get("model")
        if not (isinstance(m, str) and _NAME.fullmatch(m)) or m in (".", ".."):
            fields.fail(f"data.model: {m!r} is not a model name")
        if "model_dir" in c.data:  # paths rollback moves and removes (triton/redeploy.py)
            from hkgpu_tune.core.errors import StateError
            from hkgpu_tune.serve.repository.redeploy import check_record
            try:
                check_record(c.data)
            except StateError as e:
                fields.fail(str(e))
    if c.key == "unit" and c.data.get("before") is not None:   # the text rollback writes back
        from hkgpu_tune.core.errors import HkError
        from hkgpu_tune.serve.schema.shapes import check_unit_text
        try:
            check_unit_text(c.data["before"])
        except HkError as e:
            fields.fail(str(e))
    if c.key == "command":   # a respawn record: only a Triton server command (serve.records)
        from hkgpu_tune.core.errors import HkError
        from hkgpu_tune.serve.running.records import check_record
        try:
            check_record(c.data.get("before"))
        except HkError as e:
            fields.fail(str(e))
    for k in ("restart", "files"):   # what its undo leaves to another change (Service._undo_order)
        fields.boolean(c.data.get(k), f"data.{k}", none=True)
    fields.plain(c.current, "original")
    fields.plain(c.desired, "desired")


def _parse(node):
    from hkgpu_tune.serve.schema.services import parse_profile
    return parse_profile(node)


def _check_layout(profile) -> None:
    from hkgpu_tune.serve.schema.devices import check_layout
    check_layout(profile)


SPEC = Spec(name="triton", order=110, section="triton", plugin=Plugin, persist="unit",
            sections={"triton": _parse},
            checks=((("gpu",), _check_layout),),   # MIG positions (triton.gpu, mps.gpus) against gpu.mig
            types=(SettingType("triton.service", "triton", _check_service),))
