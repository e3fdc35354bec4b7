"""Run a playbook over a rack through ansible-runner and return per-host results.

    hkgpu-tune rack apply  --inventory inventory/hk --limit rack_tko_a01
    hkgpu-tune rack verify --inventory inventory/hk --limit rack_tko_a01 --json

>>> run = run_playbook("verify", "inventory/hk", limit="rack_tko_a01")   # doctest: +SKIP
>>> {h: r.failed for h, r in run.hosts.items()}                         # doctest: +SKIP
{'tko-a01-n01': False, ...}
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hkgpu_tune.core.errors import HkError

PLAYBOOKS = {"apply": "site.yml", "verify": "verify.yml", "rollback": "rollback.yml"}
PLAYBOOKS["baseline"] = "baseline.yml"   # capture and fetch snapshots; fleet/baseline_rack.py prints the tables


COLLECTION = ("collections", "ansible_collections", "hkgpu", "tune")   # under ansible_dir()
# the per-host bound (rack --timeout): each task's action on a host (Ansible's task_timeout), and
# connecting to it, ssh's banner included (Ansible's timeout, at most CONNECT_TIMEOUT_S); a host past
# either is reported timed out or unreachable, never waited for in silence
TIMEOUT_S = 900
CONNECT_TIMEOUT_S = 30


def connect_timeout(timeout: int) -> int:
    """Connecting gets half the bound (at most CONNECT_TIMEOUT_S): a silent host is unreachable before
    the task that waits on it times out."""
    return max(1, min(CONNECT_TIMEOUT_S, timeout // 2))


def ansible_dir() -> Path:
    """The directory holding ansible.cfg and collections/ (the collection hkgpu.tune: playbooks,
    roles, module): HKGPU_TUNE_ANSIBLE_DIR, else the package's hkgpu_tune/ansible (links into the
    source tree there; real files in an installed wheel)."""
    env = os.environ.get("HKGPU_TUNE_ANSIBLE_DIR")
    if env:
        return Path(env)
    from importlib.resources import files
    return Path(str(files("hkgpu_tune").joinpath("ansible")))


@dataclass
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    last_task: str = ""
    state: str = "waiting"          # waiting | running | ok | changed | failed | unreachable | timed out
    msg: str = ""
    failures: list = field(default_factory=list)     # Result.to_dict() of failed settings
    results: list = field(default_factory=list)      # every Result.to_dict() the hkgpu module returned
    diffs: list = field(default_factory=list)        # --check/--diff: {"task", "diff"} (unified diff text)
    failed_check: str = ""   # verify | apply: the failures are what that read-back found; else msg says
    timed_out: bool = False  # a task ran past the per-host bound (rack --timeout)

    @property
    def is_failed(self) -> bool:
        return bool(self.failed or self.unreachable)


@dataclass
class RackRun:
    playbook: str
    rc: int
    status: str
    elapsed_s: float
    hosts: dict[str, HostResult]

    @property
    def failed_hosts(self) -> list[str]:
        return [h for h, r in self.hosts.items() if r.is_failed]

    def to_dict(self) -> dict:
        return {"playbook": self.playbook, "rc": self.rc, "status": self.status, "elapsed_s": round(self.elapsed_s, 2),
                "hosts": {h: asdict(r) for h, r in self.hosts.items()}}


def _host(hosts, name) -> HostResult:
    if name not in hosts:
        hosts[name] = HostResult(name)
    return hosts[name]


def handle_event(hosts: dict, ev: dict) -> str | None:
    """Fold one ansible-runner event into the per-host results; returns the host it touched."""
    kind, data = ev.get("event", ""), ev.get("event_data") or {}
    name = data.get("host")
    if kind == "playbook_on_stats":
        for key in ("ok", "changed", "failures", "dark", "skipped"):
            for h, n in (data.get(key) or {}).items():
                r = _host(hosts, h)
                setattr(r, {"failures": "failed", "dark": "unreachable"}.get(key, key), n)
        for r in hosts.values():
            if r.state in ("waiting", "running"):
                r.state = "changed" if r.changed else "ok"
        return None
    if not name:
        return None
    r = _host(hosts, name)
    res = data.get("res") or {}
    if kind == "runner_on_start":
        r.state, r.last_task = "running", data.get("task", "")
    elif kind == "runner_on_ok":
        if res.get("changed"):
            r.state = "changed"
        elif r.state != "changed":
            r.state = "running"
    elif kind == "runner_on_failed" and res.get("timedout"):   # Ansible's task_timeout (rack --timeout)
        period = (res["timedout"] or {}).get("period") if isinstance(res["timedout"], dict) else None
        r.state, r.timed_out = "timed out", True
        r.msg = f"timed out: {data.get('task', 'a task')} ran past {period or 'the'} s (rack --timeout)"
    elif kind == "runner_on_failed" and not data.get("ignore_errors"):
        r.state, r.msg = "failed", str(res.get("msg", ""))[:2000]
        r.failed_check = str(res.get("failed_check") or "")
    elif kind == "runner_on_unreachable":
        r.state, r.msg = "unreachable", str(res.get("msg", ""))[:500]
    if kind == "runner_on_ok":
        for item, d in task_diffs(res):
            text = diff_text(d)
            if text:
                task = data.get("task", "")
                r.diffs.append({"task": f"{task} ({item})" if item else task, "diff": text})
    if kind in ("runner_on_ok", "runner_on_failed") and "results" in res and isinstance(res["results"], list) \
            and all(isinstance(x, dict) and "subsystem" in x for x in res["results"]):
        r.results = res["results"]
        r.failures = res.get("failures") or [x for x in res["results"] if x.get("status") in ("drift", "error")]
    return name


def task_diffs(res: dict) -> list:
    """(item label, diff) of a task's result: its own diff, or each changed loop item's."""
    if res.get("diff"):
        return [("", res["diff"])]
    items = res.get("results") if isinstance(res.get("results"), list) else []
    return [(str(x.get("_ansible_item_label", x.get("item", ""))), x["diff"]) for x in items
            if isinstance(x, dict) and x.get("diff") and x.get("changed")]


def diff_text(d) -> str:
    """Ansible's diff of a task (a dict with before/after or prepared, or a list of them) as
    unified diff text, the way ansible-playbook --diff shows it."""
    import difflib
    if isinstance(d, list):
        return "".join(diff_text(x) for x in d)
    if not isinstance(d, dict):
        return ""
    if d.get("prepared"):
        return str(d["prepared"]).rstrip("\n") + "\n"
    before, after = d.get("before", ""), d.get("after", "")
    if not isinstance(before, str) or not isinstance(after, str):
        before, after = (json.dumps(x, indent=2, sort_keys=True, default=str) + "\n" for x in (before, after))
    if before == after:
        return ""
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        str(d.get("before_header") or "before"),
                                        str(d.get("after_header") or "after")))


def run_playbook(action: str, inventory: str, limit: str | None = None, extravars: dict | None = None,
                 tags: str | None = None, check: bool = False, on_update=None, verbosity: int = 0,
                 forks: int | None = None, skip_tags: str | None = None, on_event=None,
                 diff: bool = False, timeout: int = TIMEOUT_S, user: str | None = None,
                 vault_password_file: str | None = None, vault_password: str | None = None) -> RackRun:
    """Run site.yml (apply), verify.yml or rollback.yml (or a playbook path) through ansible-runner.
    timeout: the per-host bound in seconds (see TIMEOUT_S)."""
    try:
        import ansible_runner
    except ImportError as e:
        raise HkError(f"hkgpu-tune rack needs ansible-runner and ansible-core ({e}): "
                      "pip install 'hkgpu-tune[rack]' on the controller") from None

    base = ansible_dir()
    coll = base.joinpath(*COLLECTION)
    playbook = Path(action) if action not in PLAYBOOKS else coll / "playbooks" / PLAYBOOKS[action]
    if not playbook.exists():
        raise HkError(f"{playbook}: no such playbook (HKGPU_TUNE_ANSIBLE_DIR: a directory with ansible.cfg "
                      f"and {'/'.join(COLLECTION)})")
    if not os.path.exists(inventory):
        raise HkError(f"{inventory}: no such inventory")
    hosts: dict[str, HostResult] = {}
    cmdline = []   # ansible-playbook's own flags (ansible-runner adds -i, --limit, --forks, -v)
    if tags:
        cmdline += ["--tags", tags]
    if skip_tags:
        cmdline += ["--skip-tags", skip_tags]
    if check:
        cmdline += ["--check", "--diff"]
    elif diff:
        cmdline += ["--diff"]
    if user:
        cmdline += ["--user", user]
    if vault_password_file:
        cmdline += ["--vault-password-file", os.path.abspath(vault_password_file)]

    def handler(ev):
        if on_event:
            on_event(ev)
        name = handle_event(hosts, ev)
        if on_update and (name or ev.get("event") == "playbook_on_stats"):
            on_update(hosts)
        return False   # do not keep the event files

    tmp = tempfile.mkdtemp(prefix="hkgpu-rack-")     # 0700: the vault password below is ours alone
    t0 = time.monotonic()
    try:
        if vault_password is not None:   # --ask-vault-pass: asked here, read by ansible from a private file
            vf = os.path.join(tmp, "vault-pass")
            fd = os.open(vf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(vault_password + "\n")
            cmdline += ["--vault-password-file", vf]
        envvars = {"ANSIBLE_CONFIG": str(base / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(coll / "roles"),
                   "ANSIBLE_TASK_TIMEOUT": str(timeout), "ANSIBLE_TIMEOUT": str(connect_timeout(timeout)),
                   # ssh's shared connections (ControlPersist) of this run only: a master left by an
                   # earlier run to the same address (a host rebuilt, its connection dead) is never reused
                   "ANSIBLE_SSH_CONTROL_PATH_DIR": os.path.join(tmp, "cp"),
                   "ANSIBLE_COLLECTIONS_PATH": str(base / "collections"),
                   # ansible-playbook of this interpreter's environment even when its bin/ is not on PATH
                   "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
        r = ansible_runner.run(private_data_dir=tmp, playbook=str(playbook.resolve()),
                               inventory=os.path.abspath(inventory), limit=limit, extravars=extravars or {},
                               cmdline=shlex.join(cmdline) or None, envvars=envvars, quiet=True,
                               event_handler=handler, verbosity=verbosity or None, forks=forks,
                               suppress_env_files=True)
    finally:
        _close_masters(os.path.join(tmp, "cp"))
        shutil.rmtree(tmp, ignore_errors=True)
    return RackRun(str(playbook), r.rc, r.status, time.monotonic() - t0, hosts)


def _close_masters(cp: str) -> None:
    """End this run's ssh master connections (they would outlive it by ControlPersist)."""
    if not os.path.isdir(cp):
        return
    import subprocess
    for e in os.listdir(cp):
        subprocess.run(["ssh", "-o", f"ControlPath={os.path.join(cp, e)}", "-O", "exit", "hkgpu-rack"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)


# ---------------------------------------------------------------- CLI: hkgpu-tune rack ...
def add_parser(sub) -> None:
    import argparse
    p = sub.add_parser("rack", help="run apply / verify / rollback over a rack with Ansible")
    p.add_argument("action", choices=sorted(PLAYBOOKS))
    p.add_argument("--inventory", "-i", required=True, help="Ansible inventory (file or directory)")
    p.add_argument("--limit", "-l", help="hosts or groups, e.g. rack_tko_a01")
    p.add_argument("--tags", "-t", help="only these roles / subsystems, e.g. sysctl,link")
    p.add_argument("--skip-tags", help="all but these roles / subsystems")
    p.add_argument("--forks", "-f", type=_positive, help="hosts at a time (ansible's --forks)")
    p.add_argument("--verbose", "-v", action="count", default=0,
                   help="ansible-playbook's -v (repeat for more); its output is printed as it comes")
    p.add_argument("--check", "-C", action="store_true", help="check mode with diff: change nothing, "
                                                              "show what would change")
    p.add_argument("--diff", "-D", action="store_true", help="show each task's changes as a diff")
    p.add_argument("--extra-vars", "-e", action="append", default=[], metavar="KEY=VALUE, JSON or @FILE",
                   help="variables as ansible-playbook takes them: KEY=VALUE, a JSON object, or @FILE "
                        "(a YAML or JSON file of variables)")
    p.add_argument("--timeout", type=_positive, default=TIMEOUT_S, metavar="SECONDS",
                   help=f"per-host bound: a task running longer on a host fails it as timed out, and a host "
                        f"that does not answer within half of it (at most {CONNECT_TIMEOUT_S} s) is unreachable "
                        f"(default {TIMEOUT_S})")
    p.add_argument("--user", "-u", help="the SSH user (ansible's --user); root through become")
    p.add_argument("--become", action=argparse.BooleanOptionalAction, default=None,
                   help="become root on the nodes (the playbooks' default; sets hkgpu_become)")
    p.add_argument("--ask-vault-pass", action="store_true", help="ask for the vault password")
    p.add_argument("--vault-password-file", metavar="FILE", help="ansible's --vault-password-file")
    p.add_argument("--json", action="store_true", help="machine-readable per-host results")
    p.set_defaults(extra_run=cli_run)


def _varsfile(path: str) -> dict:
    """-e @FILE: a YAML (or JSON) mapping of variables; one line naming the file otherwise."""
    import yaml
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise HkError(f"--extra-vars @{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise HkError(f"--extra-vars @{path}{where}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not all(isinstance(k, str) for k in doc):
        raise HkError(f"--extra-vars @{path}: expected a mapping of variable names to values")
    return doc


def _extravars(items) -> dict:
    out = {}
    for s in items:
        if s.startswith("@"):
            out.update(_varsfile(s[1:]))
        elif s.lstrip().startswith("{"):
            try:
                out.update(json.loads(s))
            except ValueError as e:
                raise HkError(f"--extra-vars: not valid JSON: {e}") from None
        elif "=" in s:
            k, v = s.split("=", 1)
            out[k] = v
        else:
            raise HkError(f"--extra-vars: expected KEY=VALUE, JSON or @FILE, got {s!r}")
    return out


def _positive(v: str) -> int:
    import argparse
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {v}")
    return n


COLOURS = {"waiting": "dim", "running": "cyan", "ok": "green", "changed": "yellow", "failed": "red",
           "unreachable": "red", "timed out": "red"}


def _progress(hosts):
    from rich.table import Table
    from rich.text import Text
    t = Table.grid(padding=(0, 2))
    for r in sorted(hosts.values(), key=lambda r: r.host):
        t.add_row(Text(r.host, style="bold"), Text(r.state, style=COLOURS[r.state]), Text(r.last_task))
    return t


def _what_failed(r: HostResult) -> str:
    """The check that failed and its settings ("verify: sysctl host KEY: 33 != 15"); the message
    when something else failed (a gate, a profile error), whatever settings it left behind."""
    from hkgpu_tune.core.report import fmt
    settings = "; ".join(f"{f['subsystem']} {f['target']} {f['key']}: {fmt(f.get('current'))} != "
                         f"{fmt(f.get('desired'))}" for f in r.failures)
    if settings and r.failed_check:
        return f"{r.failed_check}: {settings}"
    return r.msg or settings


def host_line(r: HostResult) -> str:
    """One plain line per host (logs, pipes, CI): grep-able, no colour."""
    state = r.state if r.state in ("unreachable", "timed out") else "failed" if r.is_failed else r.state
    line = (f"{r.host}: {state} ok={r.ok} changed={r.changed} "
            f"failed={r.failed} unreachable={r.unreachable}")
    what = _what_failed(r) if r.is_failed else ""
    return f"{line}: {' '.join(what.split())}" if what else line


def summary_table(run: RackRun):
    from rich.text import Text
    from hkgpu_tune.core.report import _table
    t = _table(f"{Path(run.playbook).name}: {len(run.hosts)} host(s) in {run.elapsed_s:.1f} s",
               [("host", max((len(h) for h in run.hosts), default=4)), ("ok", 2), ("changed", 7), ("failed", 6),
                ("unreachable", 11), ("what failed", 0)])
    for r in sorted(run.hosts.values(), key=lambda r: r.host):
        colour = "red" if r.is_failed else ("yellow" if r.changed else "green")
        t.add_row(Text(r.host, style=colour), str(r.ok), str(r.changed), str(r.failed), str(r.unreachable),
                  Text(_what_failed(r)))
    return t


def _print_diffs(run: RackRun, out) -> None:
    for r in sorted(run.hosts.values(), key=lambda r: r.host):
        for d in r.diffs:
            out(f"--- {r.host}: {d['task']}")
            for line in d["diff"].rstrip("\n").split("\n"):
                out(line)


TASK_DONE = {"runner_on_ok": "ok", "runner_on_failed": "failed", "runner_on_unreachable": "unreachable"}


def task_line(ev: dict) -> str | None:
    """One line per host and task as it finishes ("tko-a01-n03 changed: sysctl"), for a log."""
    data = ev.get("event_data") or {}
    status = TASK_DONE.get(ev.get("event", ""))
    if status is None or not data.get("host"):
        return None
    res = data.get("res") or {}
    if status == "ok" and res.get("changed"):
        status = "changed"
    elif status == "failed" and data.get("ignore_errors"):
        status = "failed (ignored)"
    elif status == "failed" and res.get("timedout"):
        status = "timed out"
    return f"{data['host']} {status}: {data.get('task', '')}"


def cli_run(args) -> int:
    from rich.text import Text
    from hkgpu_tune.core.report import envelope, make_console, wrap

    extra = _extravars(args.extra_vars)
    if args.become is not None:
        extra["hkgpu_become"] = args.become
    kw = dict(verbosity=args.verbose, forks=args.forks, skip_tags=args.skip_tags, diff=args.diff, user=args.user,
              timeout=args.timeout,
              vault_password_file=args.vault_password_file)
    if args.ask_vault_pass:
        import getpass
        kw["vault_password"] = getpass.getpass("Vault password: ")
    err = make_console(stderr=True)
    if args.verbose and not args.json:   # ansible's own output, as it comes
        import re
        tty = sys.stdout.isatty()
        kw["on_event"] = lambda ev: ev.get("stdout") and print(
            ev["stdout"] if tty else re.sub(r"\x1b\[[0-9;]*m", "", ev["stdout"]), flush=True)
    elif not args.json and not sys.stdout.isatty():   # a log: each host's task as it finishes
        kw["on_event"] = lambda ev: (line := task_line(ev)) and print(wrap(line), flush=True)
    if args.json:
        run = run_playbook(args.action, args.inventory, args.limit, extra, args.tags, args.check, **kw)
        print(json.dumps(envelope(f"rack {args.action}", run.to_dict()), indent=2, default=str))
    elif sys.stdout.isatty() and not args.verbose:
        from rich.live import Live
        con = make_console()
        with Live(_progress({}), console=con, refresh_per_second=8, transient=True) as live:
            run = run_playbook(args.action, args.inventory, args.limit, extra, args.tags, args.check,
                               on_update=lambda hosts: live.update(_progress(hosts)), **kw)
        if args.check or args.diff:
            _print_diffs(run, lambda s: con.print(Text(s, style="green" if s[:1] == "+" else
                                                       "red" if s[:1] == "-" else ""), soft_wrap=True))
        con.print(summary_table(run))
    else:   # a pipe, a log, CI: plain lines, one per host, no control characters
        run = run_playbook(args.action, args.inventory, args.limit, extra, args.tags, args.check, **kw)
        if args.check or args.diff:
            _print_diffs(run, print)
        for r in sorted(run.hosts.values(), key=lambda r: r.host):
            print(wrap(host_line(r)))
        print(f"{Path(run.playbook).name}: {len(run.hosts)} host(s), {len(run.failed_hosts)} failed, "
              f"{run.elapsed_s:.1f} s")
    if not run.hosts:
        err.print(Text(f"hkgpu-tune: error: no host ran ({run.status}, rc {run.rc}): check --inventory and --limit"))
        return 1
    if run.failed_hosts:
        only_drift = args.action == "verify" and all(
            r.failures and all(f["status"] == "drift" for f in r.failures) for r in run.hosts.values() if r.is_failed)
        return 2 if only_drift else 1
    if run.rc == 0 and args.check and any(r.changed for r in run.hosts.values()):
        return 2     # --check: changes pending (drift), as `hkgpu-tune plan`
    return 0 if run.rc == 0 else 1
