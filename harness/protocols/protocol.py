"""What the harness asks of a wire protocol, declared once.

A protocol is what is said to an inference server and how its answers read: where to
ask whether it is ready, where its metadata is, how a request body is built from the
model's inputs, how an answer is parsed for integrity checking, and where the server's
own statistics are, if it has any. How the words travel (HTTP/1.1 framing, keep-alive,
TLS, the run's ``--header`` values) is the load side's (``harness.load.http``), so a
protocol is pure: no sockets, no clocks, stdlib only.

Everything a protocol builds before the load (its input pool) is JSON-able, because the
master sends it to every worker in the plan; every worker then builds the same request
bodies from it with the same protocol, found again by name (``harness.protocols.get``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

# A request id is this many hex digits, spliced into every pre-encoded body between the
# two parts a protocol builds: 4 for the worker slot, 12 for the sequence number.
ID_WIDTH = 16

# The server's cumulative counters (harness.load.server_stats turns two reads into a
# stage's figures): inference_count, execution_count, and for each of success, fail,
# queue, compute_input, compute_infer, compute_output its _count and _ns.
Counters = dict[str, int]


class BadResponse(Exception):
    """A 2xx answer that is not an answer of the protocol (it is counted ``bad_response``)."""


@dataclass(frozen=True)
class ClassParams:
    """What a traffic class adds to each request body (a protocol without such
    parameters sends every class alike)."""

    name: str
    priority: int | None = None  # None or 0: leave the server default
    timeout_us: int | None = None


class WireProtocol(ABC):
    """One wire protocol. Subclass it, set ``name`` and the paths, and ``register`` an
    instance (``harness.protocols.register``); ``--protocol NAME`` then selects it.

    Paths are relative to the target URL (its own path prefix goes in front of them)."""

    #: the name ``--protocol`` selects it by
    name: ClassVar[str]
    #: GET it: HTTP 200 means the server is ready (the body is not read)
    ready_path: ClassVar[str]
    #: the method of an inference request, and the name Locust's statistics show for one
    #: (``"{request_name} [{traffic class}]"``)
    request_method: ClassVar[str] = "POST"
    request_name: ClassVar[str] = "infer"
    #: the ``source`` the results give the server's statistics (``server_stats``)
    stats_source: ClassVar[str | None] = None

    # -- the server and the model, before the load ----------------------------------------

    def server_metadata_path(self) -> str | None:
        """GET it for the server's metadata (recorded as ``sut.config.server``, and asked
        for the model when ``--model`` is not given); None: the protocol has none."""
        return None

    def default_model(self, server_meta: Mapping[str, Any] | None) -> str | None:
        """The model to load when ``--model`` is not given (from the server's metadata
        when the protocol has one); None: the user must name it."""
        return None

    @abstractmethod
    def model_metadata_path(self, model: str) -> str:
        """GET it for the model's metadata (a JSON object; HTTP 404: no such model)."""

    @abstractmethod
    def infer_path(self, model: str) -> str:
        """Where the inference requests go (``request_method``)."""

    def max_batch(self, meta: Mapping[str, Any]) -> int:
        """The model's largest batch, which sizes the input pool and the calibration's
        users; 32 when the metadata does not say."""
        return 32

    # -- the inputs, built once on the master ---------------------------------------------

    @abstractmethod
    def resolve_inputs(
        self,
        meta: Mapping[str, Any],
        model: str,
        input_options: Sequence[str] = (),
        sample_request: str | None = None,
    ) -> Any:
        """What the inputs look like, from the model's metadata or from the user
        (``--input`` values, a ``--sample-request`` file: they win); a ConfigError
        (exit 2) naming the fix when neither says.

        Two keyword-only arguments are passed only when the user sets them, so a protocol
        that does not declare them keeps working (and gets a ConfigError naming the
        option, before any load, when it is set):

        - ``batch_size`` (``--batch-size N``, default 1): every request carries N
          inferences — for KServe V2 the leading -1 (batch) dimension of each input
          becomes N. The results count requests; ``sut.inputs.batch_size`` says N.
        - ``input_data`` (``--input-data FILE``): the path of the user's request data;
          ``generate_inputs`` then returns the file's requests in order (their number
          sizes the pool), each checked against the model's inputs here."""

    @abstractmethod
    def generate_inputs(self, template: Any, count: int, seed: int) -> list[Any]:
        """``count`` distinct JSON-able inputs for ``template`` (``resolve_inputs``),
        the same for the same seed on every process; with ``input_data``, the file's
        requests in order, whatever ``count``."""

    # -- one request, one answer ----------------------------------------------------------

    @abstractmethod
    def request_parts(self, inputs: Any, cls: ClassParams) -> tuple[bytes, bytes]:
        """The request body for ``inputs`` and traffic class ``cls``, in the two parts
        that go before and after the request id (``ID_WIDTH`` hex digits): encoded once,
        so the hot path only splices the id in."""

    @abstractmethod
    def parse_answer(self, body: bytes) -> tuple[str | None, tuple[Any, ...]]:
        """A 200 answer → (the request id it echoes, None if none; its output values in
        a fixed order, compared with the golden outputs). ``BadResponse`` when the body
        is not an answer of the protocol."""

    # -- the server's own statistics ------------------------------------------------------

    def stats_path(self, model: str) -> str | None:
        """GET it for the server's cumulative statistics; None: the protocol has none."""
        return None

    def stats_counters(self, doc: Any, model: str) -> Counters | None:
        """The model's counters from a statistics answer; None when it is not one."""
        return None
