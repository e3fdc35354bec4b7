#!/usr/bin/env python3
"""The toolkit this controller runs, made ready for the nodes (run on the controller by hkgpu_install).

    python3 hkgpu_ship.py [--out DIR] [--wheel FILE]
prints JSON: {"wheel": FILE, "deps": DIR, "sha1": ..., "bundle": TAR}

- the hkgpu_tune wheel: FILE when given (a collection carries its own in the role's files/);
  else the hkgpu_tune this Python imports: from a source tree (pyproject.toml beside the
  package) it is built with `pip wheel`, from an installed wheel its files are packed again;
- its dependencies (not the extras) as installed here, packed again with the tags of the
  wheels they came from, so that pip on the node takes only those that fit its Python and
  platform and takes nothing from a package index;
- all of it (and the files of --extra DIR) in one tar, so a node gets one copy, not one per file.
Standard library only: the collection's controller may have no hkgpu_tune at all. Nothing is
imported from hkgpu_tune (find_spec only locates it).
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata as md
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

DIST = "hkgpu-tune"
# not part of a build: left out of the copy the wheel is built from
_NOT_BUILT = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv",
                                    ".pytest_cache", ".cache", "bench", "docs")


def NOT_BUILT(d: str, names: list[str]) -> set[str]:
    """Also no tests, but tests/infra: the testinfra checks the package ships (links in the collection)."""
    out = set(_NOT_BUILT(d, names))
    top = os.path.isfile(os.path.join(d, "pyproject.toml"))
    if "tests" in names and not top:
        out.add("tests")
    if os.path.basename(d) == "tests" and os.path.isfile(os.path.join(os.path.dirname(d), "pyproject.toml")):
        out |= {n for n in names if n != "infra"}
    return out
SKIP_META = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}


class ShipError(Exception):
    pass


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_name(dist: md.Distribution) -> str:
    """name-version-py-abi-plat.whl from the Tag lines the installed wheel kept in its WHEEL file."""
    text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    if not tags:
        raise ShipError(f"{dist.metadata['Name']}: installed without a WHEEL file (not from a wheel)")
    py, abi, plat = (sorted({t.split("-")[i] for t in tags}) for i in range(3))
    name = re.sub(r"[-.]+", "_", dist.metadata["Name"])
    return f"{name}-{dist.version}-{'.'.join(py)}-{'.'.join(abi)}-{'.'.join(plat)}.whl"


def _entry(name: str) -> zipfile.ZipInfo:
    """A fixed date and mode: the same files give the same wheel (and the node's stamp stays)."""
    i = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    i.compress_type, i.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
    return i


def repack(dist: md.Distribution, out: str) -> str:
    """An installed distribution as a wheel again: its files under site-packages (scripts and
    data outside it are left: pip makes the console scripts from entry_points.txt)."""
    path = os.path.join(out, _wheel_name(dist))
    files = [f for f in dist.files or [] if not str(f).startswith("..") and "__pycache__" not in str(f)
             and not str(f).endswith(".pyc")]
    info = next((str(f).split("/")[0] for f in files if str(f).endswith(".dist-info/METADATA")), None)
    if info is None:
        raise ShipError(f"{dist.metadata['Name']}: no dist-info among its installed files")
    rows = []
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(files, key=str):
            rel = str(f)
            if rel.startswith(info + "/") and rel.split("/", 1)[1] in SKIP_META:
                continue
            data = f.locate().read_bytes()
            z.writestr(_entry(rel), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((rel, f"sha256={digest}", str(len(data))))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows + [(f"{info}/RECORD", "", "")])
        z.writestr(_entry(f"{info}/RECORD"), buf.getvalue())
    os.replace(tmp, path)
    return path


def _tree_key(root: str, pkg: str) -> str:
    """Changes when any file the wheel is built from changes (names, sizes, mtimes)."""
    h = hashlib.sha1()
    for base in (os.path.join(root, "pyproject.toml"), pkg):
        for d, dirs, names in os.walk(base, followlinks=True) if os.path.isdir(base) else [("", [], [base])]:
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            for n in sorted(names):
                p = os.path.join(d, n)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def build_from_tree(root: str, pkg: str, out: str) -> str:
    """pip wheel of a copy of the tree (no build/ or egg-info of an earlier build gets in, none is left)."""
    d = os.path.join(out, "tree-" + _tree_key(root, pkg))
    found = [f for f in os.listdir(d) if f.endswith(".whl")] if os.path.isdir(d) else []
    if not found:
        tmp = tempfile.mkdtemp(dir=out)
        try:
            src = os.path.join(tmp, "src")
            shutil.copytree(root, src, symlinks=True, ignore=NOT_BUILT)
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                                "--quiet", "--wheel-dir", os.path.join(tmp, "dist"), src],
                               capture_output=True, text=True)
            if r.returncode:
                raise ShipError(f"pip wheel {root} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
            os.chmod(os.path.join(tmp, "dist"), 0o755)
            shutil.rmtree(d, ignore_errors=True)
            os.replace(os.path.join(tmp, "dist"), d)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        found = [f for f in os.listdir(d) if f.endswith(".whl")]
    return os.path.join(d, found[0])


def own_wheel(out: str) -> tuple[str, md.Distribution | None]:
    """The hkgpu_tune this Python imports, as a wheel, and its installed distribution (if any)."""
    spec = importlib.util.find_spec("hkgpu_tune")
    if spec is None or not spec.origin:
        raise ShipError(f"no hkgpu_tune for {sys.executable} to ship: install hkgpu-tune on the controller "
                        "or set hkgpu_install_wheel to a hkgpu_tune-*.whl")
    pkg = os.path.dirname(os.path.realpath(spec.origin))
    root = os.path.dirname(pkg)
    try:
        dist = md.distribution(DIST)
    except md.PackageNotFoundError:
        dist = None
    if dist is not None and dist.read_text("WHEEL") and any(os.path.realpath(f.locate()) == os.path.realpath(spec.origin)
                                for f in dist.files or [] if str(f).endswith("hkgpu_tune/__init__.py")):
        return repack(dist, out), dist
    if os.path.exists(os.path.join(root, "pyproject.toml")):
        return build_from_tree(root, pkg, out), None
    raise ShipError(f"{pkg}: neither an installed wheel nor a source tree: set hkgpu_install_wheel")


def _requires(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def _wanted(req: str) -> str | None:
    """The project name of a requirement that applies without an extra (None otherwise)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:       # no packaging: keep the plain ones
        if ";" in req:
            return None
        return re.match(r"[A-Za-z0-9._-]+", req).group(0)
    r = Requirement(req)
    if r.marker and not r.marker.evaluate({"extra": ""}):
        return None
    return r.name


def dependencies(wheel: str, deps: str) -> list[str]:
    """Pack again every dependency (and theirs) installed here; those not installed are left to the node."""
    seen, todo, done = set(), [n for n in map(_wanted, _requires(wheel)) if n], []
    while todo:
        name = _norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        try:
            done.append(repack(dist, deps))
        except ShipError:
            continue
        todo += [n for n in map(_wanted, dist.requires or []) if n]
    return done


def content_key(wheel: str) -> str:
    """sha256 of what a wheel installs (each file's name and bytes, RECORD left out), not of the zip:
    the wheel a collection carries (built by pip, file dates in the zip) and the same version
    packed again from an installed copy (`hkgpu-tune rack`) have other bytes but the same key, so
    switching entry points never reinstalls the nodes."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            if name.endswith("/") or re.search(r"\.dist-info/(RECORD|INSTALLER|REQUESTED|direct_url\.json)$", name):
                continue
            h.update(name.encode() + b"\0" + hashlib.sha256(z.read(name)).digest())
    return h.hexdigest()


def bundle(out: str, key: str, members: list[tuple[str, str]]) -> str:
    """One tar of (file, name in the tar), named by key; fixed owner, mode and date (the same
    files give the same bytes). Other bundles in out an hour old are removed (a run beside this
    one may still copy its own)."""
    path = os.path.join(out, f"bundle-{key}.tar")
    if not os.path.isfile(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as t:
            for src, name in members:
                info = t.gettarinfo(src, arcname=name)
                info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o644, 0, 0, "root", "root"
                with open(src, "rb") as f:
                    t.addfile(info, f)
        os.replace(tmp, path)
    for n in os.listdir(out):
        old = os.path.join(out, n)
        if n.startswith("bundle-") and n != os.path.basename(path) and time.time() - os.lstat(old).st_mtime > 3600:
            os.unlink(old)
    return path


def _extra_files(extra: str) -> list[tuple[str, str]]:
    """The regular files under extra (links and others left out), as (path, extra/relative name)."""
    if not os.path.isdir(extra):
        raise ShipError(f"hkgpu_install_wheelhouse: {extra}: no such directory")
    out = []
    for d, dirs, names in os.walk(extra):
        dirs.sort()
        for n in sorted(names):
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append((p, "extra/" + os.path.relpath(p, extra)))
    return out


def ship(out: str, wheel: str | None = None, deps: bool = True, extra: str = "") -> dict:
    os.makedirs(out, exist_ok=True)
    if wheel:
        if not os.path.isfile(wheel):
            raise ShipError(f"hkgpu_install_wheel: {wheel}: no such file")
    else:
        wheel, _ = own_wheel(out)
    where = os.path.join(out, "deps")
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    packed = dependencies(wheel, where) if deps else []
    h = hashlib.sha1()
    for p in [wheel] + sorted(packed):
        h.update(os.path.basename(p).encode() + b"\0" + content_key(p).encode())
    members = [(wheel, os.path.basename(wheel))] + [(p, "deps/" + os.path.basename(p)) for p in sorted(packed)]
    more = _extra_files(extra) if extra else []
    for p, name in more:                  # no wheelhouse: the same sha1 as before there was one
        with open(p, "rb") as f:
            h.update(name.encode() + b"\0" + hashlib.sha256(f.read()).hexdigest().encode())
    key = h.hexdigest()
    return {"wheel": wheel, "deps": where, "sha1": key, "packed": [os.path.basename(p) for p in packed],
            "bundle": bundle(out, key, members + more)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="", help="directory on the controller for the wheels (default: "
                    "$XDG_CACHE_HOME/hkgpu-tune/wheels, else ~/.cache/hkgpu-tune/wheels)")
    ap.add_argument("--wheel", help="this hkgpu_tune wheel rather than the one this Python imports")
    ap.add_argument("--no-deps", action="store_true", help="only the hkgpu_tune wheel")
    ap.add_argument("--extra", default="", help="a directory of more wheels for the nodes (hkgpu_install_wheelhouse)")
    a = ap.parse_args(argv)
    try:
        out = a.out or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                    "hkgpu-tune", "wheels")
        print(json.dumps(ship(os.path.expanduser(out), a.wheel or None, deps=not a.no_deps, extra=a.extra)))
    except (ShipError, OSError) as e:
        print(f"hkgpu_install: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
