"""The reports of ``harness peak`` and ``harness tune`` live with the other reports:
``harness.report.peak`` and ``harness.report.tune``. The sentences the CLI prints are
here under their old names for its imports."""

from harness.report.peak import peak_html, peak_markdown, peak_sentence
from harness.report.tune import tune_html, tune_markdown, tune_sentence

__all__ = [
    "peak_html",
    "peak_markdown",
    "peak_sentence",
    "tune_html",
    "tune_markdown",
    "tune_sentence",
]
