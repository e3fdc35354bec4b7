"""A Python-backend model that takes 5 ms per batch (OUTPUT0 = 2 * INPUT0): with max_batch_size 4 it
serves about 800 requests a second, so latency grows with the load in a way a test can count on."""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", (pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2).astype(np.float32))])
            for r in requests]
