"""One export run: verify plus every collector, written atomically as ONE textfile for
node_exporter's textfile collector (the timer, the boot unit and an operator all write this file).

>>> rep = export(load_profile("hk-inference"), "/var/lib/prometheus/node-exporter")  # doctest: +SKIP
>>> rep.path
'/var/lib/prometheus/node-exporter/hkgpu-tune.prom'
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from dataclasses import dataclass, field

from hkgpu_tune.observe import collect as C
from hkgpu_tune.observe import health
from hkgpu_tune.core import paths, report
from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core import safedir

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


def open_dir(d: str) -> int:
    """A descriptor of the textfile directory, opened under core.safedir's rule (no link on the
    way, every directory above owned by root or a system account such as Debian's `prometheus`,
    the directory itself root's and no one else's to write). One line naming the reason otherwise."""
    return safedir.open_dir(d, "textfile directory")


def check_dir(d: str) -> None:
    """open_dir() without keeping the descriptor (the CLI fails fast, before the profile loads)."""
    os.close(open_dir(d))


SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", re.M)
READ_MAX = 8 << 20   # a textfile bigger than this is read in part: enough to find a clash


def series_names(text: str) -> set[str]:
    """The metric names of a text-format file's samples (comments left out)."""
    return set(SAMPLE_RE.findall(text))


def check_one_writer(dirfd: int, where: str, name: str, text: str) -> None:
    """node_exporter's textfile collector merges every *.prom of its directory and drops a series
    that two files carry, without raising node_textfile_scrape_error: refuse to write `name`
    where another *.prom of the directory has one of the same metric names."""
    mine = series_names(text)
    for other in sorted(n for n in os.listdir(dirfd) if n.endswith(".prom") and n != name):
        body = safedir.read_at(dirfd, other, READ_MAX)
        clash = sorted(mine & series_names(body)) if body else []
        if clash:
            more = f" and {len(clash) - 1} more" if len(clash) > 1 else ""
            raise HkError(f"{os.path.join(where, name)}: {os.path.join(where, other)} already has "
                          f"{clash[0]}{more}; node_exporter would drop the duplicate series (one writer "
                          f"per textfile): write to another directory")


LOCK_FILE = "textfile.lock"
LOCK_WAIT = 30.0     # seconds a writer waits for another of ours, then says so and gives up


@contextlib.contextmanager
def one_writer():
    """Serialise this tool's textfile writers (the timer, the boot unit, an operator) with a lock
    file in the host directory (root's, 0700: no other user can open it, let alone hold it; a lock
    on the textfile directory itself could be taken by anyone who can read it). Tried without
    blocking for at most LOCK_WAIT seconds: a stuck writer of ours is an error, never a hang."""
    from hkgpu_tune.core import lockfile
    from hkgpu_tune.tune.host import Host, owned_problem
    h = Host()
    try:
        h.check_dir()
    except HkError:
        if os.geteuid() == 0:
            raise
        yield           # not root and no host directory of ours: nothing to serialise with
        return
    path = os.path.join(h.dir, LOCK_FILE)
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            with lockfile.hold(path, "textfile lock file", f"{os.getpid()}\n", owned_problem):
                yield
            return
        except lockfile.Busy as e:
            if time.monotonic() >= deadline:
                pid = e.record.split(b"\n")[0].decode("ascii", "replace").strip()
                raise HkError(f"{path}: another export (pid {pid or '?'}) has held the textfile lock "
                              f"for over {LOCK_WAIT:.0f} s: nothing written") from None
            time.sleep(0.2)


def write_textfile(path: str, text: str) -> None:
    """`verify --prometheus FILE`: the same directory rule and one-writer rules as the export."""
    where = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    fd = safedir.open_dir(where, "directory of the --prometheus file")
    try:
        with one_writer():
            check_one_writer(fd, where, name, text)
            safedir.write_at(fd, name, text, where)
    finally:
        os.close(fd)


def profile_sha256(profile, path=None) -> str:
    """sha256 of the profile file's bytes: `path` (the CLI passes the file it resolved), else the
    profile's own path (the default profile carries only its shipped file's name)."""
    from hkgpu_tune.core.profile import default_profile_path, read_profile_file
    if getattr(profile, "text", ""):   # exactly what was parsed, wherever it came from
        return hashlib.sha256(profile.text.encode()).hexdigest()
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
    d = os.path.normpath(os.path.abspath(textfile_dir(directory)))
    fd = open_dir(d)
    try:
        if engine is None:
            from hkgpu_tune.tune.engine import Engine
            engine = Engine(profile, state_dir=state_dir)
        with one_writer():
            rep = build(profile, engine, probes=probes, sources=sources, profile_file=profile_file,
                        collectors=collectors, exporters=exporters)
            rep.path = os.path.join(d, FILE_NAME)
            check_one_writer(fd, d, FILE_NAME, rep.text)
            safedir.write_at(fd, FILE_NAME, rep.text, d)
    finally:
        os.close(fd)
    return rep
