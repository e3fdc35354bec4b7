"""The container form (a container runtime's `run` of an NGC-style image), and its image, read by
running it: the Triton backends it holds, its trtexec and TensorRT version, whether its Python has torch. A plan is built by the image's trtexec (the
TensorRT that loads it), and a model whose backend the image lacks is refused before the start.

>>> facts(t)                                                  # doctest: +SKIP
{'backends': ['onnxruntime', 'python', 'pytorch', 'tensorrt'], 'tensorrt': '100300', 'torch': None}
"""
from __future__ import annotations

import os
import re
import shutil

from hkgpu_tune.backends.command import Command
from hkgpu_tune.core import unitfile
from hkgpu_tune.core.errors import HkError, UnsupportedError
from hkgpu_tune.serve.running import forms, records
from hkgpu_tune.serve.running.form_base import Form, register

BACKENDS_DIR = "/opt/tritonserver/backends"   # where NVIDIA's tritonserver images keep them
# a model's backend or platform -> the backend directory Triton loads it from
NEEDS = {"tensorrt_plan": "tensorrt", "tensorrt": "tensorrt", "onnxruntime_onnx": "onnxruntime",
         "onnxruntime": "onnxruntime", "pytorch_libtorch": "pytorch", "pytorch": "pytorch",
         "tensorflow_savedmodel": "tensorflow", "openvino": "openvino", "python": "python"}
_FACTS: dict[tuple[str, str], dict] = {}


def version_from_banner(text: str) -> str:
    """'100300' from trtexec's banner '&&&& RUNNING TensorRT.trtexec [TensorRT v100300] # ...'."""
    m = re.search(r"TensorRT v(\d+)", text)
    return m.group(1) if m else "unknown"


def _run(t, entrypoint: str, args: list[str], cmd: Command, timeout: float = 300):
    if shutil.which(t.runtime) is None and cmd.which(t.runtime) is None:
        raise UnsupportedError(f"container runtime {t.runtime} not found")
    # no network: a probe needs none, and a node's bridge network (netavark, iptables) may be absent
    return cmd.run([t.runtime, "run", "--rm", "--network", "none", "--entrypoint", entrypoint, t.image, *args],
                   timeout=timeout)


def facts(t, cmd: Command | None = None) -> dict:
    """What the image holds (once per process and image)."""
    key = (t.runtime, t.image)
    if key in _FACTS:
        return _FACTS[key]
    cmd = cmd or Command()
    r = _run(t, "ls", [BACKENDS_DIR], cmd)
    if r.rc != 0:
        raise HkError(f"triton: cannot list {BACKENDS_DIR} in image {t.image}: "
                      f"{(r.err or r.out).strip().splitlines()[-1:] or ['exit ' + str(r.rc)]}")
    out = {"backends": sorted(r.out.split())}
    r = _run(t, "trtexec", ["--help"], cmd)
    out["tensorrt"] = version_from_banner(r.out + r.err) if r.rc == 0 else None
    r = _run(t, "python3", ["-c", "import torch; print(torch.__version__)"], cmd)
    out["torch"] = r.out.strip().splitlines()[-1] if r.rc == 0 and r.out.strip() else None
    _FACTS[key] = out
    return out


def forget() -> None:
    """Read images again (after a pull)."""
    _FACTS.clear()


def image_trtexec(t, build, plan: str, cmd: Command | None = None):
    """trtexec in the serving image, with the ONNX, calibration and plan directories mounted at the
    same paths and the service's GPUs: (argv up to trtexec's flags, TensorRT version, where)."""
    cmd = cmd or Command()
    f = facts(t, cmd)
    if not f["tensorrt"]:
        raise UnsupportedError(f"image {t.image} has no trtexec: the plan cannot be built with the TensorRT "
                               f"that serves it")
    argv = [t.runtime, "run", "--rm", "--network", "none"]
    devs = forms.visible_gpus(t, host=True)
    if devs:
        argv += ["--gpus", f"device={devs}" if "," not in devs else f'"device={devs}"']
    ro = [os.path.dirname(os.path.abspath(p)) for p in (build.onnx, build.calibration_cache) if p]
    rw = os.path.dirname(os.path.abspath(plan))
    for d in dict.fromkeys(ro):
        if d != rw:
            argv += ["--volume", f"{d}:{d}:ro"]
    argv += ["--volume", f"{rw}:{rw}", "--entrypoint", "trtexec", t.image]
    return argv, f["tensorrt"], f"image {t.image}"


