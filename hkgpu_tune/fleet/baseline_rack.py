"""hkgpu-tune rack baseline: capture a snapshot on every host (playbooks/baseline.yml fetches them
to the controller as DIR/RACK/HOST/LABEL.json), then one compare table per rack, host by host.

    hkgpu-tune rack baseline -i inventory/hk -l rack_tko_a01 -e hkgpu_baseline_label=before
    hkgpu-tune apply ... (or rack apply)
    hkgpu-tune rack baseline -i inventory/hk -l rack_tko_a01 -e hkgpu_baseline_label=after

Extra variables: hkgpu_baseline_label (default before), hkgpu_baseline_dir (default ./baseline),
hkgpu_baseline_quick (default false), hkgpu_baseline_capture (false: only print the tables from
the snapshots already fetched). Exit 0, 2 (a host regressed), 1 (a host failed or none ran).
"""
from __future__ import annotations

import json
import os
import re
import sys

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.baseline import compare

LABEL_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")


def _bool(v) -> bool:
    return v is True or str(v).lower() in ("1", "true", "yes", "on")


def snapshots(dest: str, before: str, after: str) -> dict[str, dict[str, tuple[str | None, str | None]]]:
    """{rack: {host: (before path or None, after path or None)}} from DIR/RACK/HOST/LABEL.json."""
    out: dict = {}
    if not os.path.isdir(dest):
        return out
    for rack in sorted(os.listdir(dest)):
        rdir = os.path.join(dest, rack)
        if not NAME_RE.fullmatch(rack) or not os.path.isdir(rdir):
            continue
        for host in sorted(os.listdir(rdir)):
            hdir = os.path.join(rdir, host)
            if not NAME_RE.fullmatch(host) or not os.path.isdir(hdir):
                continue
            pair = tuple(p if os.path.isfile(p) else None
                         for p in (os.path.join(hdir, f"{before}.json"), os.path.join(hdir, f"{after}.json")))
            if any(pair):
                out.setdefault(rack, {})[host] = pair
    return out


def rack_reports(dest: str, before: str = "before", after: str = "after", cfg=None) -> dict:
    """{rack: {host: {"comparison": Comparison} | {"missing": why} | {"error": why}}}."""
    out: dict = {}
    for rack, hosts in snapshots(dest, before, after).items():
        for host, (b, a) in hosts.items():
            if not (b and a):
                rec = {"missing": f"no {before if not b else after} snapshot yet"}
            else:
                try:
                    rec = {"comparison": compare.compare(compare.load(b), compare.load(a), cfg)}
                except HkError as e:
                    rec = {"error": str(e)}
            out.setdefault(rack, {})[host] = rec
    return out


def rack_table(rack: str, hosts: dict):
    """One table per rack: per host, its regressions and changes outside the noise (all within
    noise: one row saying so)."""
    from rich.table import Table
    from rich.text import Text
    t = Table(title=Text(f"rack {rack}: baseline before -> after"), title_justify="left")
    for c in ("host", "metric", "before", "after", "change", "verdict"):
        t.add_column(c, overflow="fold", no_wrap=c in ("before", "after", "change"))
    for host, rec in hosts.items():
        if "comparison" not in rec:
            t.add_row(Text(host), Text(rec.get("missing") or rec.get("error")), *(Text("-"),) * 3,
                      Text("missing" if "missing" in rec else "error", style="red" if "error" in rec else "yellow"))
            continue
        cmp = rec["comparison"]
        rows = [r for r in cmp.rows if r.verdict not in ("within noise", "not measured")]
        if not rows:
            t.add_row(Text(host), Text(f"all {len(cmp.rows)} metrics"), Text("-"), Text("-"), Text("-"), Text("within noise"))
        for r in rows:
            cells = compare.row_cells(r)
            t.add_row(Text(host), *(Text(c) for c in cells[:4]),
                      Text(cells[5], style="red" if r.regressed else "green" if r.verdict == "better" else "yellow"))
    return t


def cli_run(args) -> int:
    """`hkgpu-tune rack baseline` (the CLI hands this action here)."""
    from hkgpu_tune.fleet import rack
    from hkgpu_tune.core.report import envelope
    extra = rack._extravars(args.extra_vars)
    label = str(extra.get("hkgpu_baseline_label", "before"))
    if not re.fullmatch(LABEL_RE, label):
        raise HkError(f"-e hkgpu_baseline_label: expected letters, digits, '_.-' (a file name), got {label!r}")
    dest = os.path.abspath(str(extra.get("hkgpu_baseline_dir", "baseline")))
    extra.update(hkgpu_baseline_label=label, hkgpu_baseline_dir=dest)
    run = None
    if _bool(extra.get("hkgpu_baseline_capture", True)):
        run = rack.run_playbook("baseline", args.inventory, args.limit, extra, args.tags, False,
                                verbosity=getattr(args, "verbose", 0), forks=getattr(args, "forks", None))
    reports = rack_reports(dest)
    regressed = [f"{h}: {r.key}" for hosts in reports.values() for h, rec in hosts.items()
                 if "comparison" in rec for r in rec["comparison"].regressions]
    if args.json:
        data = {"dir": dest, "label": label, "run": run.to_dict() if run else None,
                "racks": {rk: {h: ({"comparison": rec["comparison"].to_dict()} if "comparison" in rec else rec)
                               for h, rec in hosts.items()} for rk, hosts in reports.items()},
                "regressions": regressed}
        print(json.dumps(envelope("rack baseline", data), indent=2, default=str))
    else:
        from hkgpu_tune.core.report import make_console, wrap
        con = make_console()
        if run:
            for r in sorted(run.hosts.values(), key=lambda r: r.host):
                print(wrap(rack.host_line(r)))
        for rk, hosts in reports.items():
            con.print(rack_table(rk, hosts))
        if not reports:
            print(f"no snapshots under {dest} yet")
        print(wrap(f"{len(regressed)} regression(s)" + (": " + "; ".join(regressed) if regressed else "")))
    if run is not None and (not run.hosts or run.failed_hosts):
        print(f"hkgpu-tune: error: baseline capture failed on {', '.join(run.failed_hosts) or 'every host (none ran)'}",
              file=sys.stderr)
        return 1
    return 2 if regressed else 0
