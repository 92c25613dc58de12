"""Poll a Prometheus ``/metrics`` URL and keep the chosen series (the SUT's queue depth,
batch sizes, process metrics) — the way to watch a server on another host.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.collectors.loop import CsvStream, TickLoop

METRICS_COLUMNS = ["t", "ts", "name", "labels", "value"]
# LLM servers: KV-cache usage, preemptions, token counters and the sums and counts of their
# TTFT / inter-token histograms (vLLM's vllm:*, SGLang's sglang:token_usage, TGI's tgi_*)
DEFAULT_MATCH = (
    r"queue|batch|process_|request|kv_cache|preempt|_tokens|token_usage"
    r"|time_to_first_token|inter_token|time_per_output_token"
)
# Histogram buckets and _created timestamps multiply series without telling much over time.
DEFAULT_EXCLUDE = r"_bucket$|_created$"


@dataclass(frozen=True)
class ScrapeConfig:
    url: str
    interval_s: float = 1.0
    match: str = DEFAULT_MATCH
    exclude: str | None = DEFAULT_EXCLUDE
    timeout_s: float = 2.0


def format_labels(labels: dict[str, str]) -> str:
    """Prometheus style, sorted: ``model="mlp",priority="1"``."""
    return ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))


def series_key(name: str, labels: str) -> str:
    return f"{name}{{{labels}}}" if labels else name


def parse_metrics(
    text: str, match: re.Pattern[str], exclude: re.Pattern[str] | None
) -> list[tuple[str, str, float]]:
    """(sample name, labels, value) for every sample whose name matches and is not excluded."""
    out: list[tuple[str, str, float]] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not match.search(s.name) or (exclude is not None and exclude.search(s.name)):
                continue
            out.append((s.name, format_labels(s.labels), float(s.value)))
    return out


def _fetch(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", "replace")


class MetricsScraper:
    """Scrape on every ``scrape(t, ts)``; ``start()`` runs it on its own thread and schedule
    so a slow ``/metrics`` never delays the process sampler's ticks.
    """

    def __init__(
        self,
        config: ScrapeConfig,
        out_dir: str | Path | None = None,
        *,
        fetch: Callable[[str, float], str] = _fetch,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        recent: int = 600,
    ) -> None:
        self.config = config
        self._match = re.compile(config.match)
        self._exclude = re.compile(config.exclude) if config.exclude else None
        self._fetch = fetch
        self._clock = clock
        self._wall = wall
        self.errors = 0
        self.last_error: str | None = None
        self.scrapes = 0
        self.recent: deque[tuple[float, list[tuple[str, str, float]]]] = deque(maxlen=recent)
        self._csv = None
        if out_dir is not None:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            self._csv = CsvStream(out / "metrics.csv", METRICS_COLUMNS)
        self._thread: threading.Thread | None = None
        self._loop: TickLoop | None = None

    def scrape(self, t: float, ts: float) -> list[tuple[str, str, float]] | None:
        try:
            text = self._fetch(self.config.url, self.config.timeout_s)
            samples = parse_metrics(text, self._match, self._exclude)
        except Exception as e:  # network, HTTP or parse error: recorded, never fatal
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return None
        self.scrapes += 1
        self.recent.append((t, samples))
        if self._csv is not None:
            self._csv.write([(round(t, 4), ts, n, lab, v) for n, lab, v in samples])
        return samples

    def start(self, t0: float, stop: threading.Event) -> None:
        """Scrape every interval on a daemon thread, on the same time base ``t0`` as the sampler."""
        loop = TickLoop(self.config.interval_s, clock=self._clock, wall=self._wall, stop=stop)
        loop.t0 = t0
        self._loop = loop

        def run() -> None:
            self.scrape(self._clock() - t0, self._wall())
            loop.run(lambda t, _late: self.scrape(t, self._wall()))

        self._thread = threading.Thread(target=run, name="metrics-scraper", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        if self._csv is not None:
            self._csv.close()
