"""execute() of the torch engine's Python-backend model, without Triton or torch: each response
must carry its own request's rows, whatever the batch's shape and however the gather is split
over threads (a mixed-up row would be a wrong answer served with a 200)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from hkgpu_tune.serve.repository import torch_model


class FakeEngine:
    """The engine's host side: a pinned-like input buffer, an output that is a pure function of
    each row (its sum and first value), returned as a view of a reused output buffer."""

    def __init__(self, max_batch: int, shape=(3, 4, 4)):
        self.max_batch = max_batch
        self.host_in_np = np.zeros((max_batch, *shape), np.uint8)
        self.host_out_np = np.zeros((max_batch, 2), np.float32)

    def run_pinned(self, n: int) -> np.ndarray:
        rows = self.host_in_np[:n].reshape(n, -1).astype(np.float32)
        self.host_out_np[:n, 0] = rows.sum(axis=1)
        self.host_out_np[:n, 1] = rows[:, 0]
        return self.host_out_np[:n]


def fake_pb_utils():
    class Tensor:   # keeps a reference, as pb_utils.Tensor does; the test copies it as the stub does
        def __init__(self, name, arr):
            self.name, self.arr = name, arr

    class Resp:
        def __init__(self, tensors):
            self.tensors = tensors

    class InT:
        def __init__(self, arr):
            self.arr = arr

        def as_numpy(self):
            return self.arr

    return types.SimpleNamespace(Tensor=Tensor, InferenceResponse=Resp,
                                 get_input_tensor_by_name=lambda r, name: InT(r[name]))


@pytest.mark.parametrize("threads", [1, 3, 4])
@pytest.mark.parametrize("rows", [[1] * 5, [1] * 33, [2, 1, 3, 1, 1, 4, 1, 1, 2, 1], [1] * 64, [40, 30]])
def test_each_response_gets_its_own_rows(monkeypatch, threads, rows):
    monkeypatch.setattr(torch_model, "pb_utils", fake_pb_utils())
    m = torch_model.TritonPythonModel()
    m.engine, m.in_name, m.out_name = FakeEngine(64), "INPUT", "OUTPUT"
    m.stats = torch_model.Stats("t")
    m.copier = torch_model.Copier(threads)
    rng = np.random.default_rng(sum(rows) * 10 + threads)
    reqs = [{"INPUT": rng.integers(0, 255, (n, 3, 4, 4), dtype=np.uint8)} for n in rows]
    for _ in range(2):   # the second batch reuses the buffers
        resps = m.execute(reqs)
        assert len(resps) == len(reqs)
        # the stub copies every response into shared memory after execute() returns, before the next
        sent = [np.array(resp.tensors[0].arr) for resp in resps]
        for r, got in zip(reqs, sent):
            x = r["INPUT"].reshape(len(r["INPUT"]), -1).astype(np.float32)
            assert got.shape == (len(x), 2)
            np.testing.assert_array_equal(got[:, 0], x.sum(axis=1))
            np.testing.assert_array_equal(got[:, 1], x[:, 0])
        reqs = reqs[::-1]
    m.copier.close()


def test_copy_threads_parameter():
    assert torch_model.copy_threads({}) == 4
    assert torch_model.copy_threads({"copy_threads": " 1 "}) == 1
    for bad in ("0", "33", "two", "-1", "1.5"):
        with pytest.raises(ValueError, match="copy_threads"):
            torch_model.copy_threads({"copy_threads": bad})
