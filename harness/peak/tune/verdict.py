"""The tune's verdict and exit code: the fastest configuration's quick checklist
(``harness acceptance --quick`` on its command), and whether a configuration not measured
leaves the recommendation open (``harness.results.peak_records.verdict_of``)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.errors import ExitCode
from harness.results.peak_records import verdict_of


def conclude(summary: dict[str, Any]) -> ExitCode:
    """The tune's verdict into ``summary`` (``verdict``, ``left_open``); a fastest
    configuration whose quick checklist failed is not recommended. Its exit code."""
    verdict, open_ = verdict_of(summary)
    summary["verdict"] = verdict
    summary["left_open"] = open_
    if (summary.get("checklist") or {}).get("verdict") == "fail":
        summary.update(recommended=None, recommended_cmd=None, tied_with_recommended=[])
    return ExitCode.for_verdict(verdict)


def exit_code(summary: Mapping[str, Any]) -> ExitCode:
    """The tune's verdict (``verdict_of``) as an exit code: 0 pass, 1 fail, 3 invalid,
    4 not judged."""
    return ExitCode.for_verdict(verdict_of(summary)[0])


# `harness acceptance`'s exit code → the checklist's verdict; any other code (2: it could
# not start, a signal) judged nothing
_CHECKLIST_VERDICT = {0: "pass", 1: "fail", 3: "invalid", 4: "not_judged"}


def checklist_argv(
    cmd: str,
    out_dir: Path,
    sut_cores: str | None,
    protocol: str | None = None,
    model: str | None = None,
) -> list[str]:
    """The ``harness acceptance --quick`` command for the recommended configuration: the
    tune's protocol picks its checklist (``--protocol openai``: the one in tokens)."""
    import sys

    argv = [sys.executable, "-m", "harness", "acceptance", "--quick", "--sut-cmd", cmd]
    argv += ["--out", str(out_dir)]
    if sut_cores:
        argv += ["--sut-cores", sut_cores]
    if protocol:
        argv += ["--protocol", protocol]
    if model:
        argv += ["--model", model]
    return argv


def run_checklist(argv: list[str], out_dir: Path) -> dict[str, Any]:
    """Run ``argv`` (``checklist_argv``) as a subprocess: its own exit code and reports in
    ``out_dir``, kept as ``checklist_result`` reads them."""
    import subprocess

    proc = subprocess.run(argv, capture_output=True, text=True)
    return checklist_result(proc.returncode, proc.stdout, proc.stderr, out_dir)


def checklist_result(code: int, stdout: str, stderr: str, out_dir: Path) -> dict[str, Any]:
    """The quick checklist's run as the tune keeps it: its verdict (from its exit code),
    the checks that failed (from its results.json, when it wrote one) and its line."""
    from harness.errors import HarnessError
    from harness.results import load_document

    failed_checks: list[str] = []
    with contextlib.suppress(HarnessError, OSError, ValueError):
        doc = load_document(out_dir / "results.json")
        failed_checks = list(
            dict.fromkeys(
                str(c.get("id"))
                for sc in doc.get("scenarios") or []
                for c in sc.get("checks") or []
                if c.get("passed") is False
            )
        )
    lines = [x for x in stdout.strip().splitlines() if x.strip()]
    verdict_line = next((x for x in lines if x.startswith(_VERDICT_WORDS)), None)
    said = verdict_line or (lines[-1] if lines else stderr.strip()[-300:])
    return {
        "exit_code": code,
        "verdict": _CHECKLIST_VERDICT.get(code, "not_judged"),
        "failed_checks": failed_checks,
        "out": str(out_dir),
        "line": f"`harness acceptance --quick` on it: {said} (exit {code}; {out_dir}/summary.md)",
    }


_VERDICT_WORDS = ("PASS", "FAIL", "INVALID", "NOT JUDGED")
