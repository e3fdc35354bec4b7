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

    @property
    def setting(self):
        """ident and where the setting lives (host, network namespace, device: core.place), when
        that was recorded: a replaced device or another namespace is another setting."""
        from hkgpu_tune.core.place import key
        return self.ident + key(self.data)


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
    """A value as sysctl, ethtool and tc print it: on/off, numbers, 'max', 'combined max',
    'gro on tso off'; never a Python repr ({'combined': 'max'}, True, None)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return " ".join(f"{k} {_fmt(x)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple, set)):
        return " ".join(_fmt(x) for x in v) or "-"
    return str(v)


fmt = _fmt
SCHEMA_VERSION = 1


def _profile_fields(profile) -> dict:
    """profile: its name or path; profile_source: why it was used (--profile, HKGPU_TUNE_PROFILE,
    node, persist, default), null where the caller did not say."""
    if profile is None:
        return {"profile": None, "profile_source": None}
    if hasattr(profile, "label"):   # a Profile
        return {"profile": profile.label, "profile_source": getattr(profile, "source", None)}
    return {"profile": str(profile), "profile_source": None}


def envelope(command: str, data: dict, profile=None) -> dict:
    """The one JSON shape of every command: who, what, when, then the command's own data.

    `profile`: a Profile (its label and source are kept), a name or path, or None.

    >>> list(envelope("verify", {"results": []}, "hk-inference"))
    ['schema_version', 'command', 'host', 'profile', 'profile_source', 'time', 'version', 'results']
    """
    import socket
    import time
    from hkgpu_tune.core.version import __version__
    head = {"schema_version": SCHEMA_VERSION, "command": command, "host": socket.gethostname(),
            **_profile_fields(profile),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": __version__}
    clash = sorted(set(head) & set(data))
    if clash:
        raise ValueError(f"envelope: the command's data must not carry {', '.join(clash)}")
    return {**head, **data}


def results_doc(results, extra=None) -> dict:
    doc = {
        "results": [r.to_dict() for r in results],
        "failures": [r.to_dict() for r in results if r.failed],
        "summary": {s: sum(1 for r in results if r.status == s) for s in STATUSES},
    }
    if extra:
        doc.update(extra)
    return doc


def to_json(results, extra=None) -> str:
    return json.dumps(results_doc(results, extra), indent=2, default=str)


WIDTH = 80   # the width of a report that is not on a terminal (a pipe, a file, the journal, CI)


class _Rstrip:
    """A text stream that drops the blanks rich pads the last cell of a row with: each line is
    written when its newline comes, without trailing spaces."""

    def __init__(self, stream):
        self._stream = stream
        self._part = ""

    def write(self, s: str) -> int:
        lines = (self._part + s).split("\n")
        self._part = lines.pop()
        if lines:
            self._stream.write("".join(ln.rstrip(" ") + "\n" for ln in lines))
        return len(s)

    def flush(self) -> None:
        if self._part:
            self._stream.write(self._part.rstrip(" "))
            self._part = ""
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def out_width(stream=None) -> int | None:
    """None on a terminal (rich asks it); else $COLUMNS where it is a number, capped at 80, else 80."""
    import os
    import sys
    stream = stream or sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if tty:
        return None
    cols = os.environ.get("COLUMNS", "")
    return min(int(cols), WIDTH) if cols.isdigit() and int(cols) >= 20 else WIDTH


def wrap(line: str, width: int = WIDTH) -> str:
    """A plain line of a log or a pipe, wrapped at words to `width`; continuation lines indented."""
    import textwrap
    if len(line) <= width:
        return line
    return "\n".join(textwrap.wrap(line, width, subsequent_indent="    ", break_long_words=False,
                                    break_on_hyphens=False))


def make_console(stderr: bool = False, file=None):
    """The one rich Console of every command: the terminal's width on a terminal; 80 columns in a
    pipe, a file or the journal, with no trailing blanks and no colour codes."""
    import sys
    from rich.console import Console
    stream = file or (sys.stderr if stderr else sys.stdout)
    width = out_width(stream)
    if width is None:
        return Console(file=stream, soft_wrap=False)
    return Console(file=_Rstrip(stream), width=width, soft_wrap=False, color_system=None,
                   force_terminal=False, force_jupyter=False)


def _table(title, cols):
    """A table that reads at 80 columns: no vertical rules; keys (a width given) are never folded
    inside a word unless longer than 36 characters; the other columns wrap at spaces."""
    from rich import box
    from rich.table import Table
    from rich.text import Text
    t = Table(title=Text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              padding=(0, 1), show_edge=False, min_width=len(title))
    for name, width in cols:
        if width:
            t.add_column(name, min_width=width, no_wrap=width < 36, overflow="fold")
        else:
            t.add_column(name, overflow="fold")
    return t


def _key_width(keys) -> int:
    return min(max((len(str(k)) for k in keys), default=3), 36)


COLOURS = {OK: "green", DRIFT: "yellow", UNSUPPORTED: "magenta", ERROR: "red"}


def _status(r):
    """The status, and the reason after it: one cell that wraps at spaces."""
    from rich.text import Text
    reason = str(r.reason or "")
    if r.status == UNSUPPORTED and not r.required:
        reason = f"optional; {reason}" if reason else "optional"
    return Text.assemble((r.status, COLOURS.get(r.status, "")), (f": {reason}" if reason else ""))


def _groups(items) -> dict:
    out: dict[tuple, list] = {}
    for x in items:
        out.setdefault((x.subsystem, str(x.target)), []).append(x)
    return out


def print_table(results, console=None, title="verify") -> None:
    """Values go in as rich Text: a '[red]' in a profile value or a device name is printed as is.
    One table per subsystem and target (both in the title)."""
    from rich.text import Text

    console = console or make_console()
    for (sub, target), rows in _groups(results).items():
        t = _table(f"{title}: {sub} {target}", [("key", _key_width(r.key for r in rows)), ("current", 0),
                                                ("desired", 0), ("status", 0)])
        for r in rows:
            t.add_row(Text(str(r.key)), Text(_fmt(r.current)), Text(_fmt(r.desired)), _status(r))
        console.print(t)
    console.print(Text(summary(results)))


# reasons that say no more than the current and desired columns do: not repeated under a plan
PLAIN_REASONS = {"differs", "below the desired value"}


def print_changes(changes, results=(), console=None, title="plan") -> None:
    from rich.text import Text

    console = console or make_console()
    why = {(r.subsystem, str(r.target), r.key): str(r.reason) for r in results if r.reason}
    for (sub, target), rows in _groups(changes).items():
        t = _table(f"{title}: {sub} {target}", [("key", _key_width(c.key for c in rows)), ("current", 0),
                                                ("desired", 0)])
        because: dict[str, list] = {}    # reason -> its keys: said once under the table, wrapping at 80
        for c in rows:
            t.add_row(Text(str(c.key)), Text(_fmt(c.current)), Text(_fmt(c.desired)))
            reason = "; ".join(x for x in why.get((c.subsystem, str(c.target), c.key), "").split("; ")
                               if x not in PLAIN_REASONS)
            if reason:
                because.setdefault(reason, []).append(str(c.key))
        console.print(t)
        for reason, keys in because.items():   # e.g. the bandwidth-delay arithmetic of tcp_buffers
            console.print(Text(f"{', '.join(keys)}: {reason}"))
    skipped = [r for r in results if r.status in (UNSUPPORTED, ERROR)]
    for r in skipped:
        console.print(Text.assemble((r.status, COLOURS.get(r.status, "")),
                                    f" {r.subsystem} {r.target} {r.key}: {r.reason}"))
    console.print(Text(f"{len(changes)} change(s), {len(skipped)} not applicable"))


def escape(s: str) -> str:
    return _html_escape(str(s), quote=True)


def to_prometheus(results) -> str:
    """Prometheus textfile-collector format: one gauge per setting, value 1 for the status it has."""
    from hkgpu_tune.core.promtext import Family, render
    status = Family("hkgpu_tune_setting_status", "gauge",
                    "Status of one tuned setting (1 = the status in the label).",
                    [({"subsystem": r.subsystem, "target": r.target, "key": r.key, "status": s}, int(r.status == s))
                     for r in results for s in STATUSES])
    failures = Family("hkgpu_tune_failures", "gauge", "Settings that failed verify.",
                      [({}, sum(1 for r in results if r.failed))])
    return "\n".join(render([status, failures], keep_empty=True)) + "\n"


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
