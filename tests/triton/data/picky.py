"""A Python-backend model that refuses to load with max_batch_size over 8 (the sweep's failed-load case);
otherwise OUTPUT0 = 2 * INPUT0."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        mb = json.loads(args["model_config"]).get("max_batch_size", 0)
        if mb > 8:
            raise ValueError(f"max_batch_size {mb} is over the 8 this model takes")

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))]))
        return out
