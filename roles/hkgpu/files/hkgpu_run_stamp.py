#!/usr/bin/env python3
"""What this controller would converge, as one digest (run once a play by role hkgpu's converged.yml).

    python3 hkgpu_run_stamp.py ROLES_DIR -- SHIP_ARGV...
prints JSON: {"code": sha256 of the collection's roles, playbooks, plugins and galaxy.yml,
"ship": the output of hkgpu_install's hkgpu_ship.py (the toolkit wheel and its sha1)}.
Standard library only.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys


def tree(digest, top: str) -> None:
    for d, dirs, files in os.walk(top, followlinks=True):
        dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", ".git"))
        for f in sorted(files):
            if f.endswith((".pyc", ".whl")):
                continue
            p = os.path.join(d, f)
            digest.update(os.path.relpath(p, top).encode() + b"\0")
            if not os.path.exists(p):        # a link to outside the tree that was not copied
                digest.update(os.readlink(p).encode())
                continue
            with open(p, "rb") as fh:
                digest.update(hashlib.sha256(fh.read()).digest())


def main(argv: list[str]) -> int:
    roles, ship = os.path.realpath(argv[0]), argv[argv.index("--") + 1:]
    top = os.path.dirname(roles)
    digest = hashlib.sha256()
    # a collection (roles/ beside plugins/), or a site tree whose collection is under collections/
    for sub in ("roles", "playbooks", "plugins", "galaxy.yml",
                "collections/ansible_collections/hkgpu/tune/plugins"):
        p = os.path.join(top, sub)
        if os.path.isdir(p):
            digest.update(sub.encode() + b"\0")
            tree(digest, p)
        elif os.path.isfile(p):
            with open(p, "rb") as fh:
                digest.update(fh.read())
    r = subprocess.run(ship, capture_output=True, text=True)
    if r.returncode:
        sys.stderr.write(r.stderr)
        return r.returncode
    print(json.dumps({"code": digest.hexdigest(), "ship": json.loads(r.stdout)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
