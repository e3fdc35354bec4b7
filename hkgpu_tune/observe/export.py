"""One export run: verify plus every collector, written atomically as ONE textfile for
node_exporter's textfile collector (the timer, the boot unit and an operator all write this file).

>>> rep = export(load_profile("hk-inference"), "/var/lib/prometheus/node-exporter")  # doctest: +SKIP
>>> rep.path
'/var/lib/prometheus/node-exporter/hkgpu-tune.prom'
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import re
import stat
import time
from dataclasses import dataclass, field

from hkgpu_tune.observe import collect as C
from hkgpu_tune.observe import health
from hkgpu_tune.core import paths, report
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import atomic_write

DEFAULT_DIR = paths.TEXTFILE_DIR
FILE_NAME = paths.TEXTFILE_NAME
ENV_DIR = "HKGPU_TUNE_TEXTFILE_DIR"


@dataclass
class ExportReport:
    path: str
    results: list = field(default_factory=list)        # verify's Results
    collectors: list = field(default_factory=list)     # collect.Result, verify's included
    seconds: float = 0.0
    series: int = 0
    text: str = ""

    @property
    def failures(self) -> int:
        return sum(1 for r in self.results if r.failed)

    @property
    def down(self) -> list[str]:
        return [c.collector for c in self.collectors if not c.up]


def textfile_dir(arg: str | None) -> str:
    return arg or os.environ.get(ENV_DIR) or DEFAULT_DIR


def check_dir(d: str) -> None:
    """The textfile directory must exist, be a directory and be writable: one line otherwise."""
    try:
        st = os.stat(d)
    except FileNotFoundError:
        raise HkError(f"{d}: textfile directory does not exist (create it, or pass --textfile-dir)") from None
    except OSError as e:
        raise HkError(f"{d}: textfile directory cannot be read: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise HkError(f"{d}: not a directory (--textfile-dir)")
    if not os.access(d, os.W_OK | os.X_OK):
        raise HkError(f"{d}: textfile directory is not writable (permissions, or a read-only file system)")


SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", re.M)
READ_MAX = 8 << 20   # a textfile bigger than this is read in part: enough to find a clash


def series_names(text: str) -> set[str]:
    """The metric names of a text-format file's samples (comments left out)."""
    return set(SAMPLE_RE.findall(text))


def check_one_writer(path: str, text: str) -> None:
    """node_exporter's textfile collector merges every *.prom of its directory and drops a series
    that two files carry, without raising node_textfile_scrape_error: refuse to write `path`
    where another *.prom of the directory has one of the same metric names."""
    mine = series_names(text)
    here = os.path.realpath(path)
    for other in sorted(glob.glob(os.path.join(os.path.dirname(path) or ".", "*.prom"))):
        if os.path.realpath(other) == here or not os.path.isfile(other):
            continue
        try:
            with open(other, errors="replace") as f:
                clash = sorted(mine & series_names(f.read(READ_MAX)))
        except OSError:
            continue
        if clash:
            more = f" and {len(clash) - 1} more" if len(clash) > 1 else ""
            raise HkError(f"{path}: {other} already has {clash[0]}{more}; node_exporter would drop the "
                          f"duplicate series (one writer per textfile): write to another directory")


