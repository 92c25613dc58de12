"""A KServe model server the harness did not write: ``kserve.ModelServer`` (from PyPI)
serving a small numpy MLP over the V2 / Open Inference Protocol.

    python tests/servers/kserve_numpy.py --http_port 8080 [--model_name numpy-mlp]

Run by tests/test_kserve_server.py with the interpreter of a separate venv (kserve pins
versions the harness's own venv must not take: .ci/run makes it). The model is defined
here, deterministic for its seed: 64 inputs → 256 hidden (tanh) → 8 outputs, computed
per request (KServe's model server has no dynamic batching and no queue limit).
"""

from __future__ import annotations

import argparse

import kserve
import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

IN, HIDDEN, OUT = 64, 256, 8


class NumpyMlp(Model):
    def __init__(self, name: str, seed: int) -> None:
        super().__init__(name)
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((IN, HIDDEN)).astype(np.float32) / np.sqrt(IN)
        self.w2 = rng.standard_normal((HIDDEN, OUT)).astype(np.float32) / np.sqrt(HIDDEN)
        self.ready = False

    def load(self) -> bool:
        self.ready = True
        return self.ready

    def get_input_types(self) -> list[dict]:
        return [{"name": "input", "datatype": "FP32", "shape": [-1, IN]}]

    def get_output_types(self) -> list[dict]:
        return [{"name": "output", "datatype": "FP32", "shape": [-1, OUT]}]

    async def predict(
        self,
        payload: InferRequest,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        x = payload.inputs[0].as_numpy().astype(np.float32).reshape(-1, IN)
        y = np.tanh(x @ self.w1) @ self.w2
        out = InferOutput(name="output", shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y.astype(np.float32), binary_data=False)
        return InferResponse(model_name=self.name, infer_outputs=[out], response_id=payload.id)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(parents=[kserve.model_server.parser])  # --model_name is kserve's
    ap.add_argument("--seed", type=int, default=7)
    args, _ = ap.parse_known_args()
    model = NumpyMlp(args.model_name or "numpy-mlp", args.seed)
    model.load()
    ModelServer(http_port=args.http_port, workers=1, enable_grpc=False).start([model])
