"""A Python-backend model for the tests: OUTPUT0 = 2 * INPUT0 (batched by Triton's dynamic batcher).
A config parameter sleep_ms makes every batch take that long more (a slow config for the gate tests)."""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters") or {}
        self.sleep_s = float((params.get("sleep_ms") or {}).get("string_value") or 0) / 1000

    def execute(self, requests):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))]))
        return out
