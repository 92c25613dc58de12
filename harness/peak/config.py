"""What ``harness peak`` was asked (``PeakConfig``) and the scenario one point runs.

A point is one open-loop Poisson stage (``POINT_STAGE``) after a warmup stage at the
same rate, judged by the steady-state checks at the SLO; it lasts long enough for the
early-stopping sample count at the asked confidence (``search.samples_needed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError
from harness.peak.search import samples_needed
from harness.results.peak_records import slo_text

POINT_STAGE = "point"


@dataclass(frozen=True)
class PeakConfig:
    """What ``harness peak`` was asked (validated: ``validate()`` raises ConfigError)."""

    slo_p99_ms: float
    max_error_rate: float = 0.01
    confidence: float = 0.95
    tolerance: float = 0.05
    repeats: int = 3
    start_rps: float | None = None
    warmup_s: float = 3.0
    min_point_s: float = 5.0
    max_point_s: float = 60.0
    max_points: int = 30
    request_timeout_s: float | None = None
    seed: int = 1
    # tune: below this rate a configuration is out of the running (its peak is "below
    # floor_rps", not searched further: a dominated configuration costs few points)
    floor_rps: float | None = None
    # the refine phase (search.SearchParams.precision): harness peak's --precision; None
    # for tune and --capacity=peak, whose answers are [L, U] from the repeats alone
    precision: float | None = None
    # harness peak's --searches: K > 1 searches, each on a freshly started server (when
    # the harness starts it), the peak their mean and its interval from their spread
    # (search.searches_interval); each search without a refine phase
    searches: int = 1
    # an LLM server judged in tokens (--protocol openai): a point meets its SLO when the
    # p99 time to first token and the p99 time per output token hold (llm.ttft_p99,
    # llm.tpot_p99) and the share of whole answers is at least 1 - max_error_rate
    # (llm.goodput); ``slo_p99_ms`` is then the TTFT bound (the curve's SLO line)
    slo_tpot_ms: float | None = None

    @property
    def in_tokens(self) -> bool:
        """Whether points are judged in tokens (an OpenAI-compatible streaming server)."""
        return self.slo_tpot_ms is not None

    def slo_text(self) -> str:
        """The SLO as a sentence fragment: "p99 <= 100 ms over all requests" or "TTFT p99
        <= 2000 ms and TPOT p99 <= 100 ms"."""
        return slo_text(self.slo_p99_ms, self.slo_tpot_ms)

    def validate(self) -> PeakConfig:
        def bad(flag: str, value: Any, valid: str) -> ConfigError:
            return ConfigError(f"{flag} has value {value!r}; expected {valid}")

        if not (self.slo_p99_ms > 0 and math.isfinite(self.slo_p99_ms)):
            flag = "--slo-ttft-ms" if self.in_tokens else "--slo-p99-ms"
            raise bad(flag, self.slo_p99_ms, "a latency in ms > 0, e.g. 100")
        if self.slo_tpot_ms is not None and not (
            self.slo_tpot_ms > 0 and math.isfinite(self.slo_tpot_ms)
        ):
            raise bad("--slo-tpot-ms", self.slo_tpot_ms, "a time per token in ms > 0, e.g. 100")
        if not 0 <= self.max_error_rate < 1:
            raise bad("--max-error-rate", self.max_error_rate, "a fraction in [0, 1), e.g. 0.01")
        if not 0.5 <= self.confidence < 1:
            raise bad("--confidence", self.confidence, "a probability in [0.5, 1), e.g. 0.95")
        if not 0 < self.tolerance < 1:
            raise bad("--tolerance", self.tolerance, "a fraction in (0, 1), e.g. 0.05")
        if not 1 <= self.repeats <= 10:
            raise bad("--repeats", self.repeats, "an integer in 1..10, e.g. 3")
        if self.start_rps is not None and not self.start_rps > 0:
            raise bad("--start-rps", self.start_rps, "a rate in req/s > 0")
        if not (self.warmup_s >= 0 and 0 < self.min_point_s <= self.max_point_s):
            raise bad(
                "--point-s",
                (self.min_point_s, self.max_point_s),
                "0 < min <= max seconds per point",
            )
        if self.max_points < 2:
            raise bad("--max-points", self.max_points, "an integer >= 2")
        if self.precision is not None and not 0 < self.precision < 1:
            raise bad("--precision", self.precision, "a fraction in (0, 1), e.g. 0.15")
        if not 1 <= self.searches <= 20:
            raise bad("--searches", self.searches, "an integer in 1..20, e.g. 6")
        if self.searches > 1 and self.precision is not None:
            raise ConfigError(
                "--precision and --searches > 1 are both set; give one: with several searches "
                "the interval comes from their spread (--precision 0 or --searches 1)"
            )
        return self

    @property
    def samples(self) -> int:
        return samples_needed(self.confidence)

    def point_seconds(self, rate: float, longer: bool = False) -> float:
        """Measured seconds at ``rate`` for ``samples`` requests (doubled when the last
        try had too few), within [min_point_s, max_point_s]."""
        need = self.samples * (2 if longer else 1) / max(rate, 1e-9)
        hi = self.max_point_s * (2 if longer else 1)
        return round(min(hi, max(self.min_point_s, need)), 2)


