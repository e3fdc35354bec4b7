"""hkgpu-tune: apply, verify and roll back GPU inference host settings.

>>> from hkgpu_tune import load_profile, Engine
>>> eng = Engine(load_profile("hk-inference"), only=["sysctl"])   # doctest: +SKIP
>>> [r.status for r in eng.verify()]                               # doctest: +SKIP
"""
# everything (the version too) loads on first use: `import hkgpu_tune` (and the command's start, where a SIGINT
# must find hkgpu_tune.__main__'s handler in place) stays light
_LAZY = {"__version__": "hkgpu_tune.core.version",
         "Engine": "hkgpu_tune.tune.engine", "ApplyError": "hkgpu_tune.core.errors",
         "HkError": "hkgpu_tune.core.errors", "ProfileError": "hkgpu_tune.core.errors",
         "StateError": "hkgpu_tune.core.errors", "UnsupportedError": "hkgpu_tune.core.errors",
         "Profile": "hkgpu_tune.core.profile", "load_profile": "hkgpu_tune.core.profile",
         "parse_profile_text": "hkgpu_tune.core.profile", "Change": "hkgpu_tune.core.report",
         "Result": "hkgpu_tune.core.report"}


def _profile_sections() -> None:
    """The profile's section table (core/sections.py), filled from the modules that own each
    section: every registered subsystem's SPEC, then the sections no subsystem applies (their
    modules imported only when a profile has the section)."""
    from hkgpu_tune import subsystems
    from hkgpu_tune.core import sections
    for spec in subsystems.specs():
        for name, parse in spec.sections.items():
            sections.register(name, parse, f"subsystem {spec.name}")
        for needs, check in spec.checks:
            sections.register_check(needs, check)
    sections.register("health", _health, "observe.health_config")
    sections.register("export", _export, "observe.collect.exporters")
    sections.register("baseline", _baseline, "baseline.settings")


def _health(node):
    from hkgpu_tune.observe.health_config import parse_profile
    return parse_profile(node)


def _export(node):
    from hkgpu_tune.observe.collect.exporters import parse_profile
    return parse_profile(node)


def _baseline(node):
    from hkgpu_tune.baseline.settings import parse_profile
    return parse_profile(node)


def _install() -> None:
    from hkgpu_tune.core import sections
    sections.add_loader(_profile_sections)


_install()


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = ["Engine", "load_profile", "parse_profile_text", "Profile", "Change", "Result", "HkError",
           "ProfileError", "UnsupportedError", "ApplyError", "StateError"]
