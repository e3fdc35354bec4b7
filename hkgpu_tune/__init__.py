"""hkgpu-tune: apply, verify and roll back GPU inference host settings.

>>> from hkgpu_tune import load_profile, Engine
>>> eng = Engine(load_profile("hk-inference"), only=["sysctl"])   # doctest: +SKIP
>>> [r.status for r in eng.verify()]                               # doctest: +SKIP
"""
from hkgpu_tune.core.version import __version__  # noqa: E402,F401

from hkgpu_tune.core.errors import ApplyError, HkError, ProfileError, StateError, UnsupportedError  # noqa: E402
from hkgpu_tune.core.profile import Profile, load_profile, parse_profile_text  # noqa: E402
from hkgpu_tune.core.report import Change, Result  # noqa: E402


def __getattr__(name):  # keep `import hkgpu_tune` light: the engine loads on first use
    if name == "Engine":
        from hkgpu_tune.tune.engine import Engine
        return Engine
    raise AttributeError(name)


__all__ = ["Engine", "load_profile", "parse_profile_text", "Profile", "Change", "Result", "HkError",
           "ProfileError", "UnsupportedError", "ApplyError", "StateError"]
