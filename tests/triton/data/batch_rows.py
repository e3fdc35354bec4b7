"""A model for the hkbatch backend (tests/triton/test_batch_backend.py), in numpy:
OUTPUT0 row = 2 * INPUT0 row + the row's sum. A row starting with -1 makes run() raise."""
import json
import os
import sys

import numpy as np

INSTANCES = []   # this model's instances share the module's namespace (one per loaded model)


class TritonBatchModel:
    def __init__(self, args):
        # embedded in tritonserver: subprocesses must start Python, not the server
        if not os.path.basename(sys.executable).startswith("python"):
            raise RuntimeError(f"sys.executable is {sys.executable}, not a Python")
        cfg = json.loads(args["model_config"])
        self.input_name = cfg["input"][0]["name"]
        self.output_name = cfg["output"][0]["name"]
        self.output_dtype = "FP32"
        self.output_dims = ",".join(str(d) for d in cfg["output"][0]["dims"])
        self.max_batch = int(cfg["max_batch_size"])
        width = int(cfg["input"][0]["dims"][0])
        self.x = np.zeros((self.max_batch, width), np.float32)
        self.y = np.zeros((self.max_batch, width), np.float32)
        self.in_addr, self.out_addr = self.x.ctypes.data, self.y.ctypes.data
        self.in_row_bytes = self.out_row_bytes = width * 4
        self.copy_threads, self.copy_min_bytes = 3, 0   # every batch's gather split over 3 threads
        INSTANCES.append(self)
        print(f"batch_rows: instance {len(INSTANCES)} of this model's namespace", flush=True)

    def run(self, n):
        x = self.x[:n]
        if (x[:, 0] == -1).any():
            raise ValueError("a row starts with -1")
        self.y[:n] = x * 2 + x.sum(axis=1, keepdims=True)

    def finalize(self):
        pass
