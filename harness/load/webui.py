"""The harness in Locust's web UI: a Checklist tab, judged runs, their reports.

Built on Locust's documented extension points (the ``extend_web_ui`` example):

- ``extendedTabs`` / ``extendedTables`` in the UI's template args declare the
  **Checklist** tab and its columns; its rows ride on the UI's own ``/stats/requests``
  poll (an ``after_request`` hook adds them as ``extended_stats``), built by
  ``harness.load.live`` from the code that writes and judges ``results.json``;
- a Flask blueprint under ``/harness/``: a page with every run of this Locust process
  (verdict, links), the live model as JSON, and each run's ``report.html``,
  ``summary.md``, ``junit.xml`` and ``results.json``; ``extendedCsvFiles`` puts the
  latest run's files on the UI's "Download Data" tab;
- a ``before_request`` hook on ``/swarm`` checks the start form's harness options as the
  command line would and refuses the start with that one-line error.

The UI polls ``/stats/requests`` only while Locust's runner is spawning or running, but a
harness run ends after the runner stops (the requests still out drain, the run is
written and judged). Until that run is judged, the poll's answer reports the runner as
``running``, so the tab keeps updating until the verdict is in; then Locust's own state.
"""

from __future__ import annotations

import copy
import html
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError
from harness.load.lifecycle import RunState
from harness.load.live import LiveView
from harness.load.options import HARNESS_DESTS, options_from, scenario_for

if TYPE_CHECKING:
    from harness.load.controller import HarnessState

log = logging.getLogger("harness.load")

TAB = "harness-checklist"
SERVED = ("report.html", "summary.md", "junit.xml", "results.json")
COLUMNS = [
    {"key": "section", "title": "Section"},
    {"key": "item", "title": "Name"},  # not "name": Locust's tables sort by a "name" key
    {"key": "value", "title": "Value"},
    {"key": "limit", "title": "Limit"},
    {"key": "n", "title": "n"},
    {"key": "state", "title": "State"},
]
S = RunState
# a harness run is going (preparing before Locust spawns anything, or between Locust's
# stop and its verdict): the UI must keep polling, and a new start must wait
GOING = frozenset(
    {
        S.PREPARING,
        S.READY,
        S.RUNNING,
        S.COMPLETED,
        S.ABORTED,
        S.FAILED,
        S.DRAINING,
        S.WRITING,
        S.WRITTEN,
    }
)


def install(environment: Any, state: HarnessState) -> LiveView | None:
    """Add the Checklist tab, the ``/harness/`` pages and the start-form check."""
    web_ui = getattr(environment, "web_ui", None)
    if web_ui is None:
        return None
    from flask import Blueprint, Response, abort, jsonify, request, send_from_directory

    live = LiveView(state)
    web_ui.template_args["extendedTabs"] = [{"title": "Checklist", "key": TAB}]
    web_ui.template_args["extendedTables"] = [{"key": TAB, "structure": COLUMNS}]
    web_ui.template_args["extendedCsvFiles"] = [
        {"href": f"./harness/runs/latest/{name}", "title": f"Checklist: latest run's {name}"}
        for name in SERVED
    ] + [{"href": "./harness/", "title": "Checklist: every run of this Locust"}]

    @web_ui.app.after_request
    def _extend_stats(response: Response) -> Response:
        if request.path != "/stats/requests" or response.status_code != 200:
            return response
        t0 = time.thread_time()
        body = response.get_json(silent=True)
        if isinstance(body, dict):
            body["extended_stats"] = [{"key": TAB, "data": table_rows(live.snapshot())}]
            if going(state) and body.get("state") not in ("spawning", "running"):
                body["state"] = "running"  # keep the UI polling until the verdict is in
            response.set_data(json.dumps(body))
        live.polls += 1
        live.poll_cpu_s += time.thread_time() - t0  # the tab's whole cost, snapshot included
        return response

    @web_ui.app.before_request
    def _check_start_form() -> Any:
        if request.path != "/swarm" or request.method != "POST":
            return None
        message = refuse_start(environment, state, request.form)
        if message is None:
            return None
        log.error("harness: %s", message)
        return jsonify(
            {"success": False, "message": f"harness: {message}", "host": environment.host}
        )

    bp = Blueprint("harness", __name__, url_prefix="/harness")
    auth = web_ui.auth_required_if_enabled  # the UI's own login, when it has one

    @bp.route("/")
    @auth
    def _index() -> Response:
        return Response(index_page(live.snapshot()), mimetype="text/html")

    @bp.route("/live.json")
    @auth
    def _live() -> Response:
        snap = live.snapshot()
        cost = {
            "snapshot_cpu_s": live.cpu_s,
            "snapshots": live.snapshots,
            "poll_cpu_s": live.poll_cpu_s,
            "polls": live.polls,
        }
        return jsonify({**snap, "cost": cost})

    @bp.route("/runs/<name>/<path:filename>")
    @auth
    def _run_file(name: str, filename: str) -> Response:
        if filename not in SERVED:
            abort(404)
        run = _run_dir(state, name)
        if run is None or not (run / filename).is_file():
            abort(404)
        mimetype = "text/plain" if filename.endswith(".md") else None
        return send_from_directory(run, filename, mimetype=mimetype)

    web_ui.app.register_blueprint(bp)
    return live


