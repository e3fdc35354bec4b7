"""The Triton inference service: model repository, engine build, launch, readiness and latency gate.

>>> from hkgpu_tune import load_profile
>>> t = load_profile("profile.yaml").section("triton")                     # doctest: +SKIP
>>> from hkgpu_tune.serve import render, launch, gate
>>> render.write_repository(t)                                             # doctest: +SKIP
>>> srv = launch.start(t); launch.wait_ready(t)                            # doctest: +SKIP
>>> gate.run_gate(t).passed                                                # doctest: +SKIP
True
"""
