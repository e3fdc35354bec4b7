"""Normalise values before comparing (tuned compares as int, then hex, then string, after whitespace)."""
from __future__ import annotations


def tokens(v) -> list[str]:
    if isinstance(v, bool):
        return ["1" if v else "0"]
    return str(v).split()


def _num(t: str):
    try:
        return int(t, 0) if t.lower().startswith("0x") else int(t)
    except ValueError:
        return None


def same(current, desired) -> bool:
    """'4096  87380\\t6291456' == '4096 87380 6291456'; '0x10' == '16'; 'Yes' != 'yes'."""
    a, b = tokens(current), tokens(desired)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        nx, ny = _num(x), _num(y)
        if nx is not None and ny is not None:
            if nx != ny:
                return False
        elif x != y:
            return False
    return True


def at_least(current, desired) -> bool:
    """Each field of current >= the same field of desired (buffer sizes: more is fine)."""
    a, b = tokens(current), tokens(desired)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        nx, ny = _num(x), _num(y)
        if nx is None or ny is None or nx < ny:
            return False
    return True


def as_bool(v) -> bool | None:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "on", "true", "yes", "enabled"):
        return True
    if s in ("0", "off", "false", "no", "disabled"):
        return False
    return None
