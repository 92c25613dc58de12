"""Reports rendered from a results document: junit.xml, summary.md, report.html, compare.

``render_all(doc, out_dir)`` writes the three report files; ``render_dir(dir)`` is what
``harness report DIR`` runs. Reports read the document only, so they can be re-rendered
on a machine that never ran the test.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.primitives import atomic_write
from harness.results import load_document

RESULTS_FILE = "results.json"
JUNIT_FILE = "junit.xml"
SUMMARY_FILE = "summary.md"
HTML_FILE = "report.html"


def _write(path: Path, text: str) -> Path:
    # Same temp-and-replace as results.json: a CI step reading the file never sees half of it.
    atomic_write(path, text)
    return path


def render_all(
    doc: Mapping[str, Any], out_dir: str | os.PathLike[str], html: bool = True
) -> dict[str, Path]:
    """Write junit.xml, summary.md and (``html``) report.html for ``doc`` into ``out_dir``."""
    # Imported here so that `harness run`/`compare` do not pay matplotlib's import time.
    from harness.report.junit import render_junit
    from harness.report.summary import render_summary

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {
        "junit": _write(out / JUNIT_FILE, render_junit(doc)),
        "summary": _write(out / SUMMARY_FILE, render_summary(doc)),
    }
    if html:
        from harness.report.html import render_html

        written["html"] = _write(out / HTML_FILE, render_html(doc))
    return written


def render_dir(directory: str | os.PathLike[str]) -> dict[str, Path]:
    """Re-render the reports of ``directory`` from its results.json (``harness report DIR``):
    a run's three, or a ``harness peak`` / ``harness tune`` directory's summary.md and
    report.html as those commands wrote them."""
    d = Path(directory)
    doc = load_document(d / RESULTS_FILE)
    if doc.get("tune") or doc.get("peak"):
        from harness.report import peak, tune

        md, html = (
            (tune.tune_markdown, tune.tune_html)
            if doc.get("tune")
            else (peak.peak_markdown, peak.peak_html)
        )
        return {
            "summary": _write(d / SUMMARY_FILE, md(doc)),
            "html": _write(d / HTML_FILE, html(doc)),
        }
    return render_all(doc, d)


__all__ = ["HTML_FILE", "JUNIT_FILE", "RESULTS_FILE", "SUMMARY_FILE", "render_all", "render_dir"]
