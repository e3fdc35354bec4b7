"""The one Prometheus text-format renderer (exposition format 0.0.4): families of samples to lines,
label values escaped as the format says (backslash, double quote and line feed, in that order).
`hkgpu-tune verify --prometheus`, `export` and every collector write through it.

>>> render([Family("x_up", "gauge", "Up.", [({"dev": 'a"b'}, 1)])])
['# HELP x_up Up.', '# TYPE x_up gauge', 'x_up{dev="a\\\\"b"} 1']
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Family:
    """One metric family: name, "gauge"|"counter"|"summary", help, [(labels, value)].
    A label "__name__" names the sample itself (a summary's NAME_sum and NAME_count)."""

    name: str
    kind: str
    help: str
    samples: list = field(default_factory=list)


def label(v) -> str:
    """A label value, escaped: backslash first, then double quote and line feed."""
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def fmt(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    v = float(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v) if v != int(v) or abs(v) >= 1e15 else str(int(v))


def render(families, keep_empty: bool = False) -> list[str]:
    """Families -> text-format lines; a family without samples is left out (unless keep_empty:
    then its HELP and TYPE stay); a sample whose value is None is left out (NVML did not have it)."""
    lines = []
    for f in families:
        samples = [(lab, v) for lab, v in f.samples if v is not None]
        if not samples and not keep_empty:
            continue
        lines.append(f"# HELP {f.name} {f.help}")
        lines.append(f"# TYPE {f.name} {f.kind}")
        for lab, v in samples:
            name = lab.get("__name__", f.name)
            lab = {k: x for k, x in lab.items() if k != "__name__"}
            if lab:
                inner = ",".join(f'{k}="{label(x)}"' for k, x in lab.items())
                lines.append(f"{name}{{{inner}}} {fmt(v)}")
            else:
                lines.append(f"{name} {fmt(v)}")
    return lines
