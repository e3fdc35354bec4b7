"""systemd's own quoting and escaping for the units this tool renders (systemd.service(5) "Command
lines", systemd.exec(5), systemd.unit(5) "Specifiers"): every value that reaches a unit goes
through one of these, never through shell quoting.

- a command line: each word in double quotes where it is not plain, with C escapes for '\\' and
  '"', '%' as '%%' (specifiers) and '$' as '$$' (environment substitution);
- Environment=: the whole assignment quoted, '%' doubled ('$' is not expanded there);
- a path list (ReadOnlyPaths=, BindPaths=, ...): each path quoted, '%' doubled;
- a plain value (User=, Description=): '%' doubled.
A line break or control character cannot be written to a unit at all: UnitValueError.

>>> exec_line(["/opt/my tools/drain", "100%", "$HOME"])
'"/opt/my tools/drain" 100%% $$HOME'
>>> environment("LD_LIBRARY_PATH", "/opt/a b:/x")
'"LD_LIBRARY_PATH=/opt/a b:/x"'
>>> path("/srv/models")
'/srv/models'
"""
from __future__ import annotations

import os
import re

from hkgpu_tune.core.errors import HkError

_CTRL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_PLAIN = re.compile(r"[A-Za-z0-9_./:=,+@%$-]+")


class UnitValueError(HkError):
    """A value that no systemd quoting can carry (a line break, a control character)."""


def _check(s, what: str) -> str:
    if not isinstance(s, str):
        s = str(s)
    if _CTRL.search(s):
        raise UnitValueError(f"{what} {s!r}: a line break or control character cannot be written to a "
                             "systemd unit: refused")
    return s


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def word(s, what: str = "a command-line argument") -> str:
    """One word of a command line, as systemd reads it back: exactly `s`."""
    s = _check(s, what)
    if s and _PLAIN.fullmatch(s) and s != ";":
        return s.replace("%", "%%").replace("$", "$$")
    return '"' + _escape(s).replace("$", "$$") + '"'


def exec_line(argv, what: str = "command") -> str:
    """The value of ExecStart= (and the other Exec*=) for argv; the program must be absolute."""
    argv = list(argv)
    if not argv or not os.path.isabs(str(argv[0])):
        raise UnitValueError(f"{what}: the program must be an absolute path, got {argv[:1]!r}")
    return " ".join(word(a) for a in argv)


def environment(key: str, value) -> str:
    """The value of Environment= for one variable."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key or ""):
        raise UnitValueError(f"environment variable name {key!r}: not a valid name: refused")
    s = _check(f"{key}={value}", f"environment variable {key}")
    return s.replace("%", "%%") if _PLAIN.fullmatch(s) else '"' + _escape(s) + '"'


def path(p, what: str = "path", colon: bool = True) -> str:
    """One path of a path list (ReadOnlyPaths=, ReadWritePaths=, BindPaths=...). colon=False: a
    setting where ':' separates source and destination (BindPaths=): a ':' in the path is refused."""
    p = _check(p, what)
    if not os.path.isabs(p):
        raise UnitValueError(f"{what} {p!r}: not an absolute path: refused")
    if not colon and ":" in p:
        raise UnitValueError(f"{what} {p!r}: a ':' cannot be written to this unit setting: refused")
    return p.replace("%", "%%") if _PLAIN.fullmatch(p) else '"' + _escape(p) + '"'


def value(s, what: str = "value") -> str:
    """A plain single value (User=, Group=, Description=): specifiers escaped."""
    return _check(s, what).replace("%", "%%")
