"""The sweep's output: the table a person reads and the chart (throughput against p99)."""
from __future__ import annotations

from hkgpu_tune.core.errors import HkError


def table(rep) -> str:
    rows = [("config", "img/s", "p99 ms", "p50 ms", "conc", "batch", "note")]
    for p in rep.points:
        b = p.best
        sv = (b or {}).get("server", {})
        note = (("BEST" + {True: ", confirmed", False: ", NOT confirmed"}.get(p.confirmed, "")) if p is rep.best
                else (p.error[:60] if p.error else ("" if b else "over SLO")))
        rows.append((p.label, f"{b['img_s']:.0f}" if b else "-", f"{b['p99_ms']:.2f}" if b else "-",
                     f"{b['p50_ms']:.2f}" if b else "-", str(b["concurrency"]) if b else "-",
                     f"{sv.get('avg_batch', '-')}" if b else "-", note))
    for lb in rep.skipped:
        rows.append((lb, "-", "-", "-", "-", "-", "not measured (budget)"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows)


def chart(rep, path: str) -> str:
    """Throughput against p99, one point per measured load, the SLO line, the chosen config marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    for p in rep.points:
        if not p.loads:
            continue
        xs = [r["p99_ms"] for r in p.loads]
        ys = [r["img_s"] for r in p.loads]
        ax.plot(xs, ys, marker="o", ms=4, lw=1, alpha=0.8, label=p.label)
    ax.axvline(rep.slo_ms, color="red", ls="--", lw=1.2, label=f"SLO p99 {rep.slo_ms:g} ms")
    if rep.best:
        b = rep.best.best
        ax.scatter([b["p99_ms"]], [b["img_s"]], s=220, facecolors="none", edgecolors="black", lw=2,
                   zorder=5, label=f"chosen: {rep.best.label}")
    ax.set_xlabel("client p99 latency (ms)")
    ax.set_ylabel("throughput (img/s)")
    ax.set_xscale("log")
    ax.set_title(f"triton sweep: {rep.model} ({rep.date})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as e:
        raise HkError(f"{path}: cannot write the chart: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path
