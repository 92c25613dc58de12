"""Server-side collectors: they record and never judge (docs/architecture.md)."""

from harness.collectors.metrics import MetricsScraper, ScrapeConfig
from harness.collectors.process import ProcessSampler, ProcessTick, ThreadRow
from harness.collectors.runner import SamplerConfig, SamplingSession
from harness.collectors.samples import read_samples
from harness.collectors.system import SystemSampler, SystemTick

__all__ = [
    "MetricsScraper",
    "ProcessSampler",
    "ProcessTick",
    "SamplerConfig",
    "SamplingSession",
    "ScrapeConfig",
    "SystemSampler",
    "SystemTick",
    "ThreadRow",
    "read_samples",
]