def needs(model) -> list[str]:
    """What a model needs of the image: its backend, and torch for the torch engine."""
    out = [NEEDS.get(model.backend, model.backend)]
    if model.engine == "torch":
        out.append("torch")
    return out


def check_image(t, cmd: Command | None = None) -> None:
    """Each model's backend (and torch for the torch engine) in the image, before the start: one
    line naming the model and what is missing."""
    f = facts(t, cmd)
    for m in t.models:
        for need in needs(m):
            if need == "torch":
                if not f["torch"]:
                    raise HkError(f"triton: model {m.name} (the torch engine) needs torch in image {t.image}, "
                                  f"whose Python has none (use an image with torch, or a TensorRT plan)")
            elif need not in f["backends"]:
                raise HkError(f"triton: model {m.name} needs the {need} backend, which image {t.image} lacks "
                              f"(it has: {', '.join(f['backends']) or 'none'})")


@register
class Container(Form):
    """A container runtime's `run` (forms.container_argv): the runtime needs root; the server inside
    runs as the image's or the profile's user (--user)."""
    name = "container"

    def argv(self, t, place, backends=None, resolve=True):
        return forms.container_argv(t, place, backends=backends, resolve=resolve)

    def check(self, t, backends):
        check_image(t, backends.cmd)   # one line naming the model, before anything runs

    def program(self, t, argv):
        try:
            argv[0] = records.runtime_path(t.runtime)
        except HkError:
            raise UnsupportedError(f"triton: container runtime {t.runtime} not found") from None
        return argv

    def recognise(self, argv):
        return os.path.basename(argv[0]) in ("docker", "podman") and argv[1:2] == ["run"]

    def trtexec(self, t, build, plan, cmd=None):
        return image_trtexec(t, build, plan, cmd)   # the plan is built by the TensorRT that loads it

    def trtexec_missing(self, t, cmd=None):
        try:
            return "" if facts(t, cmd)["tensorrt"] else f"image {t.image} has no trtexec"
        except HkError as e:
            return str(e)

    def check_saved(self, argv):
        # re-read against the renderer's own shape: no option it never writes
        from hkgpu_tune.serve.schema.shapes import check_container_argv
        check_container_argv(argv)

    def unit_service(self, t, argv, pos):
        rt = records.runtime_path(t.runtime, required=False)
        out = ["ExecStartPre=-" + unitfile.exec_line([rt, "rm", "--force", t.unit])]
        start = unitfile.exec_line([rt] + argv[1:], "triton container")
        if pos:   # systemd expands ${CUDA_VISIBLE_DEVICES} from the file mig-env wrote
            from hkgpu_tune.serve.schema.devices import start_lines
            out += start_lines(pos, t.unit)
            start = start.replace(unitfile.word(forms.UNIT_MIG_DEVICE), forms.UNIT_MIG_DEVICE)
        out.append("ExecStart=" + start)
        out.append("ExecStop=" + unitfile.exec_line(
            [rt, "stop", "--time", str(int(t.gate.stop_timeout_s) + forms.STOP_GRACE_S), t.unit]))
        # systemd ends the foreground `run` once ExecStop returns, before its --rm has removed the
        # container: an exited container was left behind (seen with podman on the VM test node)
        out.append("ExecStopPost=-" + unitfile.exec_line([rt, "rm", "--force", t.unit]))
        return out + ["NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectHome=yes"]

    def main_pid(self, t, pid, backends):
        # the server runs under the runtime, not under its client
        r = forms._b(backends).cmd.run([t.runtime, "inspect", "--format", "{{.State.Pid}}", t.unit])
        return int(r.out.strip()) if r.rc == 0 and r.out.strip().isdigit() else pid

    def before_signal(self, t, timeout):
        Command().run([t.runtime, "stop", "--time", str(int(timeout) + forms.STOP_GRACE_S), t.unit],
                      timeout=timeout + 2 * forms.STOP_GRACE_S)
