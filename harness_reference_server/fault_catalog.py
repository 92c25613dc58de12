"""Test-only defect switches (``--fault NAME[:PARAM]``).

They exist so the harness's tests can prove each check catches its defect. Every fault
is logged loudly at start and listed in ``GET /v2`` under ``"faults"``. Rates are
parameters so a defect can be made as small as a real one (a few MB/min of leak, a
cross-wire in a few % of batches).

Each fault is declared once, in ``FAULTS`` below: its name, its parameter (parsed and
validated), its ``--help`` text, the ``FaultSet`` fields it sets and where its behaviour
hooks in (``hook``: a ``FaultRuntime`` method of ``harness_reference_server/faults.py``, the
batcher's config or the server's shutdown). ``FaultSet``, ``FAULT_NAMES`` and
``FAULT_HELP`` are built from it.

``late-leak`` and ``stale-output`` differ in *shape* from the others, so the checks can be shown to catch
defects they were not tuned on. ``late-leak`` is a leak that only shows once a cache
fills: nothing is retained until AFTER_S seconds after the server became ready (on the
server's injected monotonic clock), then every request retains BYTES, as leak-memory
does. ``stale-output`` is a response cache keyed wrongly: with probability P a request
is answered with the outputs of the last request of the previously completed batch (a
mix-up *across* batches, where cross-wire mixes requests *within* one), under its own
id. Requests whose slot is empty or holds a different shape are answered normally. Its
RNG is seeded from ``--seed`` and drawn once per request, so a run is reproducible.

``error-rate``, ``serialize`` and ``slowdown`` give ``steady.error_rate``, ``linearity.efficiency`` and
``soak.latency_drift`` a defect each. ``error-rate`` fails single requests, not batches:
with probability P (its own RNG seeded from ``--seed``, one draw per request in batch
order) a request's output is replaced by a ``ModelFault`` exception, which the app answers
like any model exception (500, counted ``failed``/``model_error``), while the other
requests of the batch are answered normally. ``serialize`` is the classic "the model
object is not thread-safe, wrap it in a lock" fix: ``--workers N`` then buys nothing.
``slowdown`` is per-request work that grows with uptime (an ever-growing list scanned per
request): each batch sleeps (releasing the GIL, like the sim model) an extra
minutes-since-ready x MS_PER_MIN ms on the server's injected clock, so latency drifts up
over a soak while CPU stays flat.

``fifo-dispatch`` and ``backoff-batching`` are the overload defects. ``fifo-dispatch`` is priority done halfway: each
level keeps its own bounded queue (so the high class is admitted while the low one is
shed), but batches are formed in arrival order across levels, so a high request waits
behind every queued low one — its latency, not its rejection rate, shows the bug (with a
deep queue, as Triton's unbounded default). ``backoff-batching`` is a batch-size
controller with the sign wrong for overload (AIMD keyed on queue overflow, the way
Clipper keys it on latency): a queue-full rejection halves the batch cap (at most every
100 ms, down to 1) and the cap regains one slot per GROW_S seconds. Smaller batches cost
more per request, so an overload that halves the cap lowers capacity below the load,
which overflows the queue again: a metastable collapse that outlives its trigger (a
spike, a CPU hog) for as long as the load stays above the small-batch capacity.

``cold-errors`` gives ``cold_start.first_error_rate`` its defect: a server whose readiness
endpoint says yes before the model can serve (readiness wired to the process, the model
loaded in the background), so its first N inference requests are refused 503 "model not
loaded yet" instead of being served or waited for. It is counted in requests, not
seconds, so the same requests fail however fast the box is.

``stall-trip``, ``stall-abandon``, ``stall-respawn``, ``no-drain`` and ``exit-hang`` are
the resilience defects (freeze, rolling shutdown). Both ``stall-*``
faults are an event-loop watchdog meant to protect against a hung model: a task ticks
every 100 ms on the server's clock, and a tick that comes more than GAP_S late (the
process was frozen: SIGSTOP, a VM pause, a long GC) is taken for a hang and "handled".
``stall-trip`` handles it like a circuit breaker that never resets: the batcher drops to
one request per batch for the rest of the process's life, so a server that met its load
by batching falls behind it after any stall. ``stall-abandon`` restarts the batch queue once
the batch running at the stall (taken for hung) returns: the requests queued by then —
the backlog the freeze built — are forgotten (their futures never resolved, their
deadline timers cancelled), so their clients wait until their own timeout and the
server's in-flight count never returns to zero. ``stall-respawn`` restarts the model
workers: a new thread pool replaces the old one, which is never shut down, so every stall
leaves its worker threads behind (idle, holding their stacks). ``no-drain`` is a server that treats
SIGTERM as SIGKILL (``os._exit(0)`` in the handler): the in-flight batch and every
accepted request are dropped with their connections. ``exit-hang`` is a background thread
(a metrics flusher) started non-daemon and never told to stop: the drain completes,
uvicorn returns, and the interpreter waits for the thread forever, so the process
outlives any drain timeout until something SIGKILLs it.

``reset-leak``, ``io-lock`` and ``reset-breaker`` are the network defects (the ``network`` scenario's fault proxy).
``reset-leak`` is per-connection bookkeeping cleaned up on the happy path only: every
client connection's socket is dup()ed when it is accepted (a TCP_INFO sampler for the
connection metrics) and the dup is closed when the connection ends with a FIN; a client
that resets its connection (ECONNRESET: ``connection_lost`` with an exception) takes the
error path, which forgets it, so each reset leaves one socket open for good. ``io-lock``
is a shared request decoder guarded by one process-wide lock that is taken *before* the
body is read instead of after: the lock is held across the wait for the client's bytes,
so one slow client (its body trickling in over a slow link) stalls every other request's
decode behind it, while the server's own queue and compute time stay as they were.
``reset-breaker`` is resilience middleware that counts a client's connection reset
(ECONNRESET) as a backend failure: 20 within 5 s open its circuit breaker, and for OPEN_S
(default 15 s) every inference is answered 503 — long after the network is back.

``late-errors`` and ``batch-errors`` fail requests in a shape a check meant for something else would miss.
``late-errors`` gives ``soak.error_rate`` its defect: a server that serves well, then stops
(a credential that expires, a pool to a dependency that runs dry, a disk that fills): from
AFTER_S after ready (on the server's injected clock, as ``late-leak``) each request's model
call fails with probability P (default 1: every one), answered 500 like ``error-rate``'s,
one draw per request from its own RNG seeded from ``--seed``. Its latency is the healthy
one, so only counting the failures sees it. ``batch-errors`` gives ``integrity.failures``
its defect: a batched code path that raises (a padding or concatenation bug) while batch 1
works, so every request of a batch of MIN_BATCH or more requests is answered 500 and the
golden outputs (fetched one request at a time) come back fine. The few answers that come,
from batches of one, are all correct: ``integrity.mismatches`` has nothing to see.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

from harness_reference_server.errors import ConfigError

# A fault's parser: (the whole --fault value, its PARAM) → the FaultSet fields it sets.
Parser = Callable[[str, str], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Fault:
    """One ``--fault``: everything about it but its behaviour, which ``hook`` names."""

    name: str
    usage: str  # in --help: NAME[:PARAM=DEFAULT]
    summary: str | None  # in --help, in parentheses after the usage (None: none)
    fields: tuple[tuple[str, str, Any], ...]  # its FaultSet fields: (name, type, value off)
    parse: Parser
    hook: str  # where its behaviour lives

    def shown(self, faults: Any) -> str | None:
        """The canonical ``NAME[:PARAM]`` of this fault in ``faults`` (None when off):
        the first field's value(s), then any further field that is not its default."""
        (first, _, _), *rest = self.fields
        v = getattr(faults, first)
        if v is None or v is False:
            return None
        if v is True:
            return self.name
        values = list(v) if isinstance(v, tuple) else [v]
        values += [getattr(faults, f) for f, _, off in rest if getattr(faults, f) != off]
        return f"{self.name}:" + ",".join(
            f"{x:g}" if isinstance(x, float) else str(x) for x in values
        )


