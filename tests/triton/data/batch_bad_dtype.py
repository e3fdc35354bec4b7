"""A model file for the hkbatch backend that builds, then reports an output type Triton lacks: the
load fails with the reason after the model object exists (its finalize() runs)."""
import numpy as np


class TritonBatchModel:
    def __init__(self, args):
        self.x = np.zeros((4, 4), np.float32)
        self.input_name, self.output_name, self.output_dtype, self.output_dims = "INPUT0", "OUTPUT0", "FP8", "4"
        self.max_batch, self.in_row_bytes, self.out_row_bytes = 4, 16, 16
        self.in_addr = self.out_addr = self.x.ctypes.data

    def finalize(self):
        print("batch_bad_dtype: finalized", flush=True)
