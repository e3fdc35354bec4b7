"""bench/batch_backend_bench.py's hkbatch model: the same as pixels_python.py, once per batch."""
import json

import numpy as np


class TritonBatchModel:
    def __init__(self, args):
        cfg = json.loads(args["model_config"])
        self.max_batch = int(cfg["max_batch_size"])
        self.input_name, self.output_name, self.output_dtype, self.output_dims = "INPUT", "OUTPUT", "FP16", "1000"
        self.x = np.zeros((self.max_batch, 3 * 224 * 224), np.uint8)
        self.y = np.zeros((self.max_batch, 1000), np.float16)
        self.in_addr, self.out_addr = self.x.ctypes.data, self.y.ctypes.data
        self.in_row_bytes, self.out_row_bytes = self.x[0].nbytes, self.y[0].nbytes

    def run(self, n):
        self.y[:n] = self.x[:n, :1000]
