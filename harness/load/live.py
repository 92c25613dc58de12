"""What a run looks like while it goes: the model behind the web UI's Checklist tab.

``LiveView.snapshot()`` is one dict: the run (its directory, lifecycle state, clock), the
scenario's stages with "now", every check with its value, threshold, sample size and
state, the chaos events as they apply and are undone, the validity warnings, the
server's latest process and per-thread samples (the ``pidstat -t`` view), and the earlier
runs of this Locust process with their verdicts.

The check values come from the code that writes and judges ``results.json``: a live
snapshot builds the partial results document ``finalisation`` would write now (with the
sampler's files read so far) and judges a copy (``harness.finish.judge_live``: the
checks and validity rules of the end of the run);
once the run is judged, the tab shows the judged document itself. While the run goes a
check is **pending** — its value is what the run has measured so far, not a verdict;
the verdict arrives when the run ends, from ``harness judge``.

A session of several runs exits with the worst of them (``session_verdict``): a failed
run is never hidden by a later run that passed.

Cost: a snapshot is computed only when the tab asks, and at most once per
``max(LIVE_EVERY_S, last cost / CPU_BUDGET)`` seconds, so however large the run's samples
grow (a long soak), the tab spends at most ``CPU_BUDGET`` of a core on the load
generator's process. ``cpu_s`` counts what it spent (``bench/webui_cost.py``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import results
from harness.errors import ExitCode, HarnessError
from harness.load.lifecycle import COLLECTING, RunState

if TYPE_CHECKING:
    from harness.load.controller import HarnessState

LIVE_EVERY_S = 5.0  # the shortest interval between two live judgings
CPU_BUDGET = 0.01  # the share of a core the live judging may use on average
TAIL_BYTES = 64 * 1024  # how much of a samples CSV the resources view reads
TOP_THREADS = 8

S = RunState


class LiveView:
    """Snapshots of one Locust process's harness for the web UI (master / local runner)."""

    def __init__(self, state: HarnessState) -> None:
        self.state = state
        self.cpu_s = 0.0  # CPU seconds spent building snapshots (bench/webui_cost.py)
        self.snapshots = 0
        self.polls = 0  # the UI's /stats/requests polls the tab rode on (harness.load.webui)
        self.poll_cpu_s = 0.0  # CPU seconds those polls spent on the tab, snapshots included
        self._cache: dict[str, Any] | None = None
        self._key: tuple[Any, ...] | None = None
        self._next = 0.0
        from harness.finish import load_judging

        load_judging()  # now, not on the first snapshot asked for while the load runs

    def snapshot(self) -> dict[str, Any]:
        """The live model; recomputed when the run changed state or its interval passed."""
        st = self.state
        key = (st.lifecycle.state, str(st.out_dir), len(st.runs))
        now = time.monotonic()
        if self._cache is not None and key == self._key and now < self._next:
            return self._cache
        t0 = time.thread_time()
        self._cache = self._build()
        cost = time.thread_time() - t0
        self.cpu_s += cost
        self.snapshots += 1
        self._key = key
        self._next = now + max(LIVE_EVERY_S, cost / CPU_BUDGET)
        return self._cache

    # -- the parts -------------------------------------------------------------------

    def _build(self) -> dict[str, Any]:
        st = self.state
        sc_doc, judged = self._scenario_doc()
        t = st.scenario_time() if st.origin_unix is not None else None
        return {
            "run": {
                "name": st.out_dir.name,
                "dir": str(st.out_dir),
                "state": st.lifecycle.state.value,
                "scenario": st.scenario.name,
                "mode": st.scenario.mode,
                "elapsed_s": None
                if t is None
                else round(min(max(t, 0.0), st.scenario.duration_s), 1),
                "total_s": round(st.scenario.duration_s, 1),
                "judged": judged,
                "verdict": (sc_doc or {}).get("verdict") if judged else None,
            },
            "stages": self._stages(t),
            "checks": self._checks(sc_doc, judged),
            "chaos": self._chaos(),
            "validity": list((sc_doc or {}).get("validity") or []),
            "server": server_now(st.out_dir / "samples"),
            "runs": [dict(r) for r in st.runs],
        }

    def _scenario_doc(self) -> tuple[dict[str, Any] | None, bool]:
        """The judged scenario result once the run is judged; before that, a live partial
        one judged here (None before the run prepared anything)."""
        st = self.state
        if st.lifecycle.state is S.JUDGED and st.judged_doc is not None:
            scs = st.judged_doc.get("scenarios") or []
            return (scs[0] if scs else None), True
        if st.lifecycle.state not in COLLECTING or st.prep is None:
            return None, False
        from harness.finish import judge_live
        from harness.load import finalisation

        samples = None
        with contextlib.suppress(HarnessError, OSError, ValueError):
            samples = _read_samples(st.out_dir / "samples")
        doc = finalisation.build_document(st, partial=True, samples=samples)
        try:
            return judge_live(doc["scenarios"][0], st.opts.checklist), False
        except (HarnessError, OSError):  # the checklist file went away mid-run
            return judge_live(doc["scenarios"][0]), False

    def _stages(self, t: float | None) -> list[dict[str, Any]]:
        st = self.state
        capacity = st.prep.capacity_rps if st.prep is not None else None
        rows = []
        for stage in st.scenario.stages:
            if stage.kind == "open":
                rps = None
                with contextlib.suppress(HarnessError):  # relative, capacity not yet known
                    rps = stage.rate_rps(capacity)
                load = f"open loop {stage.rate}" + (f" = {rps:.0f} req/s" if rps else "")
            else:
                load = f"closed loop, {stage.users} users"
            if stage.threads:
                load += f", server threads {stage.threads}"
            where = "pending"
            if t is not None:
                where = "done" if t >= stage.end_s else "now" if t >= stage.start_s else "next"
            rows.append(
                {
                    "name": stage.name,
                    "start_s": round(stage.start_s, 1),
                    "end_s": round(stage.end_s, 1),
                    "load": load,
                    "state": where,
                }
            )
        return rows

    def _checks(self, sc: Mapping[str, Any] | None, judged: bool) -> list[dict[str, Any]]:
        if sc is None:  # nothing measured yet: what the scenario will judge
            from harness.catalog import CATALOG

            ids = [*self.state.scenario.checks, *CATALOG.always]
            return [
                {
                    "id": cid,
                    "value": None,
                    "unit": CATALOG[cid].unit if cid in CATALOG else None,
                    "op": CATALOG[cid].op if cid in CATALOG else None,
                    "threshold": None,
                    "n": None,
                    "state": "pending",
                    "so_far": None,
                    "detail": CATALOG[cid].summary if cid in CATALOG else None,
                }
                for cid in dict.fromkeys(ids)
            ]
        rows = []
        for c in sc.get("checks") or []:
            passed = c.get("passed")
            if judged:
                state = "pass" if passed is True else "fail" if passed is False else "not judged"
            else:
                state = "pending"
            rows.append(
                {
                    "id": c["id"],
                    "value": c.get("value"),
                    "unit": c.get("unit"),
                    "op": c.get("op"),
                    "threshold": c.get("threshold"),
                    "n": c.get("n"),
                    "state": state,
                    # while pending: which side of the threshold the run is on so far
                    "so_far": None if judged else passed,
                    "detail": c.get("detail"),
                }
            )
        return rows

    def _chaos(self) -> list[dict[str, Any]]:
        st = self.state
        records = st.tasks.chaos_records()
        rows = []
        for rec in records:
            if rec.get("ok") is not True:
                state = "failed"
            elif rec.get("end_s") is None:
                state = "applied"
            else:
                state = "undone"
            rows.append(
                {
                    "action": rec.get("action"),
                    "at_s": rec.get("at_s", rec.get("start_s")),
                    "start_s": rec.get("start_s"),
                    "end_s": rec.get("end_s"),
                    "state": state,
                    "error": rec.get("error"),
                }
            )
        started = len(records)
        for ev in st.scenario.chaos[started:]:
            rows.append(
                {
                    "action": ev.action,
                    "at_s": ev.at_s,
                    "start_s": None,
                    "end_s": None,
                    "state": "planned",
                    "error": None,
                }
            )
        return rows


