"""Registry of subsystems, like tuned's plugin repository: every module of this package but
base.py is one subsystem and declares it whole as `SPEC` (base.Spec: name, profile section and
parser, setting types, apply order, persistence, network-namespace scope). Every list of
subsystems in the package derives from here; a module without a complete SPEC fails the first
lookup, and tests/unit/test_registry.py.

>>> from hkgpu_tune import subsystems
>>> subsystems.ORDER[:3]
['sysctl', 'link', 'ethtool']
>>> subsystems.SECTION["qdisc"]
'network'
"""
from __future__ import annotations

import importlib
import pkgutil

from hkgpu_tune.subsystems.base import Spec, SpecError, check_spec

NOT_SUBSYSTEMS = {"base"}
_SPECS: dict[str, Spec] = {}
_state = {"loaded": False}


def register(spec: Spec) -> Spec:
    """Add a subsystem; SpecError when a piece is missing or its name or order is taken."""
    check_spec(spec)
    old = _SPECS.get(spec.name)
    if old is not None and old is not spec:
        raise SpecError(f"subsystem {spec.name!r} is registered twice")
    clash = [o.name for o in _SPECS.values() if o.order == spec.order and o.name != spec.name]
    if clash:
        raise SpecError(f"subsystem {spec.name!r}: order {spec.order} is {clash[0]}'s already")
    _SPECS[spec.name] = spec
    return spec


def _load() -> None:
    """Import every module of the package once and register its SPEC."""
    if _state["loaded"]:
        return
    _state["loaded"] = True
    try:
        for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            if m.name in NOT_SUBSYSTEMS:
                continue
            mod = importlib.import_module(f"{__name__}.{m.name}")
            spec = getattr(mod, "SPEC", None)
            if spec is None:
                raise SpecError(f"{mod.__name__} defines no SPEC: every module of subsystems/ is a subsystem "
                                "and declares itself whole (docs/architecture.md, 'Adding a subsystem')")
            if getattr(spec, "name", None) != m.name:
                raise SpecError(f"{mod.__name__}: SPEC.name is {getattr(spec, 'name', None)!r}, expected {m.name!r}")
            register(spec)
    except BaseException:
        _state["loaded"] = False
        _SPECS.clear()
        raise


def specs() -> list[Spec]:
    """The registered subsystems in apply order (rollback runs in reverse)."""
    _load()
    return sorted(_SPECS.values(), key=lambda s: s.order)


def spec(name: str) -> Spec:
    _load()
    return _SPECS[name]


def get(name: str):
    """The Plugin class of a subsystem."""
    return spec(name).plugin


def for_sections(sections) -> list[str]:
    """The subsystems, in order, that the given profile sections need."""
    return [s.name for s in specs() if s.section in sections or any(a in sections for a in s.also)]


def netns_scoped(c) -> bool:
    """Whether change c's setting lives in one network namespace (core/place.py records which)."""
    _load()
    s = _SPECS.get(c.subsystem)
    return s is not None and s.per_netns(c.key)


def __getattr__(name):
    # ORDER: names in apply order; SECTION: name -> its profile section; ALSO: name -> other sections
    if name == "ORDER":
        return [s.name for s in specs()]
    if name == "SECTION":
        return {s.name: s.section for s in specs()}
    if name == "ALSO":
        return {s.name: s.also for s in specs() if s.also}
    raise AttributeError(name)
