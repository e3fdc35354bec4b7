"""A stand-in for the load-time I/O check of Triton's TensorRT backend (triton-inference-server/
tensorrt_backend, src/instance_state.cc: each binding of the plan against config.pbtxt; a type that
differs fails the model's load with "unexpected datatype TYPE_<plan> for inference input|output
'<name>', expecting TYPE_<config>"). It reads the engine the trtexec stand-in writes, and
config.pbtxt with tritonclient's own ModelConfig schema (not hkgpu-tune's code)."""
from __future__ import annotations

import json
import os

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

PLAN_TYPES = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16", "int32": "INT32", "int64": "INT64",
              "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}


class LoadRefused(Exception):
    pass


def load(model_dir: str, version: int = 1) -> None:
    """Raise LoadRefused as Triton's TensorRT backend would when it loads this model directory."""
    with open(os.path.join(model_dir, "config.pbtxt")) as f:
        cfg = text_format.Parse(f.read(), mc.ModelConfig())
    with open(os.path.join(model_dir, str(version), "model.plan")) as f:
        plan = json.load(f)
    for io, tensors in (("input", cfg.input), ("output", cfg.output)):
        for t in tensors:
            have = plan["bindings"][io].get(t.name)
            if have is None:
                raise LoadRefused(f"unexpected inference {io} '{t.name}', allowed inputs are: "
                                  f"{', '.join(plan['bindings'][io])}")
            want = mc.DataType.Name(t.data_type)[len("TYPE_"):]
            if PLAN_TYPES[have] != want:
                raise LoadRefused(f"unexpected datatype TYPE_{PLAN_TYPES[have]} for inference {io} "
                                  f"'{t.name}', expecting TYPE_{want} for {cfg.name}")
