"""A Python-backend model for the tests whose outputs Triton cannot send as JSON (FP16) and others
(INT8, BYTES): HALF = INPUT0 as float16, SMALL = INPUT0 as int8, NAME = b"x" per row."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            names = np.array([[b"x"]] * x.shape[0], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("HALF", x.astype(np.float16)),
                pb_utils.Tensor("SMALL", x.astype(np.int8)),
                pb_utils.Tensor("NAME", names)]))
        return out
