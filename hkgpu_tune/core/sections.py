"""The profile's sections: each registered by the module that owns it, never named here.

core/ may not name a higher layer, not even by string (tests/unit/test_layout.py), so the
section table is filled from above: the package's facade (hkgpu_tune/__init__.py, which runs
before any module of the package) adds a loader, and the first parse runs it. The loader takes
each subsystem's sections from its SPEC and the sections of observe/ and baseline/.

>>> from hkgpu_tune.core import sections
>>> sections.table()["cpufreq"].__module__
'hkgpu_tune.subsystems.cpufreq'
"""
from __future__ import annotations

from typing import Any, Callable

Parser = Callable[[Any], Any]
_TABLE: dict[str, Parser] = {}
_OWNER: dict[str, str] = {}
_CHECKS: list[tuple[tuple[str, ...], Callable]] = []
_LOADERS: list[Callable[[], None]] = []
_state = {"loaded": False}


def register(name: str, parse: Parser, owner: str = "") -> None:
    """Add a section; a name registered twice by two owners is a programming error."""
    if not callable(parse):
        raise TypeError(f"profile section {name!r}: the parser is not callable")
    if name in _TABLE and _TABLE[name] is not parse:
        raise ValueError(f"profile section {name!r} has two owners: {_OWNER[name]} and {owner}")
    _TABLE[name], _OWNER[name] = parse, owner


def register_check(needs: tuple[str, ...], check: Callable) -> None:
    """check(profile), run once all sections are parsed when the profile has every section in needs."""
    if (needs, check) not in _CHECKS:
        _CHECKS.append((tuple(needs), check))


def add_loader(fn: Callable[[], None]) -> None:
    _LOADERS.append(fn)
    _state["loaded"] = False


def _load() -> None:
    if _state["loaded"]:
        return
    _state["loaded"] = True
    try:
        for fn in list(_LOADERS):
            fn()
    except BaseException:
        _state["loaded"] = False
        raise


def table() -> dict[str, Parser]:
    """Section name -> parser(node)."""
    _load()
    return dict(_TABLE)


def owners() -> dict[str, str]:
    _load()
    return dict(_OWNER)


def checks() -> list[tuple[tuple[str, ...], Callable]]:
    _load()
    return list(_CHECKS)
