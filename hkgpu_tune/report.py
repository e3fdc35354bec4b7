"""Change and Result: the one shape of a drift, whoever prints it; and the renderers."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any
from html import escape as _html_escape

OK, DRIFT, UNSUPPORTED, ERROR = "ok", "drift", "unsupported", "error"
STATUSES = (OK, DRIFT, UNSUPPORTED, ERROR)


@dataclass
class Result:
    """One setting on one target, read back and compared.

    >>> Result("sysctl", "host", "net.core.rmem_max", "212992", "268435456", DRIFT).failed
    True
    """

    subsystem: str
    target: str
    key: str
    current: Any
    desired: Any
    status: str
    reason: str = ""
    required: bool = True
    # how to fix it: the value to write (None = not fixable by apply) and private data
    write: Any = None
    data: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        if self.status == UNSUPPORTED:
            return self.required
        return self.status in (DRIFT, ERROR)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("write")
        d.pop("data")
        return d


@dataclass
class Change:
    """A write the engine will make; `current` is the original it saves first."""

    subsystem: str
    target: str
    key: str
    current: Any
    desired: Any
    data: dict = field(default_factory=dict)
    applied: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Change":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @property
    def ident(self):
        return (self.subsystem, self.target, self.key)


def exit_code(results) -> int:
    if any(r.status == ERROR for r in results):
        return 1
    return 2 if any(r.failed for r in results) else 0


def summary(results) -> str:
    counts = {s: 0 for s in STATUSES}
    for r in results:
        counts[r.status] += 1
    return ", ".join(f"{counts[s]} {s}" for s in STATUSES)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (list, tuple)):
        return " ".join(_fmt(x) for x in v)
    return str(v)


SCHEMA_VERSION = 1


def envelope(command: str, data: dict, profile=None) -> dict:
    """The one JSON shape of every command: who, what, when, then the command's own data."""
    import socket
    import time
    from . import __version__
    head = {"schema_version": SCHEMA_VERSION, "command": command, "host": socket.gethostname(),
            "profile": None if profile is None else str(profile),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": __version__}
    return {**head, **data}


def to_json(results, extra=None) -> str:
    doc = {
        "results": [r.to_dict() for r in results],
        "failures": [r.to_dict() for r in results if r.failed],
        "summary": {s: sum(1 for r in results if r.status == s) for s in STATUSES},
    }
    if extra:
        doc.update(extra)
    return json.dumps(doc, indent=2, default=str)


def print_table(results, console=None, title="verify") -> None:
    """Values go in as rich Text: a '[red]' in a profile value or a device name is printed as is."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    colours = {OK: "green", DRIFT: "yellow", UNSUPPORTED: "magenta", ERROR: "red"}
    by_sub: dict[str, list] = {}
    for r in results:
        by_sub.setdefault(r.subsystem, []).append(r)
    for sub, rows in by_sub.items():
        t = Table(title=Text(f"{title}: {sub}"), title_justify="left")
        for col in ("target", "key", "current", "desired", "status", "reason"):
            t.add_column(col, overflow="fold")
        for r in rows:
            st = r.status if r.required or r.status != UNSUPPORTED else f"{r.status} (optional)"
            t.add_row(Text(str(r.target)), Text(str(r.key)), Text(_fmt(r.current)), Text(_fmt(r.desired)),
                      Text(st, style=colours.get(r.status, "")), Text(str(r.reason)))
        console.print(t)
    console.print(Text(summary(results)))


def print_changes(changes, results=(), console=None, title="plan") -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    t = Table(title=Text(title), title_justify="left")
    for col in ("subsystem", "target", "key", "current", "desired"):
        t.add_column(col, overflow="fold")
    for c in changes:
        t.add_row(*(Text(str(v)) for v in (c.subsystem, c.target, c.key)), Text(_fmt(c.current)), Text(_fmt(c.desired)))
    console.print(t)
    skipped = [r for r in results if r.status in (UNSUPPORTED, ERROR)]
    for r in skipped:
        console.print(Text.assemble((r.status, "magenta"), f" {r.subsystem} {r.target} {r.key}: {r.reason}"))
    console.print(Text(f"{len(changes)} change(s), {len(skipped)} not applicable"))


def escape(s: str) -> str:
    return _html_escape(str(s), quote=True)


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def to_prometheus(results) -> str:
    """Prometheus textfile-collector format: one gauge per setting, value 1 for the status it has."""
    lines = [
        "# HELP hkgpu_tune_setting_status Status of one tuned setting (1 = the status in the label).",
        "# TYPE hkgpu_tune_setting_status gauge",
    ]
    for r in results:
        lab = f'subsystem="{_label(r.subsystem)}",target="{_label(r.target)}",key="{_label(r.key)}"'
        for s in STATUSES:
            lines.append(f'hkgpu_tune_setting_status{{{lab},status="{s}"}} {1 if r.status == s else 0}')
    lines += ["# HELP hkgpu_tune_failures Settings that failed verify.",
              "# TYPE hkgpu_tune_failures gauge",
              f"hkgpu_tune_failures {sum(1 for r in results if r.failed)}"]
    return "\n".join(lines) + "\n"


def to_junit(results, name="hkgpu-tune verify") -> str:
    fails = sum(1 for r in results if r.failed)
    out = [f'<testsuite name="{escape(name)}" tests="{len(results)}" failures="{fails}">']
    for r in results:
        case = f'<testcase classname="{escape(r.subsystem)}.{escape(r.target)}" name="{escape(r.key)}"'
        if r.failed:
            msg = escape(f"{r.status}: current={_fmt(r.current)} desired={_fmt(r.desired)} {r.reason}")
            out.append(f'{case}><failure message="{msg}"/></testcase>')
        elif r.status == UNSUPPORTED:
            out.append(f'{case}><skipped message="{escape(r.reason)}"/></testcase>')
        else:
            out.append(f"{case}/>")
    out.append("</testsuite>")
    return "\n".join(out) + "\n"
