"""The `triton:` section as the profile reader takes it: one service, or with `services:` several
(each item names its unit and the keys of the section it changes; serve.schema.config parses each)."""
from __future__ import annotations

import os

from hkgpu_tune.serve.schema.config import TOP_KEYS, UNIT_RE, Services, Triton, parse_one


def parse_profile(node) -> "Triton | Services":
    """A key a service names replaces the section's whole (a list too); units, ports, run and
    repository directories are each one service's, or the profile is refused at the line."""
    m = node.mapping((*TOP_KEYS, "services"))
    base = os.path.dirname(os.path.abspath(node.file)) if node.file and not node.file.startswith("<") else os.getcwd()
    if "services" not in m:
        if "models" not in m:
            raise node.error("missing required key 'models'")
        return parse_one(node, m, base)
    snode = m.pop("services")
    items = snode.items()
    if not items:
        raise snode.error("expected at least one service")
    out, seen = [], {}
    for item in items:
        own = item.mapping(TOP_KEYS, required=("unit",))
        merged = {**m, **own}
        if "models" not in merged:
            raise item.error("missing required key 'models' (here or in the triton section)")
        unit = own["unit"].string(UNIT_RE, "a systemd unit name")
        t = parse_one(item, merged, base, {"model_repository": f"/var/lib/hkgpu-triton/{unit}/models",
                                           "run_dir": f"/run/hkgpu-tune/triton/{unit}"})
        # the copies apply keeps (redeploy) and the backends go beside the repository: its parent is one service's
        parent = os.path.dirname(os.path.normpath(t.model_repository))
        for key, what, value in (("unit", "unit", t.unit), ("run_dir", "run_dir", t.run_dir),
                                 ("model_repository", "model_repository", t.model_repository),
                                 ("model_repository", "the directory above model_repository", parent),
                                 ("http", "port", t.http.port), ("grpc", "port", t.grpc.port),
                                 ("metrics", "port", t.metrics.port)):
            if (what, value) in seen:
                where = merged.get(key) or item   # a default directory: the service's own line
                shared = key in ("run_dir", "model_repository") and key not in own
                raise where.error(f"{what} {value} is also that of {seen[(what, value)]}: each service needs its "
                                  f"own" + (" (leave it out of the triton section: each service then gets one "
                                            "under its unit's name)" if shared else ""))
            seen[(what, value)] = f"service {t.unit} (line {item.line})"
        out.append(t)
    return Services(out)