def _bad(spec: str, expected: str) -> ConfigError:
    return ConfigError(f"--fault has value {spec!r}. Expected {expected}.")


def _num(spec: str, param: str, kind: type, lo: float, hi: float | None, what: str) -> float:
    try:
        value = kind(param)
    except ValueError:
        raise _bad(spec, what) from None
    # NaN passes every comparison and inf is no rate or duration: reject both.
    if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
        raise _bad(spec, what)
    return value


def _pair(
    spec: str, param: str, defaults: tuple[str, str | None], kinds: tuple[type, type], what: str
) -> tuple[float, float]:
    """``A[,B]`` (``A,B`` when B has no default) → two numbers ≥ the first's minimum."""
    parts = param.split(",") if param else [defaults[0]]
    if len(parts) == 1 and defaults[1] is not None:
        parts.append(defaults[1])
    if len(parts) != 2:
        raise _bad(spec, what)
    lo = 1 if kinds[0] is int else 0.0
    return _num(spec, parts[0], kinds[0], lo, None, what), _num(
        spec, parts[1], kinds[1], 1 if kinds[1] is int else 0.0, None, what
    )


def _switch(name: str, field: str, hook: str, summary: str | None = None) -> Fault:
    """A fault without a parameter: its field is True when on."""

    def parse(spec: str, param: str) -> dict[str, Any]:
        if param:
            raise _bad(spec, f"{name} without a parameter")
        return {field: True}

    return Fault(name, name, summary, ((field, "bool", False),), parse, hook)


