"""The records of a results document, and the readers every consumer uses.

One ``TypedDict`` per record (scenario, stage, class, counters, window, check, series …):
the JSON is exactly these dicts, so the load side builds a scenario result by calling the
record types, the checks and the reports read it with ``harness.results.readers``, and
``harness.results.schema`` derives ``schemas/results.v1.json`` from the same types. A key
marked ``NotRequired`` is absent from documents written before it existed (or, for
``validity``/``sut``/``loadgen`` of a scenario, until a later step adds it). Meaning of
every field: docs/outputs.md.

The derived numbers stored in the document (window percentiles, the linearity USL fit)
are computed once, in ``harness.results.readers``.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from harness.results.peak_records import PeakSection, TuneSection

Verdict = Literal["pass", "fail", "invalid", "not_judged"]


class Counters(TypedDict):
    """Request accounting: ``scheduled = ok + sum(failed) + dropped + in_flight + aborted``."""

    scheduled: int
    ok: int
    dropped: int
    in_flight: int
    failed: dict[str, int]  # by kind: http_503, http_500, timeout, connection, …
    failed_total: NotRequired[int]
    # streams the load's client aborts hung up on mid-stream (harness.load.stream_aborts):
    # neither served nor failed; present only when there were some
    aborted: NotRequired[int]


class ClassLatency(TypedDict):
    """One traffic class in ``by_class`` or ``by_stage[stage]``."""

    counters: Counters
    latency_hdr: str | None  # ok responses, µs HDR (hdr.encode); null when none


class Stage(TypedDict):
    name: str
    start_s: float
    end_s: float
    kind: Literal["open", "closed"]
    rate_rps: float | None  # open loop, resolved
    users: int | None  # closed loop
    rate: NotRequired[str | None]  # as written ("0.6x")
    threads: NotRequired[int | None]  # server threads of a linearity stage
    warmup_s: NotRequired[float]


class TrafficClass(TypedDict):
    priority: int  # 1 = highest (Triton convention), 0 = none
    share: float
    timeout_us: int | None


# ``class`` is a keyword: the functional form keeps the JSON key.
WindowRow = TypedDict(
    "WindowRow",
    {
        "t": float,  # window start, s
        "class": str,
        "scheduled": NotRequired[int],
        "n": int,  # completed requests
        "ok": int,
        "errors": dict[str, int],
        "aborted": NotRequired[int],  # streams the client hung up on (not in n nor errors)
        "p50_ms": float | None,  # of ok responses in the window, hdr's nearest rank
        "p90_ms": float | None,
        "p99_ms": float | None,
        "max_ms": float | None,
        "late": NotRequired[bool],  # a straggler summarised after its window
        # a streaming protocol's token figures of the streams sent in the window: output
        # tokens (failed streams' included) per second of window, TTFT / TPOT of the ok ones
        "tokens_out_per_s": NotRequired[float],
        "ttft_p50_ms": NotRequired[float | None],
        "ttft_p99_ms": NotRequired[float | None],
        "tpot_p50_ms": NotRequired[float | None],
        "tpot_p99_ms": NotRequired[float | None],
    },
)


class Windows(TypedDict):
    width_s: float
    rows: list[WindowRow]


class FirstRequests(TypedDict):
    """The first N requests sent; counters in the shape of ``Counters`` (newer results)."""

    n: int
    latency_hdr: str | None
    scheduled: NotRequired[int]
    ok: NotRequired[int]
    dropped: NotRequired[int]
    in_flight: NotRequired[int]
    failed: NotRequired[dict[str, int]]
    aborted: NotRequired[int]
    failed_total: NotRequired[int]


class Integrity(TypedDict):
    checked: int
    ok: int
    drift: int
    cross_wired: int
    id_mismatch: int
    examples: list[dict[str, Any]]
    verified: NotRequired[bool]
    tolerance: NotRequired[float | None]
    pool: NotRequired[int | None]
    distinct: NotRequired[int | None]
    # how the golden outputs were had: "fetched", or "kept: …" saying from where
    golden: NotRequired[str | None]


class LinearityPoint(TypedDict):
    n: int
    throughput_rps: list[float]  # one per replicate


class UslParams(TypedDict):
    """The USL fit of ``linearity.points`` (harness.analysis.linearity.fit_usl)."""

    lam: float  # X(1), measured
    sigma: float  # contention
    kappa: float  # coherency
    n_peak: float | None  # N* = √((1−σ)/κ); null when unbounded (κ = 0)
    x_peak: float | None  # X(N*); null when unbounded
    rmse: float


class Linearity(TypedDict):
    points: list[LinearityPoint]
    cores_available: int | None
    vary: NotRequired[Literal["threads", "users"]]
    usl: NotRequired[UslParams | None]  # null when it cannot be fitted (no N=1 or N>1)


class ContentionBlock(TypedDict):
    kind: str  # baseline | hog | after
    start_s: float
    end_s: float
    stage: NotRequired[str | None]


class Contention(TypedDict):
    blocks: list[ContentionBlock]
    warmup_s: NotRequired[float]


class ChaosEvent(TypedDict):
    action: str  # cpu_hog | pause | kill
    params: dict[str, Any]
    start_s: float | None
    end_s: float | None
    ok: bool
    error: str | None
    at_s: NotRequired[float | None]
    detail: NotRequired[dict[str, Any] | None]


# A sampled series: ``t`` (s since the sampler started) plus one list per quantity,
# aligned with ``t``, ``null`` where a tick has no value.
Series = dict[str, list[Any]]


class ThreadSamples(TypedDict):
    tid: int
    name: str
    cpu_pct_mean: float | None
    cpu_pct_max: float | None
    series: Series
    wait_pct_mean: NotRequired[float | None]
    cswch_s_mean: NotRequired[float | None]
    nvcswch_s_mean: NotRequired[float | None]


class ServerSamples(TypedDict):
    pid: int | None
    interval_s: float | None
    ticks: int | None
    missed_ticks: int | None
    series: Series
    threads_top: list[ThreadSamples]
    started_unix: NotRequired[float | None]
    stopped_unix: NotRequired[float | None]
    finished: NotRequired[bool]
    log_tail: NotRequired[str | None]  # the sampler's last log lines when it did not finish
    tick_errors: NotRequired[int]  # sampler ticks that raised (it went on)
    last_error: NotRequired[str | None]  # the last such tick's cause


class SystemSamples(TypedDict):
    series: Series
    started_unix: NotRequired[float | None]
    loadgen_processes: NotRequired[list[dict[str, Any]]]
    # the busiest processes outside the run where its cores were busy with something
    # else: {t, pid, name, cpu_pct} (series.other_cpu_pct is that unattributed CPU)
    foreign_processes: NotRequired[list[dict[str, Any]]]


class Metrics(TypedDict):
    series: dict[str, Series]  # "name{labels}" → {t, v}


class Check(TypedDict):
    """A check object (docs/outputs.md), written by ``harness.checks``."""

    id: str
    passed: bool | None  # null: not evaluated (never a pass)
    value: float | None
    threshold: float | None
    op: str
    unit: str
    n: int | None
    detail: str
    skipped: str | None
    # a skip the user accepted (--allow-skip, the checklist's allow_skip or enabled =
    # false): it does not stop the scenario's pass, and the verdict line names it
    accepted: NotRequired[bool]


class ServerStatsStage(TypedDict):
    """One stage's share of the server's statistics: the differences of its cumulative
    counters between the reads at the stage's start and end (means are per request)."""

    start_s: float  # scenario clock of the read that opened the stage
    end_s: float  # … and of the one that closed it
    requests: int  # finished by the model in between: success + fail
    success: int
    fail: int
    executions: int  # model executions (batches)
    avg_batch: float | None  # inferences (rows) per execution
    queue_ms: float | None  # mean wait from enqueue to its batch starting (successes)
    compute_ms: float | None  # mean compute_input + compute_infer + compute_output
    compute_infer_ms: float | None  # mean model time (a batch's, counted per request)
    request_ms: float | None  # mean enqueue → answer on the server (successes)


