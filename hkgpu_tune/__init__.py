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


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = ["Engine", "load_profile", "parse_profile_text", "Profile", "Change", "Result", "HkError",
           "ProfileError", "UnsupportedError", "ApplyError", "StateError"]