def _number(
    name: str,
    field: str,
    param: str,
    default: str,
    kind: type,
    lo: float,
    hi: float | None,
    what: str,
    hook: str,
    summary: str | None = None,
) -> Fault:
    """A fault with one number (``default`` when not given), ``lo <= it <= hi``."""

    def parse(spec: str, value: str) -> dict[str, Any]:
        x = _num(spec, value or default, kind, lo, hi, f"{name}:{what}")
        return {field: int(x) if kind is int else x}

    typ = f"{kind.__name__} | None"
    return Fault(name, f"{name}[:{param}={default}]", summary, ((field, typ, None),), parse, hook)


def _leak_memory(spec: str, param: str) -> dict[str, Any]:
    what = "leak-memory:BYTES_PER_REQUEST[,EVERY_N_REQUESTS] with BYTES >= 1, N >= 1"
    nbytes, every = _pair(spec, param, ("4096", "1"), (int, int), what)
    return {"leak_memory_bytes": int(nbytes), "leak_memory_every": int(every)}


def _stall(spec: str, param: str) -> dict[str, Any]:
    what = "stall:PERIOD_S,HOLD_S with 0 < HOLD_S < PERIOD_S"
    period, hold = _pair(spec, param or "10,0.5", ("10", None), (float, float), what)
    if not 0 < hold < period:
        raise _bad(spec, what)
    return {"stall": (period, hold)}


def _late_leak(spec: str, param: str) -> dict[str, Any]:
    what = "late-leak:BYTES_PER_REQUEST[,AFTER_S] with BYTES >= 1 and AFTER_S >= 0"
    nbytes, after = _pair(spec, param, ("4096", "30"), (int, float), what)
    return {"late_leak": (int(nbytes), after)}


def _late_errors(spec: str, param: str) -> dict[str, Any]:
    what = "late-errors:AFTER_S[,P] with AFTER_S >= 0 and 0 <= P <= 1"
    after, p = _pair(spec, param, ("30", "1"), (float, float), what)
    if p > 1:
        raise _bad(spec, what)
    return {"late_errors": (after, p)}


_P = "P with 0 <= P <= 1"
_GAP = "GAP_S with GAP_S >= 0.2"
_BATCHER = "the batcher's config (app.py)"
_STALLS = "FaultRuntime.watch_stalls (a task on the event loop)"