# a run's exit code (``harness judge``'s) as the verdict it stands for, from the one table
# that maps the two (``ExitCode.for_verdict``); any other code (the judge could not read
# the results, was killed, or never ended) stands for "invalid": nothing to trust
_VERDICT_OF_CODE = {int(ExitCode.for_verdict(v)): v for v in results.VERDICTS}


def session_verdict(runs: Sequence[Mapping[str, Any]]) -> tuple[ExitCode, str]:
    """The exit code of a web UI session and the line that says which run decided it.

    ``runs`` are the session's run records (``HarnessState.runs``: name, dir, scenario,
    the exit code ``harness judge`` gave it). The code is the worst over every run, in
    ``harness.finish.exit_code_for``'s order (a failure anywhere wins: 1; else invalid: 3;
    else not judged: 4; else 0), so a run that failed is never hidden by a later one that
    passed. The line names the first run with that verdict — its number, scenario and
    start time, and what decided it (the failed checks, the validity reason, the checks not
    judged) — then the other runs with the same verdict and, when it is another run, what
    the last run gave: ``exit 1: run 1 of 3 (steady_state, 12:01:05) failed
    steady.p99_ms; the last run passed``."""
    from harness.finish import exit_code_for

    if not runs:
        raise ValueError("a session verdict needs at least one run")
    verdicts = [_VERDICT_OF_CODE.get(_int_or_none(r.get("exit_code")), "invalid") for r in runs]
    worst = results.combine_verdicts(verdicts)
    code = exit_code_for({"verdict": worst})
    n = len(runs)
    if worst == "pass" and n > 1:
        return code, f"exit {int(code)}: all {n} runs of the session passed"
    first = verdicts.index(worst)
    line = f"exit {int(code)}: {_run_said(runs[first], first, n, worst)}"
    also = [str(i + 1) for i, v in enumerate(verdicts) if v == worst and i != first]
    if also:
        line += f"; also {_VERDICT_WORDS[worst]}: run{'s' if len(also) > 1 else ''} "
        line += ", ".join(also)
        if verdicts[-1] == worst:
            line += " (the last)"
    elif first != n - 1:
        line += "; the last run " + _what(runs[-1], verdicts[-1], _judged_doc(runs[-1]))
    return code, line


