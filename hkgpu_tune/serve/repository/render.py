"""The model repository: config.pbtxt checked against Triton's own schema, and the model files.

Layout: REPO/NAME/config.pbtxt and REPO/NAME/VERSION/model.{py,onnx,plan,...}.

>>> text = render_config(model)            # doctest: +SKIP
>>> print(text.splitlines()[0])            # doctest: +SKIP
name: "doubler"
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.core.fsutil import atomic_write, copy_pinned, ensure_trusted_dir
from hkgpu_tune.serve.schema.config import model_filename



def _schema():
    try:
        from google.protobuf import json_format, text_format
        from tritonclient.grpc import model_config_pb2
    except (ImportError, RuntimeError) as e:  # tritonclient without its grpc extras raises RuntimeError
        raise HkError(f"triton: checking config.pbtxt needs tritonclient[grpc] and protobuf "
                      f"(pip install 'hkgpu-tune[triton]'): {e}") from None
    return model_config_pb2, json_format, text_format


def _reason(exc) -> str:
    """protobuf's nested 'Failed to parse X field: ...' down to the innermost message."""
    msg = str(exc).strip().rstrip(".")
    msg = re.sub(r"Failed to parse \w+ field: ", "", msg)
    msg = msg.split(" Available Fields")[0].strip()
    return msg + ("" if msg.endswith(".") else "")


def _fails(mc, json_format, data) -> Exception | None:
    try:
        json_format.ParseDict(data, mc.ModelConfig())
    except json_format.ParseError as e:
        return e
    return None


def _locate(mc, json_format, value, wrap, path, nodes):
    """The deepest (key path, node) whose value alone still fails the schema."""
    if isinstance(value, dict):
        for k, v in value.items():
            err = _fails(mc, json_format, wrap({k: v}))
            if err and f'no field named "{k}"' in str(err):
                return path + (k,)  # the key itself is wrong
            if err:
                return _locate(mc, json_format, v, lambda x, k=k: wrap({k: x}), path + (k,), nodes)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if _fails(mc, json_format, wrap([v])):
                return _locate(mc, json_format, v, lambda x: wrap([x]), path + (i,), nodes)
    return path


def _node_for(path, nodes, item):
    """The profile node of a config path: the one recorded for its first key, walked down."""
    node = nodes.get(path[:1], item)
    for p in path[1:]:
        try:
            if isinstance(p, int):
                node = node.items()[p]
            else:
                node = node.mapping()[p]
        except Exception:  # noqa: BLE001 - shape errors: stop at the deepest node we have
            break
    return node


def check_config(config: dict, nodes: dict, item) -> dict:
    """Parse the ModelConfig with Triton's schema; a bad field is a ProfileError at its key path.

    Returns the config normalised by the schema (field names as in config.pbtxt, enums by name)."""
    mc, json_format, text_format = _schema()
    err = _fails(mc, json_format, config)
    if err:
        path = _locate(mc, json_format, config, lambda x: x, (), nodes)
        raise _node_for(path, nodes, item).error(_reason(err))
    msg = json_format.ParseDict(config, mc.ModelConfig())
    # the text form is what Triton reads: render it and parse it back with the same schema
    text = text_format.MessageToString(msg)
    back = text_format.Parse(text, mc.ModelConfig())
    if back != msg:
        raise item.error("config.pbtxt does not survive a text round trip")
    _semantics(msg, nodes, item)
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def _semantics(msg, nodes, item) -> None:
    """What the schema allows but Triton refuses to load."""
    mbs = msg.max_batch_size
    if msg.HasField("dynamic_batching"):
        if mbs == 0:
            raise _node_for(("dynamic_batching",), nodes, item).error(
                "dynamic batching needs max_batch_size > 0")
        for i, b in enumerate(msg.dynamic_batching.preferred_batch_size):
            if b > mbs:
                raise _node_for(("dynamic_batching", "preferred_batch_size", i), nodes, item).error(
                    f"preferred batch size {b} is above max_batch_size {mbs}")
    for key in ("input", "output"):
        seen = set()
        for i, t in enumerate(getattr(msg, key)):
            n = _node_for((key, i), nodes, item)
            if not t.name:
                raise n.error("needs a name")
            if t.name in seen:
                raise n.error(f"{key} {t.name!r} is listed twice")
            seen.add(t.name)
            if t.data_type == 0:
                raise n.error("needs a data_type (FP32, FP16, INT64, BYTES, ...)")
            if not t.dims and not t.HasField("reshape"):
                raise n.error("needs dims (without the batch dimension)")
            if any(d < -1 or d == 0 for d in t.dims):
                raise _node_for((key, i, "dims"), nodes, item).error(
                    f"dims must be positive or -1 (variable), got {list(t.dims)}")
    if not msg.input:
        raise item.error("a model needs at least one input ('inputs')")


