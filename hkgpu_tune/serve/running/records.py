"""What root acts on from disk for the Triton service, checked before it acts: a respawn record
from the state file (rollback of a restart) and a container runtime found by absolute path.

>>> check_record({"argv": ["/bin/sh", "-c", "id"], "launch": "binary"})
Traceback (most recent call last):
...
hkgpu_tune.core.errors.HkError: triton: the saved command runs '/bin/sh' (binary), not a Triton server: refused
"""
from __future__ import annotations

import os
import re
import shutil

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import check_trusted
from hkgpu_tune.serve.running.form_base import FORMS

def runtime_path(runtime: str, required: bool = True) -> str:
    """The container runtime by absolute path (what root runs is never searched for on PATH).
    required=False (rendering a unit for a host that may lack it): /usr/bin/RUNTIME when not found."""
    if os.path.isabs(runtime):
        return runtime
    found = shutil.which(runtime, path=os.pathsep.join(TRUSTED_PATH))
    if found:
        return found
    if not required:
        return f"/usr/bin/{runtime}"
    raise HkError(f"triton: container runtime {runtime} not found in {':'.join(TRUSTED_PATH)}")


TRUSTED_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


# what a respawn record may hold: the variables server_env() sets, nothing else
from hkgpu_tune.serve.schema.shapes import RECORD_ENV  # noqa: E402  (the variables server_env() sets)
_PATH_ENV = {"LD_LIBRARY_PATH", "PYTHONPATH", "HKGPU_PYTHON_LIBRARY", "HKGPU_PYTHON_HOME", "HKGPU_PYTHON_EXECUTABLE"}


def check_record(rec) -> None:
    """A respawn record read back from the state file: only a Triton server command (tritonserver
    itself, or a container runtime's `run`), only the variables apply sets, a user by name; and,
    before anything runs, every program and library path in it trusted (fsutil's one rule).
    HkError otherwise: rollback never runs an argv it cannot tie to what apply started."""
    from hkgpu_tune.serve.schema.config import USER_RE
    if not isinstance(rec, dict) or not set(rec) <= {"argv", "env", "user", "launch", "placement"}:
        raise HkError("triton: the saved command is not a record of the server apply started")
    argv, env, form = rec.get("argv"), rec.get("env") or {}, rec.get("launch") or "binary"
    if not (isinstance(argv, list) and argv and len(argv) <= 256 and all(isinstance(a, str) for a in argv)
            and os.path.isabs(argv[0]) and os.path.normpath(argv[0]) == argv[0]):
        raise HkError("triton: the saved command's argv is not an absolute program and its arguments")
    kind = FORMS.get(form) if isinstance(form, str) else None
    if kind is None or not kind().recognise(argv):
        raise HkError(f"triton: the saved command runs {argv[0]!r} ({form}), not a Triton server: refused")
    if not isinstance(env, dict) or not all(k in RECORD_ENV and isinstance(v, str) for k, v in env.items()):
        raise HkError(f"triton: the saved command's environment holds more than {', '.join(RECORD_ENV)}")
    user = rec.get("user")
    if user is not None and not (isinstance(user, str) and re.fullmatch(USER_RE, user)):
        raise HkError(f"triton: the saved command's user {user!r} is not a user name")
    kind().check_saved(argv)
    if not isinstance(rec.get("placement") or {}, dict):
        raise HkError("triton: the saved command's placement is not a mapping")


def check_record_paths(rec: dict) -> None:
    check_trusted(rec["argv"][0], "saved Triton server program")
    for k, v in (rec.get("env") or {}).items():
        for p in (v.split(":") if k in _PATH_ENV else ()):
            if p and os.path.lexists(p):
                check_trusted(os.path.abspath(p), f"{k} entry of the saved command")


def check_unit_text(text) -> None:
    """A unit's text read back from the state file (rollback writes it into /etc/systemd/system,
    where root runs it): only what the tool renders (serve.schema.shapes: its directives, variables and
    command shapes), and every program and library path in it trusted. HkError otherwise."""
    from hkgpu_tune.serve.schema import shapes
    for argv in shapes.check_unit_text(text):
        prog = argv[0]
        if not os.path.isabs(prog):
            raise HkError(f"triton: the saved unit runs {prog!r}, not a program by absolute path: refused")
        # a program not there (yet) may be put there only by whoever can write its directory
        if os.path.lexists(prog):
            check_trusted(prog, "program of the saved unit")
        else:
            check_trusted(os.path.dirname(prog), "directory of the saved unit's program")
    for line in text.split("\n"):
        if line.startswith("Environment="):
            k, v = shapes._env(line.partition("=")[2])
            for p in (v.split(":") if k in _PATH_ENV else ()):
                if p and os.path.lexists(p):
                    check_trusted(os.path.abspath(p), f"{k} entry of the saved unit")
