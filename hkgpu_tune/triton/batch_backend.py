"""The hkbatch backend (batch_backend.cc): Triton's batches gathered in C++ and handed to a Python
model once per batch. Built here from its source with the host's C++ compiler into the model's
directory, where Triton looks for libtriton_hkbatch.so; the server gets libpython's path.

>>> available()            # doctest: +SKIP
(True, 'c++ at /usr/bin/c++, libpython3.11.so.1.0')
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from ..errors import HkError
from ..fsutil import atomic_write

NAME = "hkbatch"
LIBRARY = f"libtriton_{NAME}.so"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batch_backend.cc")
# a library built elsewhere from the same source (a host without a compiler): _build/LIBRARY + .sha256
PREBUILT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build", LIBRARY)
FLAGS = ["-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-static-libstdc++", "-static-libgcc"]


def source_sha() -> str:
    with open(SOURCE, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++")


def python_library() -> str | None:
    """The running Python's shared libpython, which the backend embeds (Debian's python3 is linked
    statically but its libpython3.X package has the library); None where there is none."""
    name = sysconfig.get_config_var("INSTSONAME") or ""
    if not name.endswith((".so", ".so.1.0")):   # a static build names libpython3.X.a here
        name = f"libpython{sysconfig.get_config_var('LDVERSION') or ''}.so.1.0"
    path = os.path.join(sysconfig.get_config_var("LIBDIR") or "", name)
    return path if os.path.isfile(path) else None


def _prebuilt_ok() -> bool:
    try:
        with open(PREBUILT + ".sha256") as f:
            return f.read().strip() == source_sha() and os.path.isfile(PREBUILT)
    except OSError:
        return False


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
    return False, "no C++ compiler (install g++) to build the hkbatch backend"


def server_env() -> dict[str, str]:
    """What the backend reads in the server's environment to embed this Python."""
    lib = python_library()
    if not lib:
        return {}
    return {"HKGPU_PYTHON_LIBRARY": lib, "HKGPU_PYTHON_HOME": sys.base_prefix,
            "HKGPU_PYTHON_EXECUTABLE": sys.executable}


def installed_sha(model_dir: str) -> str | None:
    """The source hash (12 digits) of the library in MODEL_DIR, None when absent or not a file."""
    target = os.path.join(model_dir, LIBRARY)
    try:
        if os.path.islink(target) or not os.path.isfile(target):
            return None
        with open(target + ".sha256") as f:
            return f.read().strip()[:12] or None
    except OSError:
        return None


def install(model_dir: str) -> bool:
    """MODEL_DIR/libtriton_hkbatch.so built from this source (a .sha256 beside it says which);
    True when it was (re)built. HkError when there is no compiler and no matching build."""
    target = os.path.join(model_dir, LIBRARY)
    want = source_sha()
    if installed_sha(model_dir) == want[:12]:
        return False
    os.makedirs(model_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".hkbatch-", suffix=".so", dir=model_dir)
    os.close(fd)
    try:
        cxx = compiler()
        if cxx:
            r = subprocess.run([cxx, *FLAGS, "-o", tmp, SOURCE, "-ldl", "-lpthread"], capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise HkError(f"triton: building the hkbatch backend failed: {(r.stderr or r.stdout).strip()[-800:]}")
        elif _prebuilt_ok():
            shutil.copyfile(PREBUILT, tmp)
        else:
            raise HkError("triton: no C++ compiler (install g++) to build the hkbatch backend")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    atomic_write(target + ".sha256", want + "\n")   # no link followed
    return True


def main() -> int:
    """python -m hkgpu_tune.triton.batch_backend DIR: build DIR/libtriton_hkbatch.so (for PREBUILT)."""
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(PREBUILT)
    install(out)
    with open(os.path.join(out, LIBRARY + ".sha256")) as f:
        print(os.path.join(out, LIBRARY), f.read().strip()[:12])
    return 0


if __name__ == "__main__":
    sys.exit(main())
