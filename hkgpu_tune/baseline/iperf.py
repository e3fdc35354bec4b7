"""iperf3 (Debian's, 3.x) as client with --json, and the bounded server of `baseline serve`.

>>> r = client("198.18.0.2", seconds=1, streams=4, reverse=True)   # doctest: +SKIP
>>> r.gbit, r.retransmits, r.error                                    # doctest: +SKIP
(11.8, 0, None)
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import program_refusal

MISSING = "iperf3 is not installed (Debian package iperf3): no throughput measured"
BUSY = "the server is busy"
# a persistent `iperf3 -s` closes and reopens its listening socket after each test: a client that
# connects in that moment is refused or reset (esnet/iperf pull request 2066)
BETWEEN_TESTS = ("Connection refused", "Connection reset")


def exe() -> str | None:
    return shutil.which("iperf3") or next(
        (p for p in ("/usr/bin/iperf3", "/usr/local/bin/iperf3") if shutil.os.access(p, shutil.os.X_OK)), None)


@dataclass
class Run:
    """One iperf3 test: the receiver's total rate (what arrived), the sender's retransmits."""
    gbit: float | None = None
    retransmits: int | None = None
    seconds: float | None = None
    intervals_gbit: list = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def parse(text: str) -> Run:
    """One iperf3 --json document -> Run. An error iperf3 reports is Run.error, not an exception."""
    try:
        doc = json.loads(text)
    except ValueError:
        line = " ".join(text.split())[:200]
        return Run(error=f"iperf3 gave no JSON: {line or 'no output'}")
    if not isinstance(doc, dict):
        return Run(error="iperf3 gave JSON that is not an object")
    if doc.get("error"):
        return Run(error=f"iperf3: {' '.join(str(doc['error']).split())[:200]}")
    end = doc.get("end") if isinstance(doc.get("end"), dict) else {}
    recv, sent = end.get("sum_received"), end.get("sum_sent")
    if not isinstance(recv, dict) or not isinstance(recv.get("bits_per_second"), (int, float)):
        return Run(error="iperf3: no end.sum_received.bits_per_second in its JSON")
    ivals = []   # (seconds, Gbit/s) of each reporting interval after the omitted ones
    for iv in doc.get("intervals") or []:
        s = iv.get("sum") if isinstance(iv, dict) else None
        if isinstance(s, dict) and isinstance(s.get("bits_per_second"), (int, float)) and not s.get("omitted") \
                and isinstance(s.get("seconds"), (int, float)):
            ivals.append((s["seconds"], round(s["bits_per_second"] / 1e9, 4)))
    longest = max((t for t, _ in ivals), default=0)
    ivals = [g for t, g in ivals if t >= longest / 2]   # a last sliver of an interval is not a sample
    rt = sent.get("retransmits") if isinstance(sent, dict) else None
    return Run(gbit=recv["bits_per_second"] / 1e9, retransmits=rt if isinstance(rt, int) else None,
               seconds=recv.get("seconds"), intervals_gbit=ivals)


def client(addr: str, port: int = 5201, seconds: int = 5, streams: int = 4, reverse: bool = False,
           omit_s: int = 0, connect_timeout_s: float = 3.0, busy_retries: int = 3) -> Run:
    """One bounded test against `iperf3 -s` at addr:port (reverse: the server sends)."""
    prog = exe()
    if prog is None:
        return Run(error=MISSING)
    if program_refusal(prog):
        return Run(error=program_refusal(prog))
    # five reporting intervals per run: the spread compare judges a change by
    argv = [prog, "-c", addr, "-p", str(port), "-t", str(seconds), "-P", str(streams), "--json",
            "-i", f"{max(0.1, seconds / 5):g}", "--connect-timeout", str(int(connect_timeout_s * 1000))]
    if omit_s:
        argv += ["-O", str(omit_s)]
    if reverse:
        argv.append("-R")
    limit = seconds + omit_s + connect_timeout_s + 10
    for attempt in range(busy_retries + 1):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return Run(error=f"iperf3 to {addr}:{port}: no result in {limit:g} s")
        except OSError as e:
            return Run(error=f"iperf3: cannot run: {e.strerror}")
        r = parse(p.stdout if p.stdout.strip() else p.stderr)
        if r.error and BUSY in r.error and attempt < busy_retries:
            time.sleep(0.5 * (attempt + 1))   # another host's test holds the server: wait our turn
            continue
        if r.error and any(x in r.error for x in BETWEEN_TESTS) and attempt < busy_retries:
            time.sleep(0.2 * (attempt + 1))   # the server between two tests (or not there: said after)
            continue
        return r
    return r


class Stopped(Exception):
    pass


def local_addresses() -> set[str]:
    """The addresses of this host (in this network namespace)."""
    import psutil
    return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}


def listen_on(named: list[str], peers: list[str]) -> list[str]:
    """Where `baseline serve` listens: the addresses given (--bind), else those of the profile's
    peers this host holds. Never every address: none of either is an error saying so."""
    if named:
        return list(dict.fromkeys(named))
    mine = local_addresses()
    found = [a for a in dict.fromkeys(peers) if a in mine]
    if not found:
        raise HkError("baseline serve: none of the profile's network.fabric_peers or wan_peers is an address of "
                      "this host, and no --bind ADDR was given: it never listens on every address")
    return found


def serve(port: int = 5201, seconds: float = 600, one_off: bool = False, bind: list[str] | str | None = None,
          out=None) -> int:
    """Run `iperf3 -s -B ADDR` on each address for at most `seconds` (or until one test ends with
    one_off). Returns 0; an iperf3 that fails (a port in use) raises HkError with its last line."""
    prog = exe()
    if prog is None:
        raise HkError(MISSING.split(":")[0])
    refused = program_refusal(prog)
    if refused:
        raise HkError(refused)
    binds = [bind] if isinstance(bind, str) else list(bind or [None])
    argvs = []
    for addr in binds:
        argv = [prog, "-s", "-p", str(port)]
        if one_off:
            argv.append("-1")
        if addr:
            argv += ["-B", addr]
        argvs.append(argv)
    import signal
    import tempfile
    import threading

    def stop(signum, frame):
        raise Stopped()
    main = threading.current_thread() is threading.main_thread()
    ends = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    old = {s: signal.signal(s, stop) for s in ends} if main else {}   # a stop signal still ends iperf3 -s

    def bound():   # in the child: iperf3 dies with this process, whatever kills it (SIGKILL included)
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)
    parent = os.getpid()
    procs: list[tuple[subprocess.Popen, object]] = []
    failed = None
    try:
        for argv in argvs:
            err = tempfile.TemporaryFile()
            procs.append((subprocess.Popen(argv, stdout=out or subprocess.DEVNULL, stderr=err, preexec_fn=bound), err))
        end = time.monotonic() + seconds
        while time.monotonic() < end:   # until the bound, one exits (one-off, or an error) or a signal
            done = [(p, e) for p, e in procs if p.poll() is not None]
            if done:
                failed = next(((p, e) for p, e in done if p.returncode), None)
                break
            time.sleep(0.1)
    except Stopped:
        pass
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        for p, _ in procs:
            if p.poll() is None:
                p.terminate()
        for p, _ in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for _, e in procs:
            if failed is None or e is not failed[1]:
                e.close()
    if failed:
        p, err = failed
        err.seek(0)
        lines = [x.strip() for x in err.read(4096).decode(errors="replace").splitlines() if x.strip()]
        err.close()
        why = next((x for x in lines if "error" in x), lines[-1] if lines else "no message")
        raise HkError(f"iperf3 -s on port {port} exited with {p.returncode}: {why}")
    return 0