_VERDICT_WORDS = {
    "fail": "failed",
    "invalid": "invalid",
    "not_judged": "not judged",
    "pass": "passed",
}


def _int_or_none(value: Any) -> int | None:
    with contextlib.suppress(TypeError, ValueError):
        return int(value)
    return None


def _judged_doc(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's judged results.json, None when it cannot be read."""
    with contextlib.suppress(HarnessError, OSError, ValueError, TypeError):
        return results.load_document(Path(run["dir"]) / "results.json")
    return None


def _run_said(run: Mapping[str, Any], i: int, n: int, verdict: str) -> str:
    """``run 1 of 3 (steady_state, 12:01:05) failed steady.p99_ms``."""
    doc = _judged_doc(run)
    started = None
    for sc in (doc or {}).get("scenarios") or []:
        if sc.get("started_unix") is not None:
            started = time.strftime("%H:%M:%S", time.localtime(float(sc["started_unix"])))
            break
    about = ", ".join(str(x) for x in (run.get("scenario"), started) if x)
    return f"run {i + 1} of {n}" + (f" ({about})" if about else "") + " " + _what(run, verdict, doc)


def _what(run: Mapping[str, Any], verdict: str, doc: Mapping[str, Any] | None) -> str:
    """What decided one run's verdict, from its judged document (the judge's own line when
    the document cannot be read)."""
    said = str(run.get("line") or f"harness judge exited {run.get('exit_code')}")
    if _int_or_none(run.get("exit_code")) not in _VERDICT_OF_CODE:
        return f"was not judged to the end ({said})"
    if doc is None:
        return f"{_VERDICT_WORDS[verdict]} ({said})"
    scs = doc.get("scenarios") or []
    checks = [c for sc in scs for c in sc.get("checks") or []]
    if verdict == "pass":
        return "passed"
    if verdict == "fail":
        failed = [str(c["id"]) for c in checks if c.get("passed") is False]
        return "failed " + ", ".join(dict.fromkeys(failed)) if failed else f"failed ({said})"
    if verdict == "invalid":
        reasons = [str(r) for sc in scs for r in sc.get("validity") or []]
        if reasons:
            more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
            return f"was invalid: {reasons[0]}{more}"
        errors = [str(sc["error"].get("message")) for sc in scs if sc.get("error")]
        if errors:
            return f"was invalid: {errors[0]}"
        if doc.get("partial"):
            return "was invalid: stopped before its end (partial results)"
        return f"was invalid ({said})"
    # not judged: the defining checks left unjudged, else every check not judged
    defining = {str(d) for sc in scs for d in sc.get("defined_by") or ()}
    skipped = [str(c["id"]) for c in checks if c.get("passed") is None and not c.get("accepted")]
    named = [cid for cid in skipped if cid in defining] or skipped
    not_run = [str(e.get("name")) for e in doc.get("excluded") or [] if not e.get("optional")]
    parts = []
    if named:
        parts.append("not judged: " + ", ".join(dict.fromkeys(named)))
    if not_run:
        parts.append("not run: " + ", ".join(not_run))
    return "was not judged (" + "; ".join(parts or [said]) + ")"


def _read_samples(samples_dir: Path) -> dict[str, Any] | None:
    from harness.collectors import read_samples

    if not (samples_dir / "process.csv").exists():
        return None
    return read_samples(samples_dir)


def _tail_rows(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, str]]:
    """The complete rows in the last ``max_bytes`` of a CSV being appended to."""
    try:
        with path.open("rb") as f:
            header = f.readline().decode()
            f.seek(0, io.SEEK_END)
            size = f.tell()
            start = max(len(header), size - max_bytes)
            f.seek(start)
            data = f.read().decode(errors="replace")
    except OSError:
        return []
    if start > len(header):
        data = data.partition("\n")[2]  # drop the row the window cut
    if not data.endswith("\n"):
        data = data.rpartition("\n")[0]  # drop a row still being written
    return list(csv.DictReader(io.StringIO(header + data)))