# Every fault, in the order FaultSet's fields, --help and GET /v2's "faults" list them.
FAULTS: tuple[Fault, ...] = (
    Fault(
        "leak-memory",
        "leak-memory[:BYTES[,EVERY]=4096,1]",
        None,
        (("leak_memory_bytes", "int | None", None), ("leak_memory_every", "int", 1)),
        _leak_memory,
        "FaultRuntime.on_request: BYTES retained every EVERYth request",
    ),
    _number(
        "leak-threads", "leak_threads_every", "N", "100", int, 1, None,
        "EVERY_N_REQUESTS, N >= 1", "FaultRuntime.on_request: a parked thread every N requests",
    ),
    _number(
        "leak-fds", "leak_fds_every", "N", "100", int, 1, None,
        "EVERY_N_REQUESTS, N >= 1", "FaultRuntime.on_request: an open fd every N requests",
    ),
    _switch("no-batching", "no_batching", f"{_BATCHER}: one request per batch"),
    _switch("unbounded-queue", "unbounded_queue", f"{_BATCHER}: never sheds"),
    _switch("ignore-priority", "ignore_priority", f"{_BATCHER}: one FIFO for every level"),
    _number(
        "cross-wire", "cross_wire_p", "P", "0.05", float, 0.0, 1.0, _P,
        f"{_BATCHER}: outputs swapped within a batch",
    ),
    _number(
        "slow-start", "slow_start_s", "SECONDS", "5", float, 0.0, None, "SECONDS >= 0",
        "the model's load_delay_s (models.py): lazy init on the first request",
    ),
    Fault(
        "stall",
        "stall[:PERIOD_S,HOLD_S=10,0.5]",
        None,
        (("stall", "tuple[float, float] | None", None),),
        _stall,
        "FaultRuntime.start: a thread holds the GIL HOLD_S every PERIOD_S",
    ),
    Fault(
        "late-leak",
        "late-leak[:BYTES[,AFTER_S]=4096,30]",
        "leak only from AFTER_S after ready",
        (("late_leak", "tuple[int, float] | None", None),),
        _late_leak,
        "FaultRuntime.on_request, from AFTER_S after ready",
    ),
    _number(
        "stale-output", "stale_output_p", "P", "0.02", float, 0.0, 1.0, _P,
        "FaultRuntime.after_batch", "answer with the previous batch's output",
    ),
    _number(
        "error-rate", "error_rate_p", "P", "0.05", float, 0.0, 1.0, _P,
        "FaultRuntime.after_batch", "500 for that request",
    ),
    _switch(
        "serialize", "serialize", "FaultRuntime.wrap_run",
        "one lock around every model execution",
    ),
    _number(
        "slowdown", "slowdown_ms_per_min", "MS_PER_MIN", "20", float, 0.0, None,
        "MS_PER_MIN with MS_PER_MIN >= 0", "FaultRuntime.wrap_run",
        "each batch slower by MS_PER_MIN ms per minute since ready",
    ),
    _switch(
        "fifo-dispatch", "fifo_dispatch", f"{_BATCHER}: batches in arrival order",
        "priority at admission only",
    ),
    _number(
        "backoff-batching", "backoff_batching_grow_s", "GROW_S", "1", float, 0.001, None,
        "GROW_S with GROW_S > 0", f"{_BATCHER}: backoff_grow_s",
        "a queue overflow halves the batch cap, regained one slot per GROW_S",
    ),
    _number(
        "cold-errors", "cold_errors", "N", "10", int, 1, None, "N_REQUESTS, N >= 1",
        "FaultRuntime.refuse_cold", "the first N inference requests answered 503",
    ),
    _number(
        "stall-trip", "stall_trip_gap_s", "GAP_S", "1", float, 0.2, None, _GAP, _STALLS,
        "a stall trips one request per batch for good",
    ),
    _number(
        "stall-abandon", "stall_abandon_gap_s", "GAP_S", "1", float, 0.2, None, _GAP, _STALLS,
        "a stall orphans the queued requests",
    ),
    _number(
        "stall-respawn", "stall_respawn_gap_s", "GAP_S", "1", float, 0.2, None, _GAP, _STALLS,
        "a stall starts a new worker pool, the old one left running",
    ),
    _switch(
        "no-drain", "no_drain", "the SIGTERM handler (serve.py): os._exit at once",
        "SIGTERM exits at once",
    ),
    _switch(
        "exit-hang", "exit_hang", "FaultRuntime.start_exit_hang",
        "a non-daemon thread keeps the process alive after the drain",
    ),
    _switch(
        "reset-leak", "reset_leak", "FaultRuntime.http_protocol",
        "a socket leaked per client reset",
    ),
    _switch(
        "io-lock", "io_lock", "FaultRuntime.io_lock (held while app.py reads the body)",
        "a global lock held across reading the request body",
    ),
    _number(
        "reset-breaker", "reset_breaker_open_s", "OPEN_S", "15", float, 0.1, None,
        "OPEN_S with OPEN_S >= 0.1", "FaultRuntime.http_protocol, FaultRuntime.breaker_open",
        "a circuit breaker tripped by client connection resets, answering 503 for OPEN_S",
    ),
    Fault(
        "late-errors",
        "late-errors[:AFTER_S[,P]=30,1]",
        "from AFTER_S after ready, 500 with probability P",
        (("late_errors", "tuple[float, float] | None", None),),
        _late_errors,
        "FaultRuntime.after_batch, from AFTER_S after ready",
    ),
    _number(
        "batch-errors", "batch_errors_min", "MIN_BATCH", "2", int, 2, None,
        "MIN_BATCH, MIN_BATCH >= 2", "FaultRuntime.after_batch",
        "500 for every request of a batch of MIN_BATCH or more",
    ),
)  # fmt: skip


