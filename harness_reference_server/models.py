"""The served models: a real numpy MLP and a simulated accelerator.

Both take one FP32 input of shape ``[-1, D]`` named ``input`` and return one FP32 output
``[-1, K]`` named ``output``; the batch dimension counts rows. ``predict`` is called from
model-worker threads, never from the event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness_reference_server.config import ServerConfig


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    width: int  # the non-batch dimension

    def metadata(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, self.width]}


class Model:
    """Base: lazy weights (``load``) and a batch ``predict``."""

    platform = "numpy"

    def __init__(self, name: str, input_width: int, output_width: int) -> None:
        self.name = name
        self.input = TensorSpec("input", "FP32", input_width)
        self.output = TensorSpec("output", "FP32", output_width)
        self._load_lock = threading.Lock()
        self._loaded = False
        self.load_delay_s = 0.0  # extra heavy-init time (slow-start fault)

    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> None:
        """Build the weights once; safe to call from several threads."""
        if self._loaded:
            return
        with self._load_lock:
            if self._loaded:
                return
            if self.load_delay_s:
                time.sleep(self.load_delay_s)
            self._build()
            self._loaded = True

    def predict(self, x: np.ndarray) -> np.ndarray:
        self.load()
        return self._predict(x)

    def metadata(self) -> dict[str, object]:
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": self.platform,
            "inputs": [self.input.metadata()],
            "outputs": [self.output.metadata()],
        }

    def _build(self) -> None:
        raise NotImplementedError

    def _predict(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class MLPModel(Model):
    """float32 MLP, ReLU hidden layers, linear output, weights from a seed.

    The default 256→8192→4096→10 (~36 M weights, 143 MB) does not fit in a core's
    cache, so a batch of 1 is memory-bound while a batch of 32 reuses each weight 32
    times for a few times the cost of one: batching matters, and the model, not HTTP,
    dominates a batch-1 request (docs/performance.md has the measured figures).
    """

    platform = "numpy_mlp"

    def __init__(self, name: str, dims: tuple[int, ...], seed: int) -> None:
        super().__init__(name, dims[0], dims[-1])
        self.dims = dims
        self.seed = seed
        self._layers: list[tuple[np.ndarray, np.ndarray]] = []

    def _build(self) -> None:
        """The weights from the weight file, as a model server loads its checkpoint; the
        first start on a machine generates them from the seed (~0.5 s for the default
        dims, every start paid it before) and writes that file (``weight_file``)."""
        path = weight_file(self.dims, self.seed)
        layers = _read_layers(path, self.dims) if path is not None else None
        if layers is None:
            layers = self._generate()
            if path is not None:
                _write_layers(path, layers)
        self._layers = layers

    def _generate(self) -> list[tuple[np.ndarray, np.ndarray]]:
        rng = np.random.default_rng(self.seed)
        layers = []
        for fan_in, fan_out in zip(self.dims, self.dims[1:], strict=False):
            w = rng.standard_normal((fan_in, fan_out), dtype=np.float32)
            w *= np.float32(np.sqrt(2.0 / fan_in))
            b = rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.01)
            layers.append((w, b))
        return layers

    def _predict(self, x: np.ndarray) -> np.ndarray:
        last = len(self._layers) - 1
        for i, (w, b) in enumerate(self._layers):
            x = x @ w
            x += b
            if i < last:
                np.maximum(x, 0, out=x)
        return x


# Where the MLP's weights are kept between starts: $HARNESS_REFERENCE_WEIGHTS (a
# directory; "off" generates them at every start and keeps nothing), else
# $XDG_CACHE_HOME/harness-reference-server, else ~/.cache/harness-reference-server.
WEIGHTS_ENV = "HARNESS_REFERENCE_WEIGHTS"


def weight_file(dims: tuple[int, ...], seed: int) -> Path | None:
    """The file holding the MLP's weights for ``dims`` and ``seed``; None when turned off."""
    where = os.environ.get(WEIGHTS_ENV)
    if where == "off":
        return None
    if where:
        base = Path(where)
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        base = Path(cache) / "harness-reference-server"
    return base / f"mlp-{'x'.join(map(str, dims))}-seed{seed}.npz"


def _read_layers(path: Path, dims: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """The layers kept in ``path``, or None when it is missing, unreadable or not the
    shapes ``dims`` make (then they are generated again and the file rewritten)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            layers = [(f[f"w{i}"], f[f"b{i}"]) for i in range(len(dims) - 1)]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    for (w, b), fan_in, fan_out in zip(layers, dims, dims[1:], strict=False):
        if w.shape != (fan_in, fan_out) or b.shape != (fan_out,) or w.dtype != np.float32:
            return None
    return layers


def _write_layers(path: Path, layers: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Write ``layers`` to ``path`` whole or not at all (a temporary file renamed: servers
    starting at once each write their own); a directory that cannot be written keeps
    nothing, and the next start generates the weights again."""
    arrays = {}
    for i, (w, b) in enumerate(layers):
        arrays[f"w{i}"], arrays[f"b{i}"] = w, b
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


class SimModel(Model):
    """A simulated accelerator: a batch costs base + item x rows, spent sleeping.

    Sleeping releases the GIL, so batching and worker-thread scaling show on any CPU.
    Outputs are a fixed seeded linear projection of the input, so they are deterministic
    and differ between inputs (integrity checks can tell requests apart).
    """

    platform = "simulated"

    def __init__(
        self,
        name: str,
        dims: tuple[int, ...],
        base_ms: float,
        item_ms: float,
        seed: int,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(name, dims[0], dims[-1])
        self.base_s = base_ms / 1000.0
        self.item_s = item_ms / 1000.0
        self.seed = seed
        self._sleep = sleep
        self._w = np.zeros((dims[0], dims[-1]), dtype=np.float32)

    def _build(self) -> None:
        rng = np.random.default_rng(self.seed)
        w = rng.standard_normal(self._w.shape, dtype=np.float32)
        self._w = w / np.float32(np.sqrt(self._w.shape[0]))

    def _predict(self, x: np.ndarray) -> np.ndarray:
        cost = self.base_s + self.item_s * x.shape[0]
        if cost > 0:
            self._sleep(cost)
        return x @ self._w


def build_model(config: ServerConfig) -> Model:
    if config.model == "mlp":
        model: Model = MLPModel(config.served_name, config.mlp_dims, config.seed)
    else:
        model = SimModel(
            config.served_name, config.sim_dims, config.sim_base_ms, config.sim_item_ms, config.seed
        )
    if config.faults.slow_start_s is not None:
        model.load_delay_s = config.faults.slow_start_s
    return model