def server_now(samples_dir: Path) -> dict[str, Any] | None:
    """The sampler's latest process row and that tick's busiest threads, or None."""
    procs = _tail_rows(samples_dir / "process.csv", 4096)
    if not procs:
        return None
    last = procs[-1]

    def num(row: Mapping[str, str], key: str) -> float | None:
        with contextlib.suppress(TypeError, ValueError):
            return float(row.get(key) or "")
        return None

    rows = _tail_rows(samples_dir / "threads.csv")
    t_last = max((num(r, "t") or 0.0 for r in rows), default=None)
    # that tick's threads that used any CPU (pidstat -t lists idle ones too; a tab has no room)
    threads = [r for r in rows if num(r, "t") == t_last and (num(r, "cpu_pct") or 0.0) > 0.0]
    threads.sort(key=lambda r: num(r, "cpu_pct") or 0.0, reverse=True)
    return {
        "t": num(last, "t"),
        "rss_mib": round((num(last, "rss_bytes") or 0.0) / 2**20, 1),
        "threads": num(last, "threads"),
        "fds": num(last, "fds"),
        "cpu_pct": num(last, "cpu_pct"),
        "top_threads": [
            {
                "tid": r.get("tid"),
                "name": r.get("name"),
                "usr_pct": num(r, "usr_pct"),
                "system_pct": num(r, "system_pct"),
                "cpu_pct": num(r, "cpu_pct"),
                "cpu": r.get("cpu"),
            }
            for r in threads[:TOP_THREADS]
        ],
    }
