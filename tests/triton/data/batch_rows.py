"""A test model for the hkbatch backend: OUTPUT0[i] = INPUT0[i] * 2 + row's sum, per row, in numpy."""
import json
import numpy as np


class TritonBatchModel:
    def __init__(self, args):
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
        self.batches = []

    def run(self, n):
        self.batches.append(n)
        x = self.x[:n]
        self.y[:n] = x * 2 + x.sum(axis=1, keepdims=True)

    def finalize(self):
        pass
