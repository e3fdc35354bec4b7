"""One entry point for configuration management: merge profile sections into the node profile,
then plan, apply (unless checking), verify or roll back, and say what changed.

The Ansible module `hkgpu` is a thin shell over `converge()`; so can any other tool be.

>>> out = converge({"sysctl": {"net.ipv4.tcp_mtu_probing": 1}}, check=True,
...                profile_path="/etc/hkgpu-tune/node.yaml")          # doctest: +SKIP
>>> out["changed"], [c["key"] for c in out["changes"]]                # doctest: +SKIP
(True, ['net.ipv4.tcp_mtu_probing'])
"""
from __future__ import annotations

import errno
import os
import re
import stat

from hkgpu_tune.core.errors import HkError, ProfileError
from hkgpu_tune.core.fsutil import atomic_write
from hkgpu_tune.core.profile import Profile, load_profile, parse_profile_text, read_profile_file
from hkgpu_tune.core.yamlnode import load_yaml_doc

NODE_PROFILE = "/etc/hkgpu-tune/node.yaml"
STATE_DIR = "/var/lib/hkgpu-tune"
STATES = ("applied", "verified", "rolled_back")


class ConvergeFailed(HkError):
    """The run finished but failed (drift after apply, a failed apply or rollback); `result` holds
    what it did, for the caller to return alongside the message."""

    def __init__(self, msg: str, result: dict):
        super().__init__(msg)
        self.result = result


def _read(path: str) -> str | None:
    try:
        return read_profile_file(path)
    except ProfileError:
        if not os.path.lexists(path):
            return None
        raise


def _empty(value) -> bool:
    return value is None or value == {} or value == []


def merge_sections(sections: dict, profile_path: str) -> tuple[Profile, str, str | None, list[str]]:
    """(merged profile, its text, the old text or None, subsystems of the given sections).

    The sections replace those of the node profile at `profile_path` (an empty one removes it);
    the others are kept. The merged text is parsed as a whole before anything is written."""
    import yaml

    from hkgpu_tune.subsystems import for_sections

    old = _read(profile_path)
    doc = load_yaml_doc(old, profile_path) if old else {}
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ProfileError(f"{profile_path}:1: (top): expected a mapping of sections")
    doc.setdefault("name", "node")
    doc.setdefault("description", "rendered by the hkgpu Ansible roles")
    for key, value in sections.items():
        if not isinstance(key, str):
            raise ProfileError(f"profile: section names must be strings, got {key!r}")
        if _empty(value):
            doc.pop(key, None)
        else:
            doc[key] = value
    try:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    except (yaml.YAMLError, ValueError) as e:
        raise ProfileError(f"profile: cannot be written as YAML: {e}") from None
    try:
        prof = parse_profile_text(text, profile_path)
    except ProfileError as e:
        raise ProfileError(f"{e} (in the profile rendered from the role variables; nothing written)") from None
    return prof, text, old, for_sections([k for k, v in sections.items() if not _empty(v)])


def write_files(files, check: bool) -> tuple[bool, list[dict]]:
    """Small files a role owns (path, content, optional mode as an octal string), written when their
    content differs. Returns (changed, diffs)."""
    changed, diffs = False, []
    for i, f in enumerate(files or ()):
        path, content = f.get("path"), f.get("content")
        if not isinstance(path, str) or not os.path.isabs(path) or os.path.normpath(path) != path:
            raise HkError(f"files[{i}].path: expected an absolute, normalised path, got {path!r}")
        if not isinstance(content, str):
            raise HkError(f"files[{i}].content: expected text")
        try:
            mode = int(str(f.get("mode") or "0644"), 8)
        except ValueError:
            raise HkError(f"files[{i}].mode: expected an octal mode such as '0644', got {f.get('mode')!r}") from None
        if not 0 <= mode <= 0o7777:
            raise HkError(f"files[{i}].mode: expected an octal mode such as '0644', got {f.get('mode')!r}")
        old = _read_role_file(path)
        if old == content:
            continue
        changed = True
        diffs.append({"before": old or "", "after": content, "before_header": path, "after_header": path})
        if not check:
            atomic_write(path, content, mode=mode)
    return changed, diffs