def fault_help(faults: tuple[Fault, ...], details: str) -> str:
    """The ``--fault`` help text of a catalog whose details live in ``details``."""
    return (
        "test-only defect switch (repeatable), defaults after '=': "
        + ", ".join(f.usage + (f" ({f.summary})" if f.summary else "") for f in faults)
        + f"; details in {details}"
    )


def fault_set_class(faults: tuple[Fault, ...], name: str, module: str) -> type:
    """The frozen dataclass of one catalog's switches: every fault's fields, off by
    default, with ``names()`` (canonical ``NAME[:PARAM]`` of the active faults, in
    declaration order) and truth when any is on."""

    def names(self: Any) -> list[str]:
        return [shown for f in faults if (shown := f.shown(self)) is not None]

    def any_on(self: Any) -> bool:
        return bool(self.names())

    return dataclasses.make_dataclass(
        name,
        [(n, typ, dataclasses.field(default=off)) for f in faults for n, typ, off in f.fields],
        frozen=True,
        namespace={"names": names, "__bool__": any_on, "__module__": module},
    )


def fault_parser(faults: tuple[Fault, ...], fault_set: type) -> Callable[[Iterable[str]], Any]:
    """Parse repeated ``--fault NAME[:PARAM]`` values into a ``fault_set``."""
    by_name = {f.name: f for f in faults}

    def parse(specs: Iterable[str]) -> Any:
        kw: dict[str, Any] = {}
        for spec in specs:
            name, _, param = spec.partition(":")
            fault = by_name.get(name)
            if fault is None:
                raise _bad(spec, f"NAME[:PARAM] with NAME one of {', '.join(by_name)}")
            kw.update(fault.parse(spec, param))
        return fault_set(**kw)

    return parse


# public names for other catalogs (harness_reference_server/llm/faults.py)
switch_fault = _switch
number_fault = _number

FAULT_NAMES: tuple[str, ...] = tuple(f.name for f in FAULTS)
FAULT_HELP = fault_help(FAULTS, "harness_reference_server/fault_catalog.py")
# The switches of one server: every fault's fields, off by default.
FaultSet = fault_set_class(FAULTS, "FaultSet", __name__)
parse_faults = fault_parser(FAULTS, FaultSet)
