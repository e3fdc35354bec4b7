"""The compare chart: one panel per group that has data, stacked: throughput bars, RTT p50 bars,
RTT distributions (box plots) before/after, engine img/s bars. matplotlib is imported here only.

Every panel has the face colour FACE on a white figure (and no grid lines), so a reader of the PNG
can find and count the panels.
"""
from __future__ import annotations

import io

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import atomic_write

FACE = "#eef2f7"
BEFORE, AFTER = "#4c72b0", "#dd8452"
DPI = 100
WIDTH_IN, PANEL_IN = 11.0, 3.4


def panels(cmp) -> list[str]:
    """The panels the chart of this comparison has, in order."""
    kinds = {r.kind for r in cmp.rows if r.before is not None or r.after is not None}
    out = []
    if "throughput" in kinds:
        out.append("throughput")
    if "rtt_p50" in kinds:
        out += ["rtt", "rtt distribution"]
    if "engine_rate" in kinds:
        out.append("engine")
    return out


def _bars(ax, rows, ylabel, title, log=False):
    import numpy as np
    x = np.arange(len(rows))
    w = 0.38
    for off, side, colour, label in ((-w / 2, "before", BEFORE, "before"), (w / 2, "after", AFTER, "after")):
        vals = [getattr(r, side) or 0 for r in rows]
        ax.bar(x + off, vals, w, color=colour, label=label)
    for i, r in enumerate(rows):
        if r.regressed:
            ax.annotate("regressed", (i, max(r.before or 0, r.after or 0)), ha="center", va="bottom",
                        color="red", fontsize=8)
    ax.set_xticks(x, [r.key.split(" ", 1)[1] for r in rows], rotation=15, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7, loc="upper right")


def _rtt_lists(snap) -> dict[str, list]:
    out = {}
    for lrow in snap.doc.get("latency") or []:
        if isinstance(lrow, dict) and isinstance(lrow.get("rtts_ms"), list) and lrow["rtts_ms"]:
            out[f"{lrow.get('kind')} {lrow.get('peer')}"] = [x for x in lrow["rtts_ms"] if isinstance(x, (int, float))]
    return out


def chart(cmp, path: str) -> dict:
    """Write the PNG; returns {"path", "panels", "width_px", "height_px"} (what was drawn)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = panels(cmp)
    if not names:
        raise HkError("nothing to chart: neither snapshot has throughput, RTT or engine figures")
    fig, axes = plt.subplots(len(names), 1, figsize=(WIDTH_IN, PANEL_IN * len(names)), dpi=DPI, squeeze=False)
    fig.patch.set_facecolor("white")
    by_kind = lambda k: [r for r in cmp.rows if r.kind == k and (r.before is not None or r.after is not None)]
    for ax, name in zip(axes[:, 0], names):
        ax.set_facecolor(FACE)
        ax.grid(False)
        if name == "throughput":
            _bars(ax, by_kind("throughput"), "Gbit/s", "iperf3 throughput (mean of runs)")
        elif name == "rtt":
            _bars(ax, by_kind("rtt_p50"), "ms (log)", "RTT p50", log=True)
        elif name == "engine":
            _bars(ax, by_kind("engine_rate"), "img/s", "engine benchmark")
        else:
            b, a = _rtt_lists(cmp.before), _rtt_lists(cmp.after)
            keys = [k for k in dict.fromkeys(list(b) + list(a))]
            data, pos, colours = [], [], []
            for i, k in enumerate(keys):
                for off, side, colour in ((-0.2, b, BEFORE), (0.2, a, AFTER)):
                    if side.get(k):
                        data.append(side[k])
                        pos.append(i + off)
                        colours.append(colour)
            bp = ax.boxplot(data, positions=pos, widths=0.35, patch_artist=True, showfliers=True,
                            flierprops={"markersize": 2})
            for patch, colour in zip(bp["boxes"], colours):
                patch.set_facecolor(colour)
            ax.set_xticks(range(len(keys)), keys, rotation=15, ha="right", fontsize=7)
            ax.set_yscale("log")
            ax.set_ylabel("ms (log)")
            ax.set_title("RTT distribution (before blue, after orange)", fontsize=10)
    fig.suptitle(f"baseline {cmp.before.host}: {cmp.before.time} -> {cmp.after.time}", fontsize=11)
    fig.tight_layout()
    size = fig.get_size_inches() * fig.dpi
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=DPI, facecolor="white",
                    metadata={"Description": "panels: " + ", ".join(names)})
    finally:
        plt.close(fig)
    atomic_write(path, buf.getvalue(), mode=0o644)
    return {"path": path, "panels": names, "width_px": int(round(size[0])), "height_px": int(round(size[1]))}
