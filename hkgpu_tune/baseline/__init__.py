"""Baselines: a dated snapshot of a node's network, kernel, GPU and serving performance
(`hkgpu-tune baseline capture`), and a before/after comparison judged by each metric's spread
(`hkgpu-tune baseline compare`).

>>> snap = capture.capture(load_profile("hk-inference"), quick=True)     # doctest: +SKIP
>>> cmp = compare.compare(before, after)                                 # doctest: +SKIP
>>> [m.key for m in cmp.regressions]                                     # doctest: +SKIP
['throughput 198.18.0.2 send']
"""
FORMAT = 1            # the snapshot layout; compare refuses another
COMMAND = "baseline capture"