class ServerStats(TypedDict):
    """``server_stats``: the server's own queue vs compute split per stage (its
    protocol's statistics endpoint: Triton's statistics extension for KServe V2), absent
    when the server does not offer it."""

    source: str  # the protocol's name for its statistics endpoint, e.g. "v2-statistics"
    url: str
    model: str
    stages: dict[str, ServerStatsStage]
    missing: NotRequired[dict[str, str]]  # stage → why it has no figures


class Tokens(TypedDict):
    """``tokens``: a streaming protocol's per-request token statistics
    (``harness.load.stream_recording.StreamStats.summary``), by traffic class and by stage:
    counts (requests, ok, failed, tokens in and out, streams verified and wrong), goodput,
    every problem code seen, and TTFT / TPOT / inter-token / end-to-end / longest-gap
    percentiles in ms. Absent for a protocol that does not stream. ``by_stage_class``:
    {stage: {class: the same figures}} (absent from results written before it)."""

    by_class: dict[str, Any]
    by_stage: dict[str, Any]
    by_stage_class: NotRequired[dict[str, dict[str, Any]]]


class Load(TypedDict):
    mode: Literal["open", "closed"]
    arrival: str
    request_timeout_s: float
    max_in_flight: int | None
    seed: int | None
    workers: int
    scheduled_by_worker: dict[str, int]
    cpu_s_by_worker: NotRequired[dict[str, float]]
    cpu_cores_mean: NotRequired[float | None]


