"""The hkbatch backend (batch_backend.cc): Triton's batches gathered in C++ and handed to a Python
model once per batch. Built here from its source with the host's C++ compiler into the model's
directory, where Triton looks for libtriton_hkbatch.so; the server gets libpython's path.

>>> available()            # doctest: +SKIP
(True, 'c++ at /usr/bin/c++, libpython3.11.so.1.0')
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import atomic_write, program_refusal

NAME = "hkbatch"
LIBRARY = f"libtriton_{NAME}.so"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batch_backend.cc")
# a library built elsewhere from the same source (a host without a compiler): _build/LIBRARY + .sha256
PREBUILT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build", LIBRARY)
FLAGS = ["-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-static-libstdc++", "-static-libgcc"]


def _file_sha(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def source_sha() -> str:
    sha = _file_sha(SOURCE)
    if sha is None:
        raise HkError(f"triton: the hkbatch source {SOURCE} cannot be read")
    return sha


# the compiler driver looks for `as` and `ld` in its own directories, then on PATH: it runs with
# this PATH only, and each program it would run passes fsutil's trust rule first
BUILD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def build_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COMPILER_PATH", "GCC_EXEC_PREFIX", "LIBRARY_PATH", "CPATH", "CPLUS_INCLUDE_PATH",
                        "C_INCLUDE_PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "GCC_COMPARE_DEBUG")}
    return {**env, "PATH": BUILD_PATH, "LC_ALL": "C"}


def toolchain_refusal(cxx: str) -> str | None:
    """Why the programs the driver would run (as, ld, collect2, as it resolves them) are not to be
    run by root; None when each is trusted."""
    env = build_env()
    for prog in ("as", "ld", "collect2"):
        try:
            r = subprocess.run([cxx, f"-print-prog-name={prog}"], capture_output=True, text=True, timeout=30, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{cxx} -print-prog-name={prog}: {e}"
        path = r.stdout.strip()
        if not os.path.isabs(path):          # not in the driver's own directories: PATH, as above
            path = shutil.which(path or prog, path=BUILD_PATH) or ""
            if not path:
                if prog == "collect2":
                    continue                  # a driver without collect2 runs ld itself
                return f"{cxx}: no {prog} found"
        why = program_refusal(path)
        if why:
            return why
    return None


@functools.lru_cache(maxsize=None)
def compiler() -> str | None:
    """A C++ compiler that can link libstdc++ statically (the library must not depend on the
    libstdc++ that tritonserver's process has already loaded)."""
    for name in ("c++", "g++"):
        cxx = shutil.which(name)
        if not cxx or program_refusal(cxx) or toolchain_refusal(cxx):
            continue
        try:
            r = subprocess.run([cxx, "-print-file-name=libstdc++.a"], capture_output=True, text=True, timeout=30,
                               env=build_env())
        except (OSError, subprocess.TimeoutExpired):
            continue
        if os.path.isabs(r.stdout.strip()):   # found: a path; not found: the bare name
            return cxx
    return None


def python_library() -> str | None:
    """The running Python's shared libpython, which the backend embeds (Debian's python3 is linked
    statically but its libpython3.X package has the library); None where there is none."""
    name = sysconfig.get_config_var("INSTSONAME") or ""
    if not name.endswith((".so", ".so.1.0")):   # a static build names libpython3.X.a here
        name = f"libpython{sysconfig.get_config_var('LDVERSION') or ''}.so.1.0"
    path = os.path.join(sysconfig.get_config_var("LIBDIR") or "", name)
    return path if os.path.isfile(path) else None


def _recorded(lib: str) -> str | None:
    """The source hash a library was built from, from its .sha256 ("SOURCE LIBRARY" hashes), when
    the library is a regular file whose bytes still hash to what was recorded; else None."""
    from hkgpu_tune.core.fsutil import untrusted_reason
    try:
        if os.path.islink(lib) or not os.path.isfile(lib):
            return None
        # a record or a library another user could write proves nothing: rebuilt (or refused there)
        if untrusted_reason(os.path.abspath(lib)) or untrusted_reason(os.path.abspath(lib + ".sha256")):
            return None
        fd = os.open(lib + ".sha256", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            parts = f.read(512).split()
    except OSError:
        return None
    if len(parts) != 2 or _file_sha(lib) != parts[1]:
        return None   # replaced or damaged since it was built
    return parts[0]


def _prebuilt_ok() -> bool:
    return _recorded(PREBUILT) == source_sha()


def available() -> tuple[bool, str]:
    """(usable here, why): a compiler (or a library built from this source) and a shared libpython."""
    lib = python_library()
    if lib is None:
        return False, f"this Python ({sys.executable}) has no shared libpython to embed (install libpython3-dev)"
    cxx = compiler()
    if cxx:
        return True, f"c++ at {cxx}, {os.path.basename(lib)}"
    if _prebuilt_ok():
        return True, f"built from this source, {os.path.basename(lib)}"
    return False, "no C++ compiler with a static libstdc++ (install g++) to build the hkbatch backend"


def server_env() -> dict[str, str]:
    """What the backend reads in the server's environment to embed this Python, and this Python's
    site-packages (a venv's are not under PYTHONHOME)."""
    lib = python_library()
    if not lib:
        return {}
    import site
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    return {"HKGPU_PYTHON_LIBRARY": lib, "HKGPU_PYTHON_HOME": sys.base_prefix,
            "HKGPU_PYTHON_EXECUTABLE": sys.executable, "PYTHONPATH": ":".join(dict.fromkeys(paths))}


def installed_sha(model_dir: str) -> str | None:
    """The source hash (12 digits) of the library in MODEL_DIR; None when absent, a link, or changed
    since it was built."""
    got = _recorded(os.path.join(model_dir, LIBRARY))
    return got[:12] if got else None


def install(model_dir: str) -> bool:
    """MODEL_DIR/libtriton_hkbatch.so built from this source (a .sha256 beside it records the
    source's and the library's hashes); True when it was (re)built. Built in a private directory
    of its own, then written in with no link followed. HkError when nothing can build it."""
    target = os.path.join(model_dir, LIBRARY)
    want = source_sha()
    if installed_sha(model_dir) == want[:12]:
        return False
    with tempfile.TemporaryDirectory(prefix="hkbatch-build-") as work:   # 0700, this user's
        built = os.path.join(work, LIBRARY)
        cxx = compiler()
        if cxx:
            r = subprocess.run([cxx, *FLAGS, "-o", built, SOURCE, "-ldl", "-lpthread"], capture_output=True,
                               text=True, timeout=300, env=build_env())
            if r.returncode != 0:
                raise HkError(f"triton: building the hkbatch backend failed: {(r.stderr or r.stdout).strip()[-800:]}")
        elif _prebuilt_ok():
            built = PREBUILT
        else:
            raise HkError("triton: no C++ compiler (install g++) to build the hkbatch backend")
        with open(built, "rb") as f:
            data = f.read()
    from hkgpu_tune.core.fsutil import ensure_trusted_dir
    ensure_trusted_dir(model_dir, "model directory")   # no planted link or foreign directory on the way
    atomic_write(target, data, mode=0o755)   # no link followed
    atomic_write(target + ".sha256", f"{want} {hashlib.sha256(data).hexdigest()}\n")
    return True


def main() -> int:
    """python -m hkgpu_tune.serve.repository.batch_backend DIR: build DIR/libtriton_hkbatch.so (for PREBUILT)."""
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(PREBUILT)
    install(out)
    with open(os.path.join(out, LIBRARY + ".sha256")) as f:
        print(os.path.join(out, LIBRARY), f.read().strip()[:12])
    return 0


if __name__ == "__main__":
    sys.exit(main())
