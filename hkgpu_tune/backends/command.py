"""Run a program where no API exists; never through a shell."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import program_refusal


@dataclass
class Completed:
    rc: int
    out: str
    err: str


class Command:
    def which(self, prog: str) -> str | None:
        return shutil.which(prog) or next(
            (p for p in (f"/usr/sbin/{prog}", f"/sbin/{prog}", f"/usr/bin/{prog}") if shutil.os.path.exists(p)), None)

    def run(self, argv: list[str], timeout: float = 30, env=None) -> Completed:
        exe = self.which(argv[0])
        if exe is None:
            raise HkError(f"{argv[0]}: program not found")
        refused = program_refusal(exe)
        if refused:
            raise HkError(refused)
        try:
            p = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise HkError(f"{' '.join(argv)}: no answer in {timeout} s") from None
        return Completed(p.returncode, p.stdout, p.stderr)
