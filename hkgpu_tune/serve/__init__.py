"""The Triton inference service: model repository, engine build, launch, readiness and latency gate.

By role, each a subpackage: schema (the profile section), repository (model files and engines),
running (the server's forms, start and stop, its client) and measuring (gate, load, sweep).

>>> from hkgpu_tune import load_profile
>>> t = load_profile("profile.yaml").section("triton")                     # doctest: +SKIP
>>> from hkgpu_tune.serve.repository import render
>>> from hkgpu_tune.serve.running import launch
>>> from hkgpu_tune.serve.measuring import gate
>>> render.write_repository(t)                                             # doctest: +SKIP
>>> srv = launch.start(t); launch.wait_ready(t)                            # doctest: +SKIP
>>> gate.run_gate(t).passed                                                # doctest: +SKIP
True
"""