class ScenarioResult(TypedDict):
    """``scenarios[i]``: one scenario run (built by harness.load.result)."""

    name: str
    file: str
    mode: str
    started_unix: float | None
    duration_s: float
    partial: bool
    capacity_rps: float | None
    check_config: dict[str, dict[str, Any]]
    time_to_ready_s: float | None
    stages: list[Stage]
    classes: dict[str, TrafficClass]
    counters: Counters
    by_class: dict[str, ClassLatency]
    by_stage: dict[str, dict[str, ClassLatency]]
    windows: Windows | None
    first_requests: FirstRequests | None
    dispatch_lag_hdr: str | None
    error_latency_hdr: str | None
    integrity: Integrity | None
    linearity: Linearity | None
    contention: Contention | None
    chaos: list[ChaosEvent]
    server: ServerSamples | None
    system: SystemSamples | None
    metrics: Metrics | None
    checks: list[Check]
    verdict: Verdict | None
    description: NotRequired[str]
    error: NotRequired[dict[str, Any] | None]
    sut_exit: NotRequired[dict[str, Any] | None]
    calibration: NotRequired[dict[str, Any] | None]
    fresh_sut: NotRequired[bool]
    load: NotRequired[Load]
    latency_hdr: NotRequired[str | None]
    validity: NotRequired[list[str]]  # added when judged
    # the checks that answer the scenario's question: a pass needs each judged, or its
    # skip accepted (``allow_skip``); absent in older documents (then: any own check)
    defined_by: NotRequired[list[str]]
    sut: NotRequired[dict[str, Any] | None]  # merged runs: this scenario's own server
    loadgen: NotRequired[dict[str, Any] | None]
    server_stats: NotRequired[ServerStats]  # the server's statistics extension
    tokens: NotRequired[Tokens]  # a streaming protocol's token statistics
    attempts: NotRequired[list[Attempt]]  # earlier attempts set aside as invalid
    # what validity could not judge for want of a measurement (another tenant's CPU when
    # no sampler ran): said with the verdict, not a reason the run is invalid
    not_measured: NotRequired[list[str]]


class Attempt(TypedDict):
    """An earlier attempt of the scenario, invalid only because the machine was disturbed
    (requests that left late, another tenant's CPU) and run again (``--retry-invalid``);
    its whole directory is kept as ``dir`` beside the scenario's."""

    attempt: int
    verdict: Literal["invalid"]
    validity: list[str]
    dir: str
    started_unix: float | None
    elapsed_s: float


class Excluded(TypedDict):
    """A planned scenario that did not run: left out before load (preflight) or stopped by
    a configuration error found while preparing it."""

    name: str
    reason: str
    # true when its absence does not stop a pass: this machine cannot host its question
    # (linearity with one server core) or the user accepted it (--allow-skip); false makes
    # the run's verdict at best "not_judged"
    optional: NotRequired[bool]


class Machine(TypedDict):
    """Where the numbers were measured (``compare`` matches machines on the CPU, not on the
    hostname; merging needs every field equal)."""

    host: str
    cpu_count: int | None
    affinity: list[int] | None
    python: str
    platform: str
    harness_version: str
    cpu_model: NotRequired[str | None]  # /proc/cpuinfo "model name"
    governor: NotRequired[str | None]  # cpufreq scaling governor; None in most VMs


class Tls(TypedDict):
    ca_cert: str | None  # the --ca-cert file; None = the system's CAs
    verify: bool  # False with --insecure


class Agent(TypedDict):
    """``harness agent`` on the server's host (``--agent URL``): the sampler and the chaos
    actions ran there. ``clock_offset_s`` = the agent's clock − the master's, measured at
    connect from the round trip with the shortest ``rtt_s`` (error ≤ rtt_s / 2); sample
    times were moved onto the master's clock by it."""

    url: str
    host: str
    cpu_model: str | None
    cores: int | None
    allow: list[str]
    lease_s: float
    clock_offset_s: float
    rtt_s: float
    netns: NotRequired[str | None]  # the agent's network namespace, net:[inode]


class Sut(TypedDict):
    """The server under test (an open map: ``config`` is what the server says)."""

    target: NotRequired[str | None]
    pid: NotRequired[int | None]
    cmd: NotRequired[str | None]
    model: NotRequired[str | None]
    cores: NotRequired[list[int] | None]
    config: NotRequired[dict[str, Any]]
    headers: NotRequired[list[str]]  # the --header NAMES sent; never their values
    tls: NotRequired[Tls | None]  # https:// targets
    metrics_url: NotRequired[str | None]  # --metrics-url when given
    agent: NotRequired[Agent]  # the server on another host, through `harness agent`


class Document(TypedDict):
    """The whole ``results.json`` (the envelope is built by ``new_document``)."""

    schema: str
    harness_version: str
    created: str
    verdict: Verdict | None
    partial: bool
    machine: Machine
    sut: Sut | None
    loadgen: dict[str, Any] | None
    scenarios: list[ScenarioResult]
    excluded: NotRequired[list[Excluded]]
    not_run: NotRequired[list[str]]
    # check ids and scenario names whose skip or absence the user accepted (--allow-skip)
    allow_skip: NotRequired[list[str]]
    peak: NotRequired[PeakSection]  # harness peak (harness.results.peak_records)
    tune: NotRequired[TuneSection]  # harness tune