def point_scenario(cfg: PeakConfig, rate: float | None, seconds: float) -> str:
    """The TOML of one point: one open-loop Poisson stage (``rate`` None: half the
    calibrated capacity, "0.5x"), judged by the steady-state checks at the SLO — or, in
    tokens, a stream of the ``[llm]`` table's default workload judged by llm.ttft_p99 and
    llm.tpot_p99 at the SLOs and llm.goodput at 1 - max_error_rate (each with its own
    100-request minimum: a plain p99, not MLPerf's early-stopping bound). In tokens the
    probe runs streams of that workload (``harness.load.calibrate``, ``streams``)."""
    stage = f'stage = "{POINT_STAGE}"'
    if cfg.in_tokens:
        load = 'protocol = "openai"\nmode = "open"\narrival = "poisson"\n'
        checks = (
            f'"llm.ttft_p99" = {{ {stage}, threshold = {cfg.slo_p99_ms:g} }}\n'
            f'"llm.tpot_p99" = {{ {stage}, threshold = {cfg.slo_tpot_ms:g} }}\n'
            f'"llm.goodput" = {{ {stage}, threshold = {1.0 - cfg.max_error_rate:g} }}\n'
            '"llm.stream_integrity" = {}\n'
        )
    else:
        load = 'mode = "open"\narrival = "poisson"\n'
        checks = (
            f'"steady.p99_ms" = {{ {stage}, threshold = {cfg.slo_p99_ms:g}, '
            f"confidence = {cfg.confidence:g} }}\n"
            f'"steady.error_rate" = {{ {stage}, threshold = {cfg.max_error_rate:g} }}\n'
            f'"steady.throughput" = {{ {stage} }}\n'
        )
    rate_text = '"0.5x"' if rate is None else f"{rate:.3f}"
    timeout = f"request_timeout_s = {cfg.request_timeout_s:g}\n" if cfg.request_timeout_s else ""
    # the warmup is a stage of its own at the same rate (one continuous open loop): the
    # checks judge the point stage only, so the queue's fill-up is never in its figures
    warmup = (
        f'[[stages]]\nname = "warmup"\nduration_s = {cfg.warmup_s:.2f}\nrate = {rate_text}\n\n'
        if cfg.warmup_s > 0
        else ""
    )
    return (
        "# generated by `harness peak`: one point of the peak search\n"
        'name = "peak_point"\n'
        'description = "One open-loop point of the peak search"\n\n'
        "[load]\n"
        f"{load}"
        f"seed = {cfg.seed}\n" + ("" if cfg.in_tokens else "calibration_s = 5\n") + f"{timeout}\n"
        f"{warmup}"
        "[[stages]]\n"
        f'name = "{POINT_STAGE}"\n'
        f"duration_s = {seconds:.2f}\n"
        f"rate = {rate_text}\n\n"
        "[checks]\n"
        f"{checks}"
        '"accounting.balanced" = {}\n'
    )