def going(state: HarnessState) -> bool:
    """A harness run is under way: from preparation until its verdict is in."""
    return state.lifecycle.state in GOING or bool(state.judging and not state.judging.dead)


def _run_dir(state: HarnessState, name: str) -> Path | None:
    """A run of this Locust process by name (``latest``: the newest judged one)."""
    runs = [r for r in state.runs if r.get("exit_code") is not None]
    if name == "latest":
        return Path(runs[-1]["dir"]) if runs else None
    for r in state.runs:
        if r["name"] == name:
            return Path(r["dir"])
    return None


def refuse_start(environment: Any, state: HarnessState, form: Any) -> str | None:
    """Why the start form's submit must not start a run (None: it may)."""
    if going(state):
        return (
            f"a run is going ({state.lifecycle.state.value}): the scenario sets its load; "
            "wait for its verdict (or stop it) before starting another"
        )
    parsed = copy.copy(environment.parsed_options)
    for key in form:
        if key in HARNESS_DESTS:
            setattr(parsed, key, _as_locust_would(getattr(parsed, key, None), form, key))
    try:
        opts = options_from(parsed, form=True)
        scenario_for(opts)
    except HarnessError as exc:
        return str(exc)
    if opts.sut_cmd and opts.sut_pid:
        return "--sut-cmd and --sut-pid are both set; start a server or attach to one"
    return None


def _as_locust_would(current: Any, form: Any, key: str) -> Any:
    """A start-form value converted the way Locust's ``/swarm`` handler converts it."""
    value = form.get(key)
    if isinstance(current, bool):
        return value == "true"
    if current is None:
        return value
    if isinstance(current, list):
        return value.split(",") if "," in value else form.getlist(key)
    try:
        return type(current)(value)
    except (TypeError, ValueError):
        return value


# -- rendering ------------------------------------------------------------------------------


def _fmt(value: Any, unit: str | None = None) -> str:
    if value is None:
        return "—"
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"{text} {unit}" if unit and unit not in ("ratio", "") else text


