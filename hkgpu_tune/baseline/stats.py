"""Small statistics for baseline samples: summaries, chunked ping statistics and the verdict.

The verdict of a metric compares the means of its before and after samples against a noise band:
the 95% confidence half-width of the difference of two means (Welch's t, a table of Student's t
for small sample counts). A change inside the band is "within noise"; outside it, "better" or
"worse" by the metric's direction. A metric regresses (compare exits 2) only when it is "worse"
AND the change passes its threshold (percent and/or absolute, see settings.THRESHOLDS).

>>> verdict([10.0, 10.2, 9.9], [10.1, 9.8, 10.0], "higher")[0]
'within noise'
>>> verdict([10.0, 10.2, 9.9], [5.0, 5.1, 4.9], "higher")[0]
'worse'
"""
from __future__ import annotations

import math
import statistics

# two-sided 95% critical values of Student's t, degrees of freedom 1..30 (then the normal 1.96)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042)

BETTER, WORSE, NOISE = "better", "worse", "within noise"


def t95(df: float) -> float:
    if df < 1:
        return _T95[0]
    i = int(math.floor(df))
    return _T95[i - 1] if i <= len(_T95) else 1.96


def summary(xs: list[float]) -> dict:
    """n, mean, sd (sample), min, max of a list (sd 0 for one sample; all None for none)."""
    if not xs:
        return {"n": 0, "mean": None, "sd": None, "min": None, "max": None}
    return {"n": len(xs), "mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs)}


def chunks(xs: list, k: int = 5, min_size: int = 5) -> list[list]:
    """xs split into at most k consecutive chunks of at least min_size items (the remainder
    joins the last chunk); fewer items than 2*min_size give one chunk."""
    k = max(1, min(k, len(xs) // min_size))
    size = len(xs) // k if k else 0
    if k <= 1:
        return [list(xs)] if xs else []
    return [list(xs[i * size:(i + 1) * size]) for i in range(k - 1)] + [list(xs[(k - 1) * size:])]


def noise_band(before: list[float], after: list[float]) -> float | None:
    """Half-width of the 95% interval of mean(after) - mean(before) (Welch). None when neither side
    has a spread (one sample each): such a metric is judged by its threshold alone."""
    nb, na = len(before), len(after)
    if nb == 0 or na == 0 or (nb < 2 and na < 2):
        return None
    vb = statistics.variance(before) if nb > 1 else None
    va = statistics.variance(after) if na > 1 else None
    # one side with a single sample borrows the other side's variance
    vb = va if vb is None else vb
    va = vb if va is None else va
    sb, sa = vb / nb, va / na
    se2 = sb + sa
    if se2 == 0:
        return 0.0
    dfd = (sb * sb / (nb - 1) if nb > 1 else 0) + (sa * sa / (na - 1) if na > 1 else 0)
    df = se2 * se2 / dfd if dfd else max(nb, na) - 1
    return t95(df) * math.sqrt(se2)


def verdict(before: list[float], after: list[float], better: str,
            values: tuple[float, float] | None = None) -> tuple[str, float | None]:
    """(better | worse | within noise, noise band). better is "higher" or "lower". values: the
    (before, after) figures shown, when they are not the samples' means (a p50 over all RTTs)."""
    mb, ma = values if values is not None else (statistics.fmean(before), statistics.fmean(after))
    band = noise_band(before, after)
    diff = ma - mb
    if diff == 0 or (band is not None and abs(diff) <= band):
        return NOISE, band
    good = diff > 0 if better == "higher" else diff < 0
    return (BETTER if good else WORSE), band
