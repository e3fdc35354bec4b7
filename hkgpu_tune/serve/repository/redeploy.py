"""Keeping the previous version of a model: a copy of its directory (config.pbtxt and version
directories) taken before apply overwrites it, put back when the new one fails to load or fails
the gate, or on rollback. Needs neither the profile nor tritonclient: paths come from apply's
saved record.

Copies are hard links where the file system allows (the repository is written by rename, so a
linked file keeps its old content); plain copies elsewhere.

>>> b = backup_path("/var/lib/hkgpu-triton/models", "doubler", "1733190000000000000")
>>> b
'/var/lib/hkgpu-triton/previous/doubler.1733190000000000000'
"""
from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import time

from hkgpu_tune.core.errors import HkError, StateError

PREVIOUS = "previous"


MODEL_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def check_record(d: dict) -> None:
    """A saved repository record names only a model directory of its repository and a copy beside
    it (rollback runs as root: a tampered record must not make it move or delete anything else)."""
    repo, model = d.get("repository"), d.get("model")
    if not (isinstance(model, str) and MODEL_RE.fullmatch(model)) or model in (".", ".."):
        raise StateError(f"triton record: {model!r} is not a model name")
    if not (isinstance(repo, str) and os.path.isabs(repo) and os.path.normpath(repo) == repo
            and repo.count("/") >= 2):
        raise StateError(f"triton record: {repo!r} is not a model repository path")
    if d.get("model_dir") != os.path.join(repo, model):
        raise StateError(f"triton record: model_dir {d.get('model_dir')!r} is not {model} in {repo}")
    for key in ("backup", "original"):
        v = d.get(key)
        if v is None and key == "original":
            continue
        if not (isinstance(v, str) and os.path.dirname(v) == os.path.dirname(backup_path(repo, model, "0"))
                and re.fullmatch(re.escape(model) + r"\.[0-9]{1,20}", os.path.basename(v))):
            raise StateError(f"triton record: {key} {v!r} is not a copy of {model} beside {repo}")
    if not isinstance(d.get("existed"), bool):
        raise StateError("triton record: 'existed' must be true or false")


def new_token() -> str:
    """Orders the copies of one model: older copies have smaller tokens."""
    return str(time.time_ns())


def backup_path(repository: str, model: str, token: str) -> str:
    """Beside the repository (never inside it: Triton would see a model there)."""
    base = os.path.dirname(os.path.normpath(repository)) or "/"
    return os.path.join(base, PREVIOUS, f"{model}.{token}")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst)


def _trusted(model_dir: str, backup: str) -> None:
    """The repository and the copies' directory: root moves and removes in them only where no other
    user can change the path (a planted link is never followed; fsutil's one rule)."""
    from hkgpu_tune.core.fsutil import ensure_trusted_dir
    ensure_trusted_dir(os.path.dirname(model_dir), "model repository")
    ensure_trusted_dir(os.path.dirname(backup), "directory of the model copies")


def save(model_dir: str, backup: str) -> bool:
    """Copy model_dir to backup (once: an existing copy is the older one and is kept). True when
    a copy was made; False when there was nothing to copy or the copy exists."""
    if os.path.isdir(backup) or not os.path.isdir(model_dir):
        return False
    _trusted(model_dir, backup)
    tmp = backup + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(model_dir, tmp, symlinks=True, copy_function=_link_or_copy)
        os.replace(tmp, backup)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise HkError(f"triton: cannot keep a copy of {model_dir} in {backup}: {e.strerror or e}") from None
    return True


def put_back(model_dir: str, backup: str, existed: bool, original: str | None = None) -> str:
    """The model directory as it was before apply: this run's copy, else the copy of an earlier
    apply (`original`, the oldest: what rollback restores). Returns what was done; safe to repeat
    (a copy already put back, or a new directory already removed, is done)."""
    _trusted(model_dir, backup)
    if existed and not os.path.isdir(backup) and original and os.path.isdir(original):
        backup = original
    if not existed:
        if os.path.islink(model_dir) or (os.path.exists(model_dir) and not os.path.isdir(model_dir)):
            raise HkError(f"triton: {model_dir} is not a model directory: left alone")
        if os.path.isdir(model_dir):
            shutil.rmtree(model_dir)
            return "removed"
        return "already removed"
    if not os.path.isdir(backup):
        if os.path.isdir(model_dir):
            return "already back"
        raise HkError(f"triton: the previous {os.path.basename(model_dir)} is gone: no copy at {backup}")
    aside = model_dir + ".hkgpu-replaced"
    shutil.rmtree(aside, ignore_errors=True)
    try:
        if os.path.lexists(model_dir):
            os.rename(model_dir, aside)
        os.rename(backup, model_dir)
    except OSError as e:
        raise HkError(f"triton: cannot put {backup} back at {model_dir}: {e.strerror or e}") from None
    shutil.rmtree(aside, ignore_errors=True)
    return "put back"


def copies(repository: str, model: str) -> list[str]:
    """The kept copies of one model, oldest first."""
    pat = backup_path(repository, glob.escape(model), "*")
    found = [p for p in glob.glob(pat) if not p.endswith(".partial")]
    return sorted(found, key=lambda p: int(p.rsplit(".", 1)[1]) if p.rsplit(".", 1)[1].isdigit() else 0)


def drop_newer(repository: str, model: str) -> list[str]:
    """After a deployment that stays, only the oldest copy matters (rollback restores the original
    of the first apply); newer copies are removed. Returns the removed paths."""
    out = copies(repository, model)[1:]
    for p in out:
        shutil.rmtree(p, ignore_errors=True)
    return out


def drop_all(repository: str, model: str) -> None:
    for p in copies(repository, model):
        shutil.rmtree(p, ignore_errors=True)