def table_rows(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """The Checklist tab's rows (Locust renders cells as text)."""
    run = snap["run"]
    rows: list[dict[str, Any]] = []

    def add(
        section: str, name: str, value: Any = "", limit: Any = "", n: Any = "", state: Any = ""
    ) -> None:
        rows.append(
            {
                "section": section,
                "item": name,
                "value": value,
                "limit": limit,
                "n": n,
                "state": state,
            }
        )

    clock = (
        f"{run['elapsed_s']:.0f} / {run['total_s']:.0f} s"
        if run["elapsed_s"] is not None
        else f"{run['total_s']:.0f} s"
    )
    add(
        "run",
        f"{run['name']} · {run['scenario']} ({run['mode']})",
        clock,
        run["dir"],
        "",
        (run["verdict"] or run["state"]).upper() if run["judged"] else run["state"],
    )
    for st in snap["stages"]:
        mark = "◀ now" if st["state"] == "now" else st["state"]
        add(
            "stage", st["name"], f"{st['start_s']:g}–{st['end_s']:g} s · {st['load']}", "", "", mark
        )
    for c in snap["checks"]:
        state = c["state"]
        if state == "pending" and c.get("so_far") is not None:
            state = "pending (so far within)" if c["so_far"] else "pending (so far outside)"
        limit = (
            f"{c['op']} {_fmt(c['threshold'])}"
            if c.get("threshold") is not None
            else (c.get("op") or "")
        )
        add(
            "check",
            c["id"],
            _fmt(c["value"], c.get("unit")),
            limit,
            _fmt(c.get("n")),
            state.upper() if c["state"] != "pending" else state,
        )
    for ev in snap["chaos"]:
        when = f"at {ev['at_s']:g} s" if ev.get("at_s") is not None else ""
        if ev.get("start_s") is not None:
            when = (
                f"{ev['start_s']:.1f}–{ev['end_s']:.1f} s"
                if ev.get("end_s") is not None
                else f"from {ev['start_s']:.1f} s"
            )
        add("chaos", ev["action"], when, ev.get("error") or "", "", ev["state"])
    for reason in snap["validity"]:
        add(
            "validity",
            "warning" if not run["judged"] else "invalid",
            reason,
            "",
            "",
            "so far" if not run["judged"] else "INVALID",
        )
    srv = snap.get("server")
    if srv:
        add(
            "server",
            "process",
            f"RSS {srv['rss_mib']:.1f} MiB · threads {_fmt(srv['threads'])} · fds {_fmt(srv['fds'])} · %CPU {_fmt(srv['cpu_pct'])}",
            "",
            "",
            f"t={_fmt(srv['t'])} s",
        )
        for th in srv["top_threads"]:
            add(
                "thread",
                f"{th['tid']} {th['name']}",
                f"%usr {_fmt(th['usr_pct'])} · %system {_fmt(th['system_pct'])} · %CPU {_fmt(th['cpu_pct'])}",
                "",
                "",
                f"cpu {th['cpu'] or '-'}",
            )
    for r in reversed(snap["runs"]):
        add(
            "runs",
            r["name"],
            r["line"],
            f"./harness/runs/{r['name']}/report.html",
            "",
            (r["verdict"] or "judging").upper() if r["exit_code"] is not None else "judging",
        )
    return rows


def index_page(snap: dict[str, Any]) -> str:
    """``/harness/``: every run of this Locust process with its verdict and files, and the
    current run's checklist (refreshes itself every 3 s)."""
    e = html.escape
    run_rows = "".join(
        f"<tr><td>{e(r['name'])}</td><td>{e(r['scenario'])}</td>"
        f"<td class='{e(str(r['verdict']))}'>{e(str(r['verdict'] or 'judging'))}</td>"
        f"<td>{e(str(r['line']))}</td><td>"
        + " · ".join(f"<a href='runs/{e(r['name'])}/{f}'>{f}</a>" for f in SERVED)
        + "</td></tr>"
        for r in reversed(snap["runs"])
    )
    check_rows = "".join(
        f"<tr><td>{e(row['section'])}</td><td>{e(str(row['item']))}</td><td>{e(str(row['value']))}</td>"
        f"<td>{e(str(row['limit']))}</td><td>{e(str(row['n']))}</td><td>{e(str(row['state']))}</td></tr>"
        for row in table_rows(snap)
        if row["section"] != "runs"
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Checklist</title>
<meta http-equiv="refresh" content="3">
<style>body{{font:14px sans-serif;margin:1.5em}}td,th{{padding:2px 8px;text-align:left;
vertical-align:top}}tr:nth-child(even){{background:#f4f4f4}}.pass{{color:#080}}
.fail{{color:#b00}}.invalid,.not_judged{{color:#a60}}</style></head><body>
<h2>Runs of this Locust</h2><table><tr><th>run</th><th>scenario</th><th>verdict</th>
<th>verdict line</th><th>files</th></tr>{run_rows or "<tr><td colspan=5>none yet</td></tr>"}</table>
<h2>Current run</h2><table><tr><th>section</th><th>name</th><th>value</th><th>limit</th>
<th>n</th><th>state</th></tr>{check_rows}</table></body></html>"""
