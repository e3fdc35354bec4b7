"""bench/batch_backend_bench.py's Python-backend model: OUTPUT = the first 1000 pixels of each
image as FP16, per request (a model with no compute, so the server's own work is what is timed)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        arrs = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        x = np.concatenate(arrs, axis=0)
        y = x.reshape(x.shape[0], -1)[:, :1000].astype(np.float16)
        out, pos = [], 0
        for a in arrs:
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", y[pos:pos + a.shape[0]])]))
            pos += a.shape[0]
        return out