def _read_role_file(path: str, limit: int = 1 << 20) -> str | None:
    """The current text of a role file; None when missing. Never follows a link, never blocks on a
    FIFO, never reads a device: those are refused, as atomic_write would refuse to replace them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise HkError(f"{path}: refusing to replace it: it is a link", e.errno) from None
        raise HkError(f"{path}: cannot read: {e.strerror}", e.errno) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HkError(f"{path}: refusing to replace it: it is not a regular file")
        return os.read(fd, limit).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _failure_lines(results) -> str:
    return "; ".join(f"{r.subsystem} {r.target} {r.key}: {r.status}: current {r.current}, "
                     f"desired {r.desired}{' (' + r.reason + ')' if r.reason else ''}" for r in results if r.failed)


def _rollback(check: bool, state_dir: str, only: list[str] | None = None, host_dir: str | None = None) -> dict:
    """Restore the saved originals; `only`: just those subsystems ("persist": the files of
    --persist, which go only when it is named or nothing is)."""
    from hkgpu_tune.tune.engine import Engine
    from hkgpu_tune.tune.persist import unpersist
    eng = Engine(parse_profile_text("name: rollback\n", "<rollback>"), state_dir=state_dir, host_dir=host_dir)
    try:
        saved = [c for c in eng.state.load() if not only or c.subsystem in only]
        if check:
            return {"changed": bool(saved), "restored": [c.to_dict() for c in saved], "files": []}
        rep = eng.rollback(only=only or None)
        restored, errs = rep
        files = rep.files + (unpersist(eng.state.dir, host_dir) if not only or "persist" in only else [])
        out = {"changed": bool(restored or files), "restored": [c.to_dict() for c in restored], "files": files}
        if errs:
            raise ConvergeFailed("rollback failed: " + "; ".join(errs), out)
        kept = [f for f in files if f.startswith("kept ")]
        if kept:   # the host is not as it was: never a quiet success
            raise ConvergeFailed("rollback kept files changed since hkgpu-tune wrote them: " + "; ".join(kept), out)
        return out
    finally:
        eng.b.close()


def converge(sections: dict | None, check: bool, *, profile: str | None = None, profile_path: str = NODE_PROFILE,
             only: list[str] | None = None, state: str = "applied", state_dir: str = STATE_DIR,
             host_dir: str | None = None, files=(), fail_on_drift: bool = True, persist: bool = False, backends=None,
             root: str = "/") -> dict:
    """Bring the node to the profile, or report how far it is from it.

    sections: profile sections merged into the node profile at `profile_path` (None: use
    `profile`, a file or shipped profile, else the node profile as it is). check: plan only,
    write nothing. state: applied | verified | rolled_back.

    Returns {"changed", "diff", "results", "failures", "changes", ...}. Raises ProfileError for
    a bad profile (nothing written), ConvergeFailed (with `.result`) when the run failed.
    host_dir: the host lock and registry of journals (None: the host's own; tune/host.py).
    root: where `persist` writes its files ("/" on a node; another directory in tests, like
    `apply --persist --root`).
    """
    if state not in STATES:
        raise HkError(f"state: expected one of {', '.join(STATES)}, got {state!r}")
    if state == "rolled_back":
        if not check:
            _drop_dead_temps(profile_path)   # a converge killed while writing the node profile
        return _rollback(check, state_dir, only, host_dir)

    text = old = None
    default_only = None
    if sections is not None:
        if not isinstance(sections, dict):
            raise ProfileError("profile: expected a dict of sections or a path")
        prof, text, old, default_only = merge_sections(sections, profile_path)
    else:
        prof = load_profile(profile or profile_path)
    only = only if only is not None else default_only
    if only is not None and not only:
        return {"changed": False, "results": [], "failures": [], "changes": [], "msg": "nothing selected"}

    from hkgpu_tune.tune.engine import ApplyReport, Engine
    eng = Engine(prof, only=only, state_dir=state_dir, backends=backends, host_dir=host_dir)
    try:
        if state == "verified":
            files_changed, file_diffs = write_files(files, check)
            res = eng.verify()
            out = {"changed": files_changed, "results": [r.to_dict() for r in res],
                   "failures": [r.to_dict() for r in res if r.failed]}
            if file_diffs:
                out["diff"] = file_diffs
            if out["failures"] and fail_on_drift:
                out["failed_check"] = "verify"
                raise ConvergeFailed(f"verify: {len(out['failures'])} setting(s) failed: {_failure_lines(res)}", out)
            return out

        file_changed = text is not None and text != old
        changes, res = eng.plan()
        diff = {"before": "".join(f"{c.subsystem} {c.target} {c.key} = {c.current}\n" for c in changes),
                "after": "".join(f"{c.subsystem} {c.target} {c.key} = {c.desired}\n" for c in changes),
                "before_header": "live", "after_header": "profile"}
        if file_changed:
            diff = [{"before": old or "", "after": text, "before_header": profile_path + " (before)",
                     "after_header": profile_path + " (after)"}, diff]
        out = {"changed": bool(changes) or file_changed, "diff": diff, "changes": [c.to_dict() for c in changes]}
        if check:
            unfixable = [r for r in res if r.failed and r.write is None]
            out.update(results=[r.to_dict() for r in res], failures=[r.to_dict() for r in unfixable])
            return out
        if text is not None:
            _drop_dead_temps(profile_path)
        # nothing to write: the plan's comparison is the verify result (no second read)
        rep = eng.apply() if changes else ApplyReport(results=res)
        out.update(results=[r.to_dict() for r in rep.results], failures=[r.to_dict() for r in rep.results if r.failed],
                   changes=[c.to_dict() for c in rep.changes])
        if rep.error:
            # the node profile was not written: the failed sections are never in it
            out["rolled_back"] = rep.rolled_back
            raise ConvergeFailed(rep.error + (" (rolled back)" if rep.rolled_back else ""), out)
        # written only now the apply went through: a run killed or failed before this point leaves
        # the node profile as it was, never naming settings the host does not have
        if text is not None:
            # merged again: another converge (another role's sections) may have written it meanwhile
            _, text, now, _ = merge_sections(sections, profile_path)
            if text != now:
                os.makedirs(os.path.dirname(profile_path) or ".", mode=0o755, exist_ok=True)
                atomic_write(profile_path, text, mode=0o644)
        if persist and (out["changed"] or _needs_persist(text, root)):
            from hkgpu_tune.tune.persist import persist as do_persist
            full = Engine(parse_profile_text(text, profile_path) if text else prof, state_dir=state_dir, backends=eng.b,
                          host_dir=host_dir)
            out["persisted"] = do_persist(full, root, profile_path=profile_path if text else prof.path)
        if out["failures"]:
            out["failed_check"] = "apply"
            raise ConvergeFailed(f"{len(out['failures'])} setting(s) failed after apply: "
                                 f"{_failure_lines(rep.results)}", out)
        return out
    finally:
        eng.b.close()


def _drop_dead_temps(path: str) -> None:
    """Temporary files atomic_write left beside the node profile when a run was killed between
    making and renaming one (.NAME.PID.N.tmp): only those whose writer is gone, regular files only."""
    d, name = os.path.split(path)
    try:
        names = os.listdir(d or ".")
    except OSError:
        return
    for n in names:
        m = re.fullmatch(rf"\.{re.escape(name)}\.([0-9]+)\.[0-9]+\.tmp", n)
        if not m or _alive(int(m[1])):
            continue
        t = os.path.join(d, n)
        try:
            if stat.S_ISREG(os.lstat(t).st_mode):
                os.unlink(t)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _needs_persist(text, root: str = "/") -> bool:
    """The persisted copy of the node profile is missing or older than the node profile."""
    from hkgpu_tune.tune.persist import PROFILE_FILE
    if text is None:
        return False
    try:
        return _read(os.path.join(root, PROFILE_FILE)) != text
    except ProfileError:
        return True
