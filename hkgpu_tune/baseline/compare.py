"""Two snapshots -> every metric with both values, the change, and a verdict judged by the spread
of the samples (stats.verdict); a metric regresses when it is worse past its threshold.

>>> cmp = compare(load("before.json"), load("after.json"))     # doctest: +SKIP
>>> cmp.exit_code                                               # doctest: +SKIP
2
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import FileRefused, read_regular
from hkgpu_tune.baseline import COMMAND, FORMAT, settings, stats

MAX_BYTES = 64 << 20


class SnapshotError(HkError):
    """A snapshot file that cannot be compared: unreadable, not ours, another format or host."""


@dataclass
class Snapshot:
    path: str
    doc: dict

    @property
    def host(self) -> str:
        return self.doc.get("host", "?")

    @property
    def time(self) -> str:
        return self.doc.get("time", "?")


def _int(text: str) -> int:
    """A JSON integer that a measurement could be: one a float holds (compared as floats)."""
    if len(text.lstrip("-")) > 300:
        raise ValueError(f"the integer {text[:12]}... ({len(text)} digits) is too large for a measurement")
    return int(text)


def load(path: str) -> Snapshot:
    """A snapshot file: a regular file of at most 64 MiB, JSON, written by `baseline capture` in
    this format version. Anything else is one SnapshotError naming the file (and key)."""
    try:
        raw = read_regular(path, MAX_BYTES)
    except FileRefused as e:
        if e.kind == "not regular":
            raise SnapshotError(f"{path}: not a regular file") from None
        if e.kind in ("too large", "grew"):
            raise SnapshotError(f"{path}: larger than {MAX_BYTES >> 20} MiB: not a snapshot") from None
        raise SnapshotError(f"{path}: cannot read the snapshot: {e.strerror}") from None
    try:
        doc = json.loads(raw.decode("utf-8"), parse_int=_int)
    except (UnicodeDecodeError, ValueError) as e:
        raise SnapshotError(f"{path}: not a JSON snapshot ({' '.join(str(e).split())[:120]})") from None
    except RecursionError:
        raise SnapshotError(f"{path}: not a JSON snapshot (nested too deeply)") from None
    if not isinstance(doc, dict) or doc.get("command") != COMMAND:
        raise SnapshotError(f"{path}: not a baseline snapshot (command: {doc.get('command') if isinstance(doc, dict) else None!r})")
    fmt = doc.get("baseline_format")
    if fmt != FORMAT:
        raise SnapshotError(f"{path}: baseline_format: snapshot format {fmt!r}, this hkgpu-tune reads format {FORMAT}")
    for key, kind in (("host", str), ("time", str), ("latency", list), ("throughput", list),
                      ("counters", dict), ("kernel", dict), ("engine", dict)):
        if not isinstance(doc.get(key), kind):
            raise SnapshotError(f"{path}: {key}: expected a {'string' if kind is str else kind.__name__}, "
                                f"got {type(doc.get(key)).__name__}")
    return Snapshot(path, doc)


# ---------------------------------------------------------------- metrics of one snapshot
@dataclass
class Metric:
    key: str
    kind: str                  # a settings.THRESHOLDS key
    unit: str
    better: str                # higher | lower
    samples: list              # the repeats that give the spread
    value: float | None = None  # the figure shown (default: the samples' mean)
    error: str | None = None   # measured in this snapshot but failed

    def shown(self) -> float | None:
        if self.value is not None:
            return self.value
        return statistics.fmean(self.samples) if self.samples else None


def _nums(xs, where: str) -> list[float]:
    if not isinstance(xs, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
        raise SnapshotError(f"{where}: expected a list of numbers")
    if not all(math.isfinite(x) for x in xs):
        raise SnapshotError(f"{where}: NaN or infinity is not a measurement")
    return [float(x) for x in xs]


def _num(v, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SnapshotError(f"{where}: expected a number, got {type(v).__name__}")
    if not math.isfinite(v):
        raise SnapshotError(f"{where}: NaN or infinity is not a number here")
    return float(v)


def _row(item, where: str) -> dict:
    if not isinstance(item, dict):
        raise SnapshotError(f"{where}: expected a mapping")
    return item


def metrics(snap: Snapshot) -> dict[str, Metric]:
    from hkgpu_tune.observe.collect.probe import stats as ping_stats
    d, p = snap.doc, snap.path
    out: dict[str, Metric] = {}
    for i, t in enumerate(d["throughput"]):
        t = _row(t, f"{p}: throughput[{i}]")
        peer, direction = str(t.get("peer")), str(t.get("direction"))
        runs = t.get("runs") or []
        if not isinstance(runs, list):
            raise SnapshotError(f"{p}: throughput[{i}].runs: expected a list")
        rates = [_num(_row(r, f"{p}: throughput[{i}].runs[{j}]").get("gbit"), f"{p}: throughput[{i}].runs[{j}].gbit")
                 for j, r in enumerate(runs)]
        rates = [x for x in rates if x is not None]
        err = t.get("error") if not rates else None
        # the spread: iperf3's reporting intervals of every run (runs alone are too few: 2-3)
        ivals = [x for j, r in enumerate(runs)
                 for x in _nums(r.get("intervals_gbit") or [], f"{p}: throughput[{i}].runs[{j}].intervals_gbit")]
        out[f"throughput {peer} {direction}"] = Metric(
            f"throughput {peer} {direction}", "throughput", "Gbit/s", "higher", ivals if len(ivals) > len(rates) else rates,
            value=statistics.fmean(rates) if rates else None, error=err and str(err))
        rts = [r.get("retransmits") for r in runs
               if isinstance(r.get("retransmits"), int) and not isinstance(r.get("retransmits"), bool)]
        if rts:
            out[f"retransmits {peer} {direction}"] = Metric(f"retransmits {peer} {direction}", "retransmits",
                                                            "segments/run", "lower", [float(x) for x in rts])
    for i, lrow in enumerate(d["latency"]):
        lrow = _row(lrow, f"{p}: latency[{i}]")
        peer = f"{lrow.get('kind', '?')} {lrow.get('peer')}"
        rtts = _nums(lrow.get("rtts_ms") or [], f"{p}: latency[{i}].rtts_ms")
        err = lrow.get("error") if not rtts else None
        parts = [ping_stats("", len(c), c) for c in stats.chunks(rtts)]
        for kind, attr, label in (("rtt_p50", "p50_ms", "rtt p50"), ("rtt_p99", "p99_ms", "rtt p99"),
                                  ("jitter", "jitter_ms", "jitter")):
            samples = [getattr(s, attr) for s in parts if getattr(s, attr) is not None]
            out[f"{label} {peer}"] = Metric(f"{label} {peer}", kind, "ms", "lower", samples,
                                            value=_num(lrow.get(attr), f"{p}: latency[{i}].{attr}") if rtts else None,
                                            error=err and str(err))
        loss = _num(lrow.get("loss_ratio"), f"{p}: latency[{i}].loss_ratio")
        if loss is not None or err:
            out[f"loss {peer}"] = Metric(f"loss {peer}", "loss", "ratio", "lower",
                                         [loss] if loss is not None else [], error=err and str(err))
    nic = d["counters"].get("nic")
    if isinstance(nic, dict) and "error" not in nic:
        for dev, c in nic.items():
            c = _row(c, f"{p}: counters.nic.{dev}")
            bad = sum(_num(c.get(k), f"{p}: counters.nic.{dev}.{k}") or 0
                      for k in ("rx_dropped", "tx_dropped", "rx_errors", "tx_errors"))
            out[f"nic drops+errors {dev}"] = Metric(f"nic drops+errors {dev}", "nic_drops", "packets", "lower",
                                                    [float(bad)])
    tcp = d["counters"].get("tcp")
    if isinstance(tcp, dict) and all(isinstance(tcp.get(k), int) and not isinstance(tcp.get(k), bool)
                                     for k in ("out_segs", "retrans_segs")):
        ratio = tcp["retrans_segs"] / tcp["out_segs"] if tcp["out_segs"] > 0 else 0.0
        out["tcp retransmitted/sent"] = Metric("tcp retransmitted/sent", "tcp_retrans_ratio", "ratio", "lower", [ratio])
    if not d["kernel"].get("error"):
        evs = d["kernel"].get("events") or []
        if not isinstance(evs, list):
            raise SnapshotError(f"{p}: kernel.events: expected a list")
        for kind in ("xid", "link_flap", "nic_reset"):
            n = sum(1 for e in evs if isinstance(e, dict) and e.get("kind") == kind)
            out[f"kernel {kind} events"] = Metric(f"kernel {kind} events", "kernel_events", "since boot", "lower",
                                                  [float(n)])
    e = d["engine"]
    if e.get("status") == "ok":
        rates = _nums(e.get("img_s") or [], f"{p}: engine.img_s")
        lat = _nums(e.get("latency_ms") or [], f"{p}: engine.latency_ms")
        name = f"{e.get('tool')} {e.get('model')} b{e.get('batch')}"
        out[f"engine {name} img/s"] = Metric(f"engine {name} img/s", "engine_rate", "img/s", "higher", rates)
        lat_parts = [statistics.median(c) for c in stats.chunks(lat) if c]
        out[f"engine {name} latency p50"] = Metric(f"engine {name} latency p50", "engine_latency", "ms", "lower",
                                                   lat_parts, value=statistics.median(lat) if lat else None)
    elif e.get("status") == "error":
        out["engine"] = Metric("engine", "engine_rate", "img/s", "higher", [], error=str(e.get("reason")))
    return out


# ---------------------------------------------------------------- the comparison
@dataclass
class Row:
    key: str
    kind: str
    unit: str
    better: str
    before: float | None
    after: float | None
    change: float | None
    change_pct: float | None
    verdict: str               # better | worse | within noise | failed after | only before | new | not measured
    noise: float | None
    threshold: str
    regressed: bool
    n_before: int
    n_after: int
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Comparison:
    before: Snapshot
    after: Snapshot
    rows: list[Row] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    node_changes: list[dict] = field(default_factory=list)   # node.changes: settings, versions, NICs

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regressed]

    @property
    def exit_code(self) -> int:
        return 2 if self.regressions else 0

    def to_dict(self) -> dict:
        side = lambda s: {"path": s.path, "host": s.host, "time": s.time, "profile": s.doc.get("profile"),
                          "quick": s.doc.get("quick")}
        return {"before": side(self.before), "after": side(self.after), "metrics": [r.to_dict() for r in self.rows],
                "regressions": [r.key for r in self.regressions], "warnings": self.warnings,
                "node_changes": self.node_changes}


def recorded_thresholds(snap: Snapshot) -> dict:
    """The thresholds the node's profile had at capture (`thresholds` in the snapshot), over the
    defaults; a snapshot without them gets the defaults. A bad value is one SnapshotError."""
    th = dict(settings.THRESHOLDS)
    raw = snap.doc.get("thresholds")
    for kind, t in (_row(raw, f"{snap.path}: thresholds") if raw is not None else {}).items():
        if kind in th:   # else a kind a newer hkgpu-tune knows
            where = f"{snap.path}: thresholds.{kind}"
            t = _row(t, where)
            pct, ab = _num(t.get("pct"), where + ".pct"), _num(t.get("abs"), where + ".abs")
            for name, v, hi in (("pct", pct, 1000.0), ("abs", ab, 1e12)):
                if v is not None and not 0 <= v <= hi:
                    raise SnapshotError(f"{where}.{name}: {v:g} is out of range (0-{hi:g})")
            th[kind] = settings.Threshold(pct, ab)
    return th


def compare(before: Snapshot, after: Snapshot, cfg: settings.Settings | None = None,
            allow_other_host: bool = False) -> Comparison:
    """cfg None: the thresholds the baseline (the before snapshot) recorded, its node's profile at
    capture: never the candidate's, which could excuse its own regression. Both are read, so a bad
    figure in either is an error naming its file and key."""
    recorded_thresholds(after)
    cfg = cfg or settings.Settings(thresholds=recorded_thresholds(before))
    cmp = Comparison(before, after)
    if before.host != after.host:
        msg = f"{after.path}: host: {after.host!r}, but {before.path} is from {before.host!r}"
        if not allow_other_host:
            raise SnapshotError(msg + " (a baseline compares one node with itself; --allow-other-host compares two nodes)")
        cmp.warnings.append(msg)
    if bool(before.doc.get("quick")) != bool(after.doc.get("quick")):
        cmp.warnings.append("one snapshot is --quick and the other is not: fewer samples, a wider noise band")
    mb, ma = metrics(before), metrics(after)
    for key in list(mb) + [k for k in ma if k not in mb]:
        b, a = mb.get(key), ma.get(key)
        m = a or b
        thr = cfg.thresholds.get(m.kind, settings.Threshold())
        vb, va = (b.shown() if b else None), (a.shown() if a else None)
        row = Row(key, m.kind, m.unit, m.better, vb, va, None, None, "", None, thr.describe(), False,
                  len(b.samples) if b else 0, len(a.samples) if a else 0)
        if vb is None and va is None:
            row.verdict, row.reason = "not measured", (a and a.error) or (b and b.error) or ""
        elif a is None:
            row.verdict, row.reason = "only before", "not in the after snapshot (another profile?)"
        elif va is None:
            # measured before, failed after (a peer now unreachable): as bad as a regression gets
            row.verdict, row.reason = "failed after", a.error or "no samples"
            row.regressed = True
        elif vb is None:
            row.verdict, row.reason = "new", (b.error if b and b.error else "not in the before snapshot")
        else:
            row.change = va - vb
            row.change_pct = (va - vb) / abs(vb) * 100 if vb else None
            row.verdict, row.noise = stats.verdict(b.samples or [vb], a.samples or [va], m.better, (vb, va))
            row.regressed = row.verdict == stats.WORSE and thr.passed(vb, va)
        cmp.rows.append(row)
    from hkgpu_tune.baseline.node import changes
    nb, na = before.doc.get("node"), after.doc.get("node")
    if isinstance(nb, dict) and isinstance(na, dict):
        cmp.node_changes = changes(nb, na)
    else:
        cmp.warnings.append("no node record in " + " and ".join(s.path for s, n in ((before, nb), (after, na))
                                                               if not isinstance(n, dict))
                            + ": settings and versions not compared (captured by an older hkgpu-tune)")
    bb, ba = before.doc.get("boot_id"), after.doc.get("boot_id")
    if bb and ba and bb != ba:
        for row in cmp.rows:
            if row.kind == "kernel_events":
                row.reason = "rebooted in between: each count is since its own boot"
    return cmp


def _fmt(v, unit="") -> str:
    if v is None:
        return "-"
    if unit == "ratio":
        return f"{v:.4f}"
    return f"{v:.4g}"


def row_cells(r: Row) -> list[str]:
    """metric, before, after, change, noise, verdict as text."""
    pct = "-" if r.change_pct is None else f"{r.change_pct:+.1f}%"
    return [f"{r.key} ({r.unit})", _fmt(r.before, r.unit), _fmt(r.after, r.unit), pct,
            "-" if r.noise is None else f"±{r.noise:.3g}", r.verdict + (" REGRESSED" if r.regressed else "")]


def table_rows(cmp: Comparison) -> list[list[str]]:
    return [row_cells(r) for r in cmp.rows]


COLUMNS = ["metric", "before", "after", "change", "noise", "verdict"]


def summary_line(cmp: Comparison) -> str:
    n = len(cmp.regressions)
    return f"{len(cmp.rows)} metric(s), {n} regression(s)" + (": " + ", ".join(r.key for r in cmp.regressions) if n else "")


def notes(cmp: Comparison) -> list[str]:
    """The lines under the table: why a row has no figure, and the thresholds used."""
    out = [f"{r.key}: {r.reason}" for r in cmp.rows if r.reason]
    kinds = {r.kind: r.threshold for r in cmp.rows}
    out.append("regression thresholds (worse beyond the noise and past): "
               + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    return out


def print_table(cmp: Comparison, console, title: str | None = None) -> None:
    from rich.table import Table
    from rich.text import Text
    colours = {"better": "green", "worse": "yellow", "within noise": "", "failed after": "red"}
    t = Table(title=Text(title or f"baseline: {cmp.before.host} {cmp.before.time} -> {cmp.after.time}"),
              title_justify="left")
    for c in COLUMNS:
        t.add_column(c, overflow="fold", no_wrap=c in ("before", "after", "change", "noise"),
                     min_width=20 if c == "metric" else None)
    for r, cells in zip(cmp.rows, table_rows(cmp)):
        style = "red" if r.regressed else colours.get(r.verdict, "")
        t.add_row(*[Text(c, style=style if COLUMNS[i] == "verdict" else "") for i, c in enumerate(cells)])
    console.print(t)
    for line in notes(cmp):
        console.print(Text(line))
    for c in cmp.node_changes:
        console.print(Text(f"node changed: {c['what']}: {c['before']!r} -> {c['after']!r}"))
    console.print(Text(summary_line(cmp)))
