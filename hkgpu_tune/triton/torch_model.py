"""The torch engine: a torchvision model in fp16 and channels_last with one CUDA graph per batch
size the batcher forms. Triton serves it as a Python-backend model (this file is copied verbatim
to REPO/NAME/VERSION/model.py); the benches import TorchEngine from here for the in-process limit.

Config parameters (strings, set by the profile's `build:`): torchvision (e.g. resnet50), fp16,
channels_last, cuda_graphs, graph_batches ("1,2,4,..."), image_size. Random weights: the model's
cost is the point, nothing is downloaded.

>>> eng = TorchEngine("resnet50", batches=[1, 8, 32], device="cuda:0")   # doctest: +SKIP
>>> eng.run(np.zeros((5, 3, 224, 224), np.float16)).shape                 # doctest: +SKIP
(5, 1000)
"""
import json
import os
import time

import numpy as np

try:  # inside Triton's Python backend stub only
    import triton_python_backend_utils as pb_utils
except ImportError:
    pb_utils = None


def graph_batches(max_batch: int, preferred=()) -> list[int]:
    """Powers of two and their midpoints up to max_batch, plus max_batch and the preferred sizes:
    a batch of n is padded to the next size, so at most 1/3 of the work is padding."""
    sizes = {max_batch, *[int(p) for p in preferred if 0 < int(p) <= max_batch]}
    b = 1
    while b < max_batch:
        sizes.add(b)
        if b >= 4 and b + b // 2 < max_batch:
            sizes.add(b + b // 2)
        b *= 2
    return sorted(sizes)


class TorchEngine:
    """One model on one GPU: pinned host buffers allocated once, a CUDA stream of its own,
    and (cuda_graphs) one captured graph per batch size sharing one memory pool."""

    def __init__(self, name: str, batches, device: str = "cuda:0", fp16: bool = True,
                 channels_last: bool = True, cuda_graphs: bool = True, image_size: int = 224,
                 num_classes: int = 1000):
        import torch
        import torchvision
        torch.backends.cudnn.benchmark = True
        self.torch = torch
        self.device = torch.device(device)
        torch.cuda.set_device(self.device)
        self.dtype = torch.float16 if fp16 else torch.float32
        self.np_dtype = np.float16 if fp16 else np.float32
        self.batches = sorted({int(b) for b in batches})
        self.max_batch = self.batches[-1]
        self.channels_last = channels_last
        self.cuda_graphs = cuda_graphs
        fn = getattr(torchvision.models, name, None)
        if fn is None:
            raise ValueError(f"torchvision has no model {name!r}")
        model = fn(weights=None, num_classes=num_classes).eval().to(self.device, self.dtype)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        shape = (3, image_size, image_size)
        self.stream = torch.cuda.Stream(self.device)
        self.host_in = torch.empty((self.max_batch, *shape), dtype=self.dtype).pin_memory()
        self.host_in_np = self.host_in.numpy()
        self.dev_in = torch.zeros((self.max_batch, *shape), dtype=self.dtype, device=self.device)
        self.graphs, self.outs = {}, {}
        t0 = time.monotonic()
        with torch.inference_mode():
            out = self._forward(self.dev_in[:1])
            self.host_out = torch.empty((self.max_batch, *out.shape[1:]), dtype=out.dtype).pin_memory()
            self.host_out_np = self.host_out.numpy()
            if cuda_graphs:
                self._capture()
        torch.cuda.synchronize(self.device)
        self.capture_s = time.monotonic() - t0

    def _forward(self, x):
        if self.channels_last:
            x = x.contiguous(memory_format=self.torch.channels_last)
        return self.model(x)

    def _capture(self):
        torch = self.torch
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        for b in reversed(self.batches):   # largest first: the smaller graphs reuse its pool
            x = self.dev_in[:b]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(3):         # cudnn picks its algorithms outside the capture
                    self._forward(x)
            torch.cuda.current_stream(self.device).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=side):
                self.outs[b] = self._forward(x)
            self.graphs[b] = g

    def bucket(self, n: int) -> int:
        for b in self.batches:
            if b >= n:
                return b
        raise ValueError(f"batch {n} is over the largest size {self.max_batch}")

    def run_device(self, n: int):
        """Run the first n rows of the device input buffer; returns the device output (n rows)."""
        if not self.cuda_graphs:
            return self._forward(self.dev_in[:n])
        b = self.bucket(n)
        self.graphs[b].replay()
        return self.outs[b][:n]

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Host in, host out (a view of the pinned output buffer: copy it before the next run)."""
        n = batch.shape[0]
        self.host_in_np[:n] = batch
        return self.run_pinned(n)

    def run_pinned(self, n: int) -> np.ndarray:
        torch = self.torch
        with torch.cuda.stream(self.stream), torch.inference_mode():
            self.dev_in[:n].copy_(self.host_in[:n], non_blocking=True)
            out = self.run_device(n)
            self.host_out[:n].copy_(out, non_blocking=True)
        self.stream.synchronize()
        return self.host_out_np[:n]


class TritonPythonModel:
    """Triton's Python backend: the batcher's requests -> one pinned batch -> one graph replay."""

    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        p = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        self.in_name = cfg["input"][0]["name"]
        self.out_name = cfg["output"][0]["name"]
        max_batch = max(1, int(cfg.get("max_batch_size", 1)))
        preferred = cfg.get("dynamic_batching", {}).get("preferred_batch_size", [])
        sizes = [int(s) for s in p.get("graph_batches", "").split(",") if s.strip()]
        sizes = [s for s in sizes if s <= max_batch] or graph_batches(max_batch, preferred)
        if max_batch not in sizes:
            sizes.append(max_batch)
        gpu = int(args.get("model_instance_device_id") or 0)
        if args.get("model_instance_kind") == "CPU":
            gpu = 0   # a CPU instance still drives the first visible GPU
        self.engine = TorchEngine(p.get("torchvision", "resnet50"), sizes, device=f"cuda:{gpu}",
                                  fp16=p.get("fp16", "true") == "true",
                                  channels_last=p.get("channels_last", "true") == "true",
                                  cuda_graphs=p.get("cuda_graphs", "true") == "true",
                                  image_size=int(p.get("image_size", "224") or 224))
        pb_utils.Logger.log_info(f"{args.get('model_instance_name')}: torch engine on cuda:{gpu}, "
                                 f"graphs for batches {sizes} captured in {self.engine.capture_s:.1f} s, "
                                 f"pid {os.getpid()}")

    def execute(self, requests):
        eng = self.engine
        arrs = [pb_utils.get_input_tensor_by_name(r, self.in_name).as_numpy() for r in requests]
        counts = [a.shape[0] for a in arrs]
        total = sum(counts)
        if total <= eng.max_batch:   # the batcher's case: one copy into the pinned buffer
            np.concatenate(arrs, axis=0, out=eng.host_in_np[:total])
            out = eng.run_pinned(total).copy()
        else:                        # more rows than the largest graph: run it in slices
            flat = np.concatenate(arrs, axis=0)
            out = np.empty((total, *eng.host_out_np.shape[1:]), dtype=eng.host_out_np.dtype)
            for s in range(0, total, eng.max_batch):
                n = min(eng.max_batch, total - s)
                eng.host_in_np[:n] = flat[s:s + n]
                out[s:s + n] = eng.run_pinned(n)
        responses, pos = [], 0
        for c in counts:
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.out_name, out[pos:pos + c])]))
            pos += c
        return responses

    def finalize(self):
        self.engine = None