def render_config(model) -> str:
    """config.pbtxt text of a profile model (the schema's own printer)."""
    mc, json_format, text_format = _schema()
    msg = json_format.ParseDict(model.config, mc.ModelConfig())
    return text_format.MessageToString(msg)


def parse_config(text: str) -> dict:
    """config.pbtxt text -> dict (for checks and tests)."""
    mc, json_format, text_format = _schema()
    try:
        msg = text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as e:
        raise HkError(f"config.pbtxt: {e}") from None
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


# ---------------------------------------------------------------- comparing with the served config
def flat(d, prefix="") -> dict[str, object]:
    """{'input': [{'dims': ['4']}]} -> {'input[0].dims': ['4']} (lists of scalars stay whole)."""
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        for i, v in enumerate(d):
            out.update(flat(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = d
    return out


def _norm(v):
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, bool):
        return v
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _get(d, path: str):
    cur = d
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            i = int(part[1:-1])
            if not isinstance(cur, list) or i >= len(cur):
                return None
            cur = cur[i]
        else:
            if not isinstance(cur, dict) or part not in cur:
                return None
            cur = cur[part]
    return cur


def config_diff(desired: dict, served: dict) -> list[tuple[str, object, object]]:
    """[(field path, served value, profile value)] for the fields the profile sets that differ."""
    out = []
    for path, want in flat(desired).items():
        got = _get(served, path)
        if got is None or _norm(got) != _norm(want):
            out.append((path, got, want))
    return out


# ---------------------------------------------------------------- writing the repository
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def _file_sha(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()[:12]
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def _atomic_write(path: str, data, mode=0o644) -> None:
    ensure_trusted_dir(os.path.dirname(path), "model directory")   # no planted link on the way
    atomic_write(path, data, mode)


def model_state(t, model, backends=None) -> dict:
    """current/desired fingerprints of one model's directory, and why they differ (for a built
    plan: its cache key and bindings, so that a stale plan is drift that apply rebuilds)."""
    d = os.path.join(t.model_repository, model.name)
    want_cfg = _sha(render_config(model).encode())
    have_cfg = _file_sha(os.path.join(d, "config.pbtxt"))
    fname = model_filename(model)
    have_file = _file_sha(os.path.join(d, str(model.version), fname))
    reasons, unsupported = [], None
    if model.model_file:
        want_file = _file_sha(model.model_file)
    else:  # a built plan: current while its cache key and bindings match
        want_file = have_file or "built"
        if model.build and model.engine == "tensorrt" and have_file is not None:
            from hkgpu_tune.serve.repository import tensorrt
            try:
                stale = tensorrt.plan_status(t, model, backends)
            except HkError as e:   # no trtexec (or image) to compute the key with: the bindings still
                stale, unsupported = tensorrt.check_plan(model, os.path.join(d, str(model.version), fname)), str(e)
            if stale:
                want_file = "rebuilt"
                reasons.append(f"{model.version}/{fname}: " + "; ".join(stale))
    if unsupported and want_file == "rebuilt":
        reasons[-1] += f" ({unsupported})"
    elif unsupported:   # never a silent ok: the bindings match, the key could not be computed
        note = f"{model.version}/{fname}: bindings match the config; cache key not checked ({unsupported})"
    if have_cfg is None:
        reasons.append("config.pbtxt absent")
    elif have_cfg != want_cfg:
        reasons.append("config.pbtxt differs from the profile")
    if have_file is None:
        reasons.append(f"{model.version}/{fname} absent")
    elif have_file != want_file and want_file != "rebuilt":
        reasons.append(f"{model.version}/{fname} differs from {model.model_file}")
    current = "absent" if have_cfg is None and have_file is None else f"{have_cfg or '-'}/{have_file or '-'}"
    out = {"current": current, "desired": f"{want_cfg}/{want_file}", "reason": "; ".join(reasons)}
    if unsupported and want_file != "rebuilt":
        out["note"] = note
    w = model.build.weights if model.build else None
    if w:   # the trained weights: the copy in the version directory against the sha256 the profile pins
        have_w = _file_sha(os.path.join(d, str(model.version), w.served_name))
        if have_w != w.sha256[:12]:
            reasons.append(f"{model.version}/{w.served_name} " + ("absent" if have_w is None else
                                                                  "is not the file build.weights pins"))
        out.update(current=f"{out['current']}/{have_w or '-'}", desired=f"{out['desired']}/{w.sha256[:12]}",
                   reason="; ".join(reasons))
    if model.backend == "hkbatch":   # its library, built from the source this package carries
        from hkgpu_tune.serve.repository import batch_backend
        ok, why = batch_backend.available()
        want_lib = batch_backend.source_sha()[:12]
        have_lib = batch_backend.installed_sha(d)
        if have_lib != want_lib:
            lib = os.path.join(d, batch_backend.LIBRARY)
            why_lib = ("from another source" if have_lib else "changed since it was built"
                       if os.path.lexists(lib) else "absent")
            reasons.append(f"{batch_backend.LIBRARY} {why_lib}")
            out.update(current=f"{out['current']}/{have_lib or '-'}", desired=f"{out['desired']}/{want_lib}",
                       reason="; ".join(reasons))
        if not ok and (have_lib != want_lib or batch_backend.python_library() is None):
            out["unsupported"] = f"the hkbatch backend: {why}"
    if model.build and model.engine == "tensorrt" and have_file is None:
        from hkgpu_tune.serve.repository import tensorrt
        why = tensorrt.cannot_build(t)
        if why:
            out["unsupported"] = why
    return out


def repository_state(t, backends=None) -> dict:
    return {m.name: model_state(t, m, backends) for m in t.models}


def write_model(t, model, backends=None) -> list[str]:
    """Render one model's directory; returns the files written (unchanged ones are left alone)."""
    d = os.path.join(t.model_repository, model.name)
    ensure_trusted_dir(os.path.join(d, str(model.version)), "model directory")   # before any write in it
    written = []
    cfg = render_config(model).encode()
    path = os.path.join(d, "config.pbtxt")
    if _file_sha(path) != _sha(cfg):
        _atomic_write(path, cfg)
        written.append(path)
    target = os.path.join(d, str(model.version), model_filename(model))
    if model.model_file:
        if _file_sha(target) != _file_sha(model.model_file):
            with open(model.model_file, "rb") as src:
                _atomic_write(target, src)
            written.append(target)
    w = model.build.weights if model.build else None
    if w:
        wpath = os.path.join(d, str(model.version), w.served_name)
        if _file_sha(wpath) != w.sha256[:12]:
            ensure_trusted_dir(os.path.dirname(wpath), "model directory")
            copy_pinned(w.file, wpath, w.sha256, "build.weights")
            written.append(wpath)
    if model.backend == "hkbatch":
        from hkgpu_tune.serve.repository import batch_backend
        if batch_backend.install(d):
            written.append(os.path.join(d, batch_backend.LIBRARY))
    if not model.model_file and model.build:
        from hkgpu_tune.serve.repository import tensorrt
        if tensorrt.build_plan(model.build, target, model, backends, gpu=getattr(t, "mig", None) or t.gpu, t=t).built:
            written.append(target)
        bad = tensorrt.check_plan(model, target) if model.engine == "tensorrt" else []
        if bad:   # Triton's TensorRT backend would refuse it: not loaded
            raise HkError(f"triton: model {model.name}: {target} does not match the config: {'; '.join(bad)}")
    return written


def write_repository(t, backends=None) -> list[str]:
    """Render every model of the profile; models not in the profile are left alone."""
    ensure_trusted_dir(t.model_repository, "model repository")
    out = []
    for m in t.models:
        out += write_model(t, m, backends)
    return out


def remove_model(t, name: str) -> None:
    shutil.rmtree(os.path.join(t.model_repository, name), ignore_errors=True)


def check_models(t):
    """Each model's config against Triton's schema (tritonclient's model_config_pb2): a bad field is
    a profile error at its key path. Done at plan time, once per section object: parsing a profile
    imports no service code."""
    if getattr(t, "_checked", False):
        return t
    for m in t.models:
        if m.item is not None:
            check_config(m.config, m.nodes, m.item)
    object.__setattr__(t, "_checked", True)
    return t
