"""triton.connections and keep-warm reach the nodes through the roles (issue 33, item 6):
hkgpu_triton_connections lands in the rendered triton section, and hkgpu_triton_keep_warm
renders one keep-warm unit per service, bound to it, running the library's keepwarm module."""
import os
import shlex

import jinja2
import yaml

from hkgpu_tune.core.profile import parse_profile_text
from tests.helpers import REPO, role_filters
from tests.unit.test_role_examples import CASES, defaults, resolve, role_vars

ROLE = os.path.join(REPO, "roles", "hkgpu_triton")
MODELS = next(doc for p, _, doc in CASES if p.endswith("hkgpu_triton/defaults/main.yml") and "hkgpu_triton_models" in doc)


def section(models=None, **over):
    ctx = resolve({**defaults(), **role_vars("hkgpu_triton"), "hkgpu_triton_models": models or MODELS["hkgpu_triton_models"],
                   **over, "ansible_run_tags": ["all"]})
    return ctx["__hkgpu_triton_profile"]["triton"]


def test_connections_reach_the_triton_section(tmp_path):
    (tmp_path / "m.py").write_text("")
    model = {"name": "m", "backend": "python", "model_file": str(tmp_path / "m.py"), "max_batch_size": 8,
             "inputs": [{"name": "I", "data_type": "FP32", "dims": [1]}],
             "outputs": [{"name": "O", "data_type": "FP32", "dims": [1]}]}
    s = section([model], hkgpu_triton_connections={"grpc_keepalive_time_ms": 30000, "http_thread_count": 16})
    prof = parse_profile_text(yaml.safe_dump({"name": "t", "triton": s}, sort_keys=False), "rendered")
    c = prof.section("triton").connections
    assert c.grpc_keepalive_time_ms == 30000 and c.http_thread_count == 16


def test_connections_default_is_the_librarys():
    assert section()["connections"] == {}


def render_unit(item, **over):
    # Ansible's own variables that role defaults may name (hkgpu_pull_name: the host's name)
    v = {**defaults(), "ansible_managed": "Ansible managed", "inventory_hostname": "gpu-node-1", "item": item, **over}
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(role_filters())
    for _ in range(3):
        v = {k: env.from_string(x).render(v) if isinstance(x, str) and "{{" in x else x for k, x in v.items()}
    with open(os.path.join(ROLE, "templates", "hkgpu-keepwarm.service.j2")) as f:
        return env.from_string(f.read()).render(v)


def keys(unit, key):
    return [ln.split("=", 1)[1] for ln in unit.splitlines() if ln.startswith(key + "=")]


def test_keep_warm_unit_runs_the_keepwarm_module_bound_to_its_service():
    u = render_unit("hkgpu-triton", hkgpu_triton_keep_warm={"idle_s": 60, "period_s": 10})
    (cmd,) = keys(u, "ExecStart")
    argv = shlex.split(cmd)
    assert argv[:3] == ["/opt/hkgpu-tune/bin/python", "-m", "hkgpu_tune.serve.running.keepwarm"]
    assert argv[argv.index("--idle-s") + 1] == "60" and argv[argv.index("--period-s") + 1] == "10"
    assert argv[argv.index("--profile") + 1] == "/etc/hkgpu-tune/node.yaml" and "--unit" not in argv
    assert keys(u, "BindsTo") == ["hkgpu-triton.service"] and keys(u, "Restart") == ["always"]
    u = render_unit("hkgpu-triton-gpu1", hkgpu_triton_keep_warm={"idle_s": 30, "period_s": 5},
                    hkgpu_triton_services=[{"unit": "hkgpu-triton-gpu1", "gpu": 1}])
    argv = shlex.split(keys(u, "ExecStart")[0])
    assert argv[argv.index("--unit") + 1] == "hkgpu-triton-gpu1"


def test_one_keep_warm_unit_per_service():
    ctx = resolve({**defaults(), **role_vars("hkgpu_triton"), **MODELS,
                   "hkgpu_triton_services": [{"unit": "a", "gpu": 0}, {"unit": "b", "gpu": 1}]})
    assert ctx["__hkgpu_triton_keepwarm"] == ["a", "b"]
    assert resolve({**defaults(), **role_vars("hkgpu_triton")})["__hkgpu_triton_keepwarm"] == ["hkgpu-triton"]