@contextlib.contextmanager
def one_writer(directory: str):
    """Serialise writers of the directory's textfiles (the timer, the boot unit, an operator):
    an exclusive flock on the directory itself, held while the file is built and renamed."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # releases the lock


def write_textfile(path: str, text: str) -> None:
    """`verify --prometheus FILE`: the same one-writer rules as the export."""
    d = os.path.dirname(os.path.abspath(path))
    with one_writer(d):
        check_one_writer(path, text)
        atomic_write(path, text, mode=0o644)


def profile_sha256(profile, path=None) -> str:
    """sha256 of the profile file's bytes: `path` (the CLI passes the file it resolved), else the
    profile's own path (the default profile carries only its shipped file's name)."""
    from hkgpu_tune.core.profile import default_profile_path, read_profile_file
    if path is None:
        path = default_profile_path() if str(profile.path) == default_profile_path().name else profile.path
    try:
        return hashlib.sha256(read_profile_file(path).encode()).hexdigest()
    except Exception:  # noqa: BLE001 - an in-memory profile: hash its name
        return hashlib.sha256(str(profile.path).encode()).hexdigest()


def _verify(engine) -> tuple[list, C.Result]:
    t = time.perf_counter()
    try:
        res = engine.verify()
        return res, C.Result("verify", True, [], {}, None, time.perf_counter() - t)
    except HkError as e:
        return [], C.Result("verify", False, [], {}, C.one_line(e), time.perf_counter() - t)


def _mtu_probe(engine) -> list[C.Family]:
    link = engine.by_name.get("link")
    if link is None:
        return []
    # one series per (device, peer): a peer that is both fabric (jumbo size) and WAN (1472 bytes) is
    # probed twice; any failure wins (node_exporter would keep one of two samples, maybe the "1")
    ok: dict[tuple[str, str], int] = {}
    # a failure found before any ping (no route, a link down) is a 0 too, its missing half "-"
    for r in link.probe():
        if r.key.startswith("path mtu"):
            k = (r.target, r.key.removeprefix("path mtu").removeprefix(" to ") or "-")
            ok[k] = min(ok.get(k, 1), 1 if r.status == "ok" else 0)
    return [C.Family("hkgpu_tune_mtu_probe_ok", "gauge",
                     "1 if every don't-fragment ping of the profile's MTU reached the peer.",
                     [({"device": d, "peer": a}, v) for (d, a), v in ok.items()])]


def build(profile, engine, *, probes: bool = False, sources: C.Sources | None = None,
          now: float | None = None, profile_file=None, collectors=None, exporters=None) -> ExportReport:
    """Run verify and the collectors; the text of the file, not yet written.

    collectors: which run (default: the profile's export.collectors); exporters: {name: runs}
    (default: the profile's export: switch, `auto` looking for their processes)."""
    from hkgpu_tune.observe.collect import exporters as E
    t0 = time.perf_counter()
    src = sources or C.Sources()
    if src.nvml is None and "gpu" in engine.by_name:
        src.nvml = engine.b.nvml         # one nvmlInit for verify and the collector
    cfg = E.config_of(profile)
    names = list(collectors or cfg.collectors) + (["probe"] if probes else [])
    there = exporters if exporters is not None else E.present(cfg, src.proc_root)
    results, vres = _verify(engine)
    cres = C.collect(profile, names, probes=probes, sources=src)
    extra = []
    if probes:
        t = time.perf_counter()
        try:
            extra = _mtu_probe(engine)
            cres.append(C.Result("mtu_probe", True, extra, {}, None, time.perf_counter() - t))
        except HkError as e:
            cres.append(C.Result("mtu_probe", False, [], {}, C.one_line(e), time.perf_counter() - t))
    allres = [vres] + cres
    allres.append(health.from_collectors(profile, cres, results))   # hkgpu_tune_health_status, _check{check}
    present = E.apply(allres, there)     # what node_exporter / dcgm-exporter export live is left to them
    from hkgpu_tune.core.version import __version__
    head = report.to_prometheus(results) if vres.up else ""
    run = [C.Family("hkgpu_tune_info", "gauge", "hkgpu-tune version and profile.",
                    [({"version": __version__, "profile": profile.name or str(profile.path),
                       "profile_sha256": profile_sha256(profile, profile_file)}, 1)]),
           C.Family("hkgpu_tune_last_run_timestamp_seconds", "gauge", "When the export ran (Unix time).",
                    [({}, round(time.time() if now is None else now, 3))]),
           present]
    body = C.to_textfile(allres)
    dur = time.perf_counter() - t0
    run.append(C.Family("hkgpu_tune_run_duration_seconds", "gauge", "How long the export run took.",
                        [({}, round(dur, 6))]))
    text = head + "\n".join(C.render(run)) + "\n" + body
    series = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
    return ExportReport("", results, allres, dur, series, text)


def export(profile, directory: str | None = None, *, probes: bool = False, engine=None,
           sources: C.Sources | None = None, state_dir: str | None = None, profile_file=None,
           collectors=None, exporters=None) -> ExportReport:
    """Check the directory first (nothing is collected into a place that cannot take it), then
    build and write DIR/hkgpu-tune.prom atomically; the previous file stays on any error. Two
    writers of the directory take turns; a file of another writer with the same series is refused."""
    d = textfile_dir(directory)
    check_dir(d)
    if engine is None:
        from hkgpu_tune.tune.engine import Engine
        engine = Engine(profile, state_dir=state_dir)
    with one_writer(d):
        rep = build(profile, engine, probes=probes, sources=sources, profile_file=profile_file,
                    collectors=collectors, exporters=exporters)
        rep.path = os.path.join(d, FILE_NAME)
        check_one_writer(rep.path, rep.text)
        atomic_write(rep.path, rep.text, mode=0o644)
    return rep
