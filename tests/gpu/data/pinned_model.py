"""Triton Python-backend model for the multi-GPU run: one instance per GPU (instance_group KIND_GPU,
gpus [0..N-1]), each instance pinned to its GPU's local CPUs.

The CPU lists (plain comma lists) come from the model config's parameters `cpus_gpu<N>`, which tests/gpu/multi_gpu.py
fills in from hkgpu_tune.backends.topology.service_placement() (the library's placement). Every
thread of the stub process is pinned in initialize(), before torch starts its own threads.

OUTPUT0 = 2 * INPUT0 computed on the instance's GPU; GPU = the device the instance runs on;
PID = the stub's process id (the test reads its CPU mask from /proc independently).
"""
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _pin_all_threads(cpus):
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # a thread that ended meanwhile


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        self.kind = args.get("model_instance_kind", "")
        self.gpu = int(args.get("model_instance_device_id", "0") or 0)
        self.mode = params.get("output_mode", "numpy")
        if self.kind == "CPU" and params.get("gpus"):
            # the KIND_CPU form: N instances, instance k drives GPU k (Triton names them MODEL_0_k)
            self.gpu = int(args["model_instance_name"].rsplit("_", 1)[1]) % int(params["gpus"])
        cpus = params.get(f"cpus_gpu{self.gpu}", "")
        if cpus:   # a plain comma list
            _pin_all_threads({int(c) for c in cpus.split(",")})
        self.delay = float(params.get("delay_ms", "0") or 0) / 1000
        import torch  # after pinning: its thread pools start with this mask
        torch.set_num_threads(1)
        self.torch, self.device = torch, torch.device(f"cuda:{self.gpu}")
        torch.ones(1, device=self.device)  # the CUDA context now, not at the first request
        self.pid = os.getpid()
        pb_utils.Logger.log_info(f"instance {args.get('model_instance_name')} kind {self.kind} gpu {self.gpu} "
                                 f"pid {self.pid} cpus {cpus or 'all'} -> {sorted(os.sched_getaffinity(0))[:4]}...")

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            n = x.shape[0]
            if self.mode == "dlpack":   # outputs stay on the GPU
                t = self.torch
                y = t.from_numpy(x).to(self.device) * 2
                ids = t.tensor([[self.gpu, self.pid]] * n, dtype=t.int32, device=self.device)
                tensors = [pb_utils.Tensor.from_dlpack(k, t.utils.dlpack.to_dlpack(v.contiguous()))
                           for k, v in (("OUTPUT0", y), ("GPU", ids[:, :1]), ("PID", ids[:, 1:]))]
            else:
                y = (self.torch.from_numpy(x).to(self.device) * 2).cpu().numpy()
                tensors = [pb_utils.Tensor("OUTPUT0", np.ascontiguousarray(y, dtype=np.float32)),
                           pb_utils.Tensor("GPU", np.full((n, 1), self.gpu, dtype=np.int32)),
                           pb_utils.Tensor("PID", np.full((n, 1), self.pid, dtype=np.int32))]
            out.append(pb_utils.InferenceResponse(tensors))
        if self.delay:
            time.sleep(self.delay)  # keeps an instance busy so that concurrent requests reach the others
        return out
