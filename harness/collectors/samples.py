"""Read a sampler directory back into the ``server`` / ``system`` / ``metrics`` sections of a
scenario result (docs/architecture.md). Streams the CSVs: memory grows with the number of
distinct threads and ticks kept, not with the file sizes of threads.csv.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

from harness.collectors.metrics import series_key
from harness.errors import ResultFormatError

SERVER_SERIES = (
    "t",
    "rss_bytes",
    "uss_bytes",
    "threads",
    "fds",
    "socket_fds",  # absent (None) in samples written before it was recorded
    "client_conns",  # of socket_fds: the harness's own connections (None: not recorded)
    "cpu_pct",
    "late_s",
)


def _num(text: str) -> float | int | None:
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with open(path, newline="") as f:
        yield from csv.DictReader(f)


def _meta(d: Path) -> dict:
    p = d / "sampler.json"
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ResultFormatError(f"{p}: not valid JSON ({e}); rerun the sampler") from None


def _log_tail(d: Path, lines: int = 5) -> str | None:
    p = d / "sampler.log"
    if not p.exists():
        return None
    text = p.read_text(errors="replace").strip()
    return "\n".join(text.splitlines()[-lines:]) or None


def _server(d: Path, meta: dict, top: int) -> dict | None:
    """The server section. A directory a sampler was started in (it leaves sampler.log or
    sampler.json) always gives one, with empty series when the sampler wrote none — so a
    sampler that died is seen as a run without samples, not as a run nobody sampled."""
    path = d / "process.csv"
    series: dict[str, list] = {k: [] for k in SERVER_SERIES}
    if path.exists():
        for row in _rows(path):
            for k in SERVER_SERIES:
                series[k].append(_num(row.get(k) or ""))
    elif not meta and not (d / "sampler.log").exists():
        return None
    finished = meta.get("running") is False
    return {
        "pid": meta.get("pid"),
        "interval_s": meta.get("interval_s"),
        "ticks": meta.get("ticks", len(series["t"])),
        "missed_ticks": meta.get("missed_ticks", 0),
        # unix time of the sampler's t = 0 (scenario time = t + started_unix − the
        # scenario's started_unix); None when the sampler never started its loop
        "started_unix": meta.get("started_unix"),
        "stopped_unix": meta.get("stopped_unix"),
        # false when the sampler never wrote its final sampler.json (killed or crashed)
        "finished": finished,
        "log_tail": None if finished and series["t"] else _log_tail(d),
        # ticks that raised (the sampler went on): how many, and the last one's cause
        "tick_errors": meta.get("tick_errors", 0),
        "last_error": meta.get("last_error"),
        "series": series,
        "threads_top": _threads_top(d / "threads.csv", top),
    }


def _threads_top(path: Path, top: int) -> list[dict]:
    if not path.exists():
        return []
    # Pass 1: per-thread sums (bounded by the number of distinct threads).
    acc: dict[tuple[str, str, str], dict] = {}
    for r in _rows(path):
        key = (r["pid"], r["tid"], r["start_ticks"])
        a = acc.get(key)
        if a is None:
            a = acc[key] = {"name": r["name"], "n": 0, "cpu": 0.0, "max": 0.0, "wait": 0.0,
                            "nwait": 0, "cs": 0.0, "ncs": 0.0, "ncsw": 0}  # fmt: skip
        cpu = float(r["cpu_pct"])
        a["name"] = r["name"]  # the latest name (threads may rename themselves)
        a["n"] += 1
        a["cpu"] += cpu
        a["max"] = max(a["max"], cpu)
        if r["wait_pct"] != "":
            a["wait"] += float(r["wait_pct"])
            a["nwait"] += 1
        # switch rates are on the sampler's switch ticks only (empty between): the mean
        # is over the rows that have them, each a rate since the thread's previous one
        if r["cswch_s"] != "":
            a["cs"] += float(r["cswch_s"])
            a["ncs"] += float(r["nvcswch_s"] or 0.0)
            a["ncsw"] += 1
    chosen = sorted(acc, key=lambda k: acc[k]["cpu"] / acc[k]["n"], reverse=True)[:top]
    # Pass 2: the series of the chosen threads only.
    want = set(chosen)
    series: dict[tuple[str, str, str], dict[str, list]] = {
        k: {"t": [], "cpu_pct": []} for k in chosen
    }
    for r in _rows(path):
        key = (r["pid"], r["tid"], r["start_ticks"])
        if key in want:
            series[key]["t"].append(float(r["t"]))
            series[key]["cpu_pct"].append(float(r["cpu_pct"]))
    out = []
    for k in chosen:
        a = acc[k]
        out.append(
            {
                "tid": int(k[1]),
                "name": a["name"],
                "cpu_pct_mean": round(a["cpu"] / a["n"], 2),
                "cpu_pct_max": a["max"],
                "wait_pct_mean": round(a["wait"] / a["nwait"], 2) if a["nwait"] else None,
                "cswch_s_mean": round(a["cs"] / a["ncsw"], 2) if a["ncsw"] else None,
                "nvcswch_s_mean": round(a["ncs"] / a["ncsw"], 2) if a["ncsw"] else None,
                "series": series[k],
            }
        )
    return out


def _loadgen_processes(path: Path, t: list) -> list[dict]:
    """Per generator process: ``pid``, ``name``, ``cpu_pct`` and ``rss_bytes`` aligned
    with the system series' ``t`` (None where the process was not measured; files written
    before RSS was recorded have no ``rss_bytes`` column)."""
    if not path.exists():
        return []
    index = {v: i for i, v in enumerate(t)}
    procs: dict[int, dict] = {}
    for row in _rows(path):
        i = index.get(_num(row["t"]))
        if i is None:
            continue
        pid = int(row["pid"])
        p = procs.get(pid)
        if p is None:
            p = procs[pid] = {
                "pid": pid,
                "name": row["name"],
                "cpu_pct": [None] * len(t),
                "rss_bytes": [None] * len(t),
            }
        p["cpu_pct"][i] = _num(row["cpu_pct"])
        rss = _num(row.get("rss_bytes") or "")
        p["rss_bytes"][i] = int(rss) if rss is not None else None
    return [procs[k] for k in sorted(procs)]


def _foreign_processes(path: Path) -> list[dict]:
    """The busiest processes outside the run, named at the ticks where the CPU busy on
    the run's cores was not the run's: ``t``, ``pid``, ``name``, ``cpu_pct``."""
    if not path.exists():
        return []
    return [
        {"t": _num(r["t"]), "pid": int(r["pid"]), "name": r["name"], "cpu_pct": _num(r["cpu_pct"])}
        for r in _rows(path)
    ]


def _system(d: Path, meta: dict) -> dict | None:
    path = d / "system.csv"
    if not path.exists():
        return None
    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    if header is None:
        return None
    cores = [c for c in header if c.startswith("cpu") and c != "cpu_pct"]
    series: dict[str, list] = {"t": [], "cpu_pct": [], "loadgen_cpu_pct": []}
    for optional in (
        "other_cpu_pct",
        "foreign_cpu_pct",
        "foreign_cores",
        "loadgen_foreign_cpu_pct",  # the generator's host, when the server is on an agent's
        "loadgen_foreign_cores",
    ):
        if optional in header:  # absent in samples written before it was recorded
            series[optional] = []
    per_core: list[list] = [[] for _ in cores]
    for row in _rows(path):
        for k in series:
            series[k].append(_num(row.get(k) or ""))
        for i, c in enumerate(cores):
            per_core[i].append(_num(row[c]))
    series["per_core"] = per_core
    return {
        "started_unix": meta.get("started_unix"),
        "series": series,
        "loadgen_processes": _loadgen_processes(d / "loadgen.csv", series["t"]),
        "foreign_processes": _foreign_processes(d / "foreign.csv"),
    }


def _metrics(d: Path) -> dict | None:
    path = d / "metrics.csv"
    if not path.exists():
        return None
    series: dict[str, dict[str, list]] = {}
    for row in _rows(path):
        s = series.setdefault(series_key(row["name"], row["labels"]), {"t": [], "v": []})
        s["t"].append(float(row["t"]))
        s["v"].append(float(row["value"]))
    return {"series": series}


def read_samples(directory: str | Path, top_threads: int = 8) -> dict:
    """``{"server": …|None, "system": …|None, "metrics": …|None}`` from a sampler directory."""
    d = Path(directory)
    if not d.is_dir():
        raise ResultFormatError(
            f"samples directory {str(d)!r} does not exist; give the --out DIR of `harness sample`"
        )
    meta = _meta(d)
    return {
        "server": _server(d, meta, top_threads),
        "system": _system(d, meta),
        "metrics": _metrics(d),
    }
