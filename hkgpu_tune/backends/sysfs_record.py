"""Record the /sys and /proc files a run reads into a tree that `SysFs(root=tree)` replays.

>>> rec = RecordingSysFs(SysFs("/"))                 # doctest: +SKIP
>>> Engine(profile, backends=Backends(sysfs=rec)).facts()   # doctest: +SKIP
>>> rec.dump("/tmp/tree")                            # doctest: +SKIP
"""
from __future__ import annotations

import os
import shutil


class RecordingSysFs:
    def __init__(self, inner):
        self.inner = inner
        self.root = inner.root
        self.seen: set[str] = set()     # read: contents copied
        self.listed: set[str] = set()   # only listed: names kept, files left empty

    def p(self, path):
        self.seen.add(path)
        return self.inner.p(path)

    def read(self, path):
        self.seen.add(path)
        return self.inner.read(path)

    def write(self, path, value):
        raise PermissionError("recording is read-only")

    def listdir(self, path):
        names = self.inner.listdir(path)
        self.listed.update(os.path.join(path, n) for n in names)
        return names

    def readlink(self, path):
        self.seen.add(path)
        return self.inner.readlink(path)

    def exists(self, path):
        self.seen.add(path)
        return self.inner.exists(path)

    def dump(self, dest: str) -> int:
        """Copy every path seen (symlinks as symlinks, files' contents, directories empty). Returns a count."""
        n = 0
        for path in sorted(self.seen):
            n += _copy(self.inner.p("/"), path, dest)
        for path in sorted(self.listed - self.seen):
            n += _copy(self.inner.p("/"), path, dest, content=False)
        return n


def _copy(src_root: str, path: str, dest: str, content: bool = True) -> int:
    # walk the components so that every symlink on the way is recreated as a link
    parts = [x for x in path.split("/") if x]
    cur = ""
    for i, part in enumerate(parts):
        cur = f"{cur}/{part}"
        src = os.path.join(src_root, cur.lstrip("/"))
        dst = os.path.join(dest, cur.lstrip("/"))
        if os.path.islink(src):
            target = os.readlink(src)
            if not os.path.lexists(dst):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.symlink(target, dst)
            # continue through the link's target so that it exists in the tree too
            rest = "/".join(parts[i + 1:])
            real = os.path.normpath(os.path.join(os.path.dirname(cur), target)) if not target.startswith("/") else target
            return _copy(src_root, f"{real}/{rest}" if rest else real, dest, content)
        if not os.path.exists(src):
            return 0
        if i == len(parts) - 1:
            if os.path.isdir(src):
                os.makedirs(dst, exist_ok=True)
            elif not content:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                open(dst, "a").close()
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                try:
                    with open(src, "rb") as f:
                        data = f.read()
                except OSError:
                    return 0
                with open(dst, "wb") as f:
                    f.write(data)
            return 1
    return 0


def pack(tree: str, archive: str) -> str:
    """tar.gz of a recorded tree (symlinks kept)."""
    return shutil.make_archive(archive.removesuffix(".tar.gz"), "gztar", tree)
