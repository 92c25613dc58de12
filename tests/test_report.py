"""Report rendering: junit.xml (golden), summary.md, self-contained report.html with plots."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.errors import ResultFormatError
from harness.report import render_all, render_dir
from harness.report.junit import render_junit
from harness.report.summary import render_summary
from harness.results import load_document, new_document, write_document
from harness.testing.reference_document import build_document
from harness.testing.results import MACHINE, check, scenario

DATA = Path(__file__).parent / "data"

# Plots each golden scenario's data supports, and those it must omit with a note.
EXPECTED_PLOTS = {
    "steady_state": {"latency", "throughput", "resources", "threads"},
    "contention": {"latency", "throughput", "resources", "threads", "contention"},
    "linearity": {"linearity"},
    "soak": {"latency", "throughput", "resources", "threads"},
    "spike": {"latency", "throughput"},
}
ALL_PLOTS = {"latency", "throughput", "tokens", "resources", "threads", "linearity", "contention"}


@pytest.fixture(scope="module")
def golden():
    return load_document(DATA / "results_v1.json")


@pytest.fixture(scope="module")
def rendered(golden, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    paths = render_all(golden, out)
    return {k: p.read_text(encoding="utf-8") for k, p in paths.items()}


def test_without_html_the_other_reports_are_written_and_no_page(golden, tmp_path) -> None:
    """``--no-html-report``: summary.md and junit.xml as always, no report.html (and
    ``harness report DIR`` draws it later from results.json)."""
    paths = render_all(golden, tmp_path, html=False)
    assert set(paths) == {"junit", "summary"} and all(p.stat().st_size for p in paths.values())
    assert not (tmp_path / "report.html").exists()


class _Page(HTMLParser):
    """Collects tags, their attributes and text, and checks every tag is closed."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[str] = []
        self.text: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


def _strip_timestamps(xml: str) -> str:
    return re.sub(r' timestamp="[^"]*"', "", xml)


# --- junit.xml -------------------------------------------------------------------------


def test_junit_matches_the_golden_file(golden):
    expected = (DATA / "junit_v1.xml").read_text(encoding="utf-8")
    assert _strip_timestamps(render_junit(golden)) == _strip_timestamps(expected)


def test_junit_structure(rendered, golden):
    root = ET.fromstring(rendered["junit"])
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [sc["name"] for sc in golden["scenarios"]]
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == (
        "15",
        "3",
        "1",
        "2",
    )
    contention = suites[1]
    cases = {c.get("name"): c for c in contention.findall("testcase")}
    assert set(cases) == {
        "contention.throughput_ratio",
        "contention.fail_fast",
        "contention.recovery_s",
    }
    failure = cases["contention.throughput_ratio"].find("failure")
    assert (
        failure.get("message") == "contention.throughput_ratio: measured 0.42 x, threshold ≥ 0.5 x"
    )
    assert "find the serialized stage" in failure.text and "(n=20)" in failure.text
    assert cases["contention.fail_fast"].find("failure") is None
    soak = {c.get("name"): c for c in suites[3].findall("testcase")}
    assert (
        soak["soak.fds_trend"].find("skipped").get("message")
        == "fd counts not available: /proc/PID/fd unreadable"
    )
    spike = suites[4]
    assert spike.get("errors") == "1"
    error = spike.find("testcase[@name='spike.valid']/error")
    assert error.get("message").startswith("run invalid: load generator CPU 97%")
    assert "312 missing" in error.text


def test_junit_escapes_hostile_text():
    sc = scenario("x<y", 1.0, checks=[check('a"b', False, 1, 0, ">=", "&", 1, "</failure><x>")])
    doc = new_document(machine=MACHINE)
    doc["scenarios"].append(sc)
    root = ET.fromstring(render_junit(doc))  # parses: everything was escaped
    case = root.find("testsuite/testcase")
    assert case.get("name") == 'a"b'
    assert "</failure><x>" in case.find("failure").text


# --- summary.md ------------------------------------------------------------------------


def test_summary_verdict_line_counts_skipped_apart(rendered):
    md = rendered["summary"]
    lines = md.splitlines()
    verdict = next(line for line in lines if "INVALID" in line)
    assert "9 passed, 3 failed, 2 skipped across 5 scenarios" in verdict
    # every scenario that did not pass and every skipped check is named on the line
    assert "fail: contention, soak; invalid: spike" in verdict
    assert "skipped: soak.fds_trend, spike.recovery_s" in verdict
    assert "### ❌ contention — fail (2 passed, 1 failed, 0 skipped)" in md
    assert "### ❌ soak — fail (2 passed, 1 failed, 1 skipped)" in md


def test_summary_tables_carry_value_threshold_n_detail(rendered):
    md = rendered["summary"]
    assert (
        "| `contention.throughput_ratio` | ❌ fail | 0.42 x | ≥ 0.5 x | 20 | median throughput"
        in md
    )
    assert "| `soak.fds_trend` | ⏭️ skipped | — | ≤ 0.5 fds/min | — | fd counts not available" in md
    assert "> ⚠️ Run invalid, judges nothing: load generator CPU 97% &gt;= 90%" in md
    # Every table row has the header's 6 columns (pipes in values are escaped).
    for line in md.splitlines():
        if line.startswith("| `"):
            assert len(re.findall(r"(?<!\\)\|", line)) == 7, line


def test_summary_of_a_passing_run_with_skips_never_says_all_passed():
    doc = new_document(machine=MACHINE)
    doc["scenarios"].append(
        scenario(
            "steady_state",
            1.0,
            verdict="pass",
            checks=[
                check("steady.p99_ms", True, 1, 2),
                check("soak.rss_trend", None, skipped="no pid | to watch"),
            ],
        )
    )
    doc["verdict"] = "pass"
    md = render_summary(doc)
    assert "✅ **PASS** — 1 passed, 0 failed, 1 skipped across 1 scenario" in md
    assert "no pid \\| to watch" in md


def test_summary_marks_partial_and_unjudged_runs():
    doc = new_document(machine=MACHINE)
    doc["partial"] = True
    doc["scenarios"].append(scenario("soak", 1.0, partial=True))
    md = render_summary(doc)
    assert "NO VERDICT" in md and "**Partial run**" in md and "_No checks were evaluated._" in md


# --- report.html -----------------------------------------------------------------------


def test_html_is_well_formed_and_self_contained(rendered):
    page = _parse(rendered["html"])
    assert not page.errors and not page.stack
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe", "object"), tag
        for name in ("src", "href"):
            if name in attrs:
                assert attrs[name].startswith(("data:image/png;base64,", "#")), attrs[name][:40]


def test_html_has_every_plot_the_data_supports(rendered, golden):
    page = _parse(rendered["html"])
    figures = {a["id"] for t, a in page.tags if t == "figure"}
    imgs = [a for t, a in page.tags if t == "img"]
    expected = {
        f"plot-{i}-{sc['name']}-{p}"
        for i, sc in enumerate(golden["scenarios"])
        for p in EXPECTED_PLOTS[sc["name"]]
    }
    assert figures == expected
    assert len(imgs) == len(expected)
    assert all(len(a["src"]) > 5000 for a in imgs)  # real PNGs, not empty placeholders
    notes = [a.get("data-plot") for t, a in page.tags if t == "li" and "data-plot" in a]
    assert len(notes) == sum(len(ALL_PLOTS - p) for p in EXPECTED_PLOTS.values())


def test_html_verdict_table_comes_first(rendered):
    html = rendered["html"]
    table = html.index("<h2>Verdicts</h2>")
    assert table < html.index("<figure")
    assert table < html.index("<section")
    assert '<td class="fail">fail</td>' in html and '<td class="skipped">skipped</td>' in html
    assert '<td class="invalid">invalid</td>' in html


def test_html_shows_hdr_percentiles_and_accounting(rendered):
    text = " ".join(_parse(rendered["html"]).text)
    assert "Latency by class (HDR, ok responses)" in text
    assert "Request accounting" in text and "failed: http_503" in text
    assert "cpu_hog" in text  # chaos timeline listed
    assert "dispatch lag p50 / p99" in text and "failed-request latency p50 / p99" in text
    assert "cross_wired 0, drift 0, id_mismatch 0" in text


def test_html_escapes_everything_from_the_document():
    evil = "<script>alert(1)</script>"
    doc = new_document(machine={**MACHINE, "host": evil}, sut={"cmd": evil})
    doc["scenarios"].append(
        scenario(
            evil,
            10.0,
            chaos=[
                {
                    "action": evil,
                    "params": {evil: evil},
                    "start_s": 1,
                    "end_s": 2,
                    "ok": False,
                    "error": evil,
                }
            ],
            checks=[check(evil, False, 1, 0, ">=", evil, 1, evil)],
        )
    )
    from harness.report.html import render_html

    html = render_html(doc)
    page = _parse(html)
    assert not any(t == "script" for t, _ in page.tags)
    assert evil in " ".join(page.text)  # shown as text, not executed


def test_missing_or_malformed_data_omits_plots_with_a_note(tmp_path):
    doc = new_document(machine=MACHINE)
    bare = {"name": "bare"}
    broken = scenario(
        "broken",
        5.0,
        windows={"width_s": 1.0, "rows": [{"t": 0, "class": "a", "p99_ms": "slow"}, "junk"]},
        server={"series": {"t": [0, 1], "rss_bytes": [None, None]}, "threads_top": [{"tid": 1}]},
        linearity={"points": [{"n": 2, "throughput_rps": [10.0]}]},
        contention={"blocks": [{"kind": "hog"}]},
        by_class={"a": {"counters": {}, "latency_hdr": "not-an-hdr"}},
    )
    doc["scenarios"] += [bare, broken]
    paths = render_all(doc, tmp_path)
    page = _parse(paths["html"].read_text())
    assert not page.errors
    notes = [a["data-plot"] for t, a in page.tags if t == "li" and "data-plot" in a]
    assert (
        notes.count("latency") == 2
        and notes.count("resources") == 2
        and notes.count("contention") == 2
    )
    # broken still draws what it can: the thread bars and a linearity point without an N=1 fit
    figures = {a["id"] for t, a in page.tags if t == "figure"}
    assert figures == {
        "plot-1-broken-threads",
        "plot-1-broken-linearity",
        "plot-1-broken-throughput",
    }


def test_a_streaming_runs_windows_draw_ttft_tpot_tokens_and_the_servers_kv_cache(tmp_path):
    """Windows that carry token columns get the tokens plot, with the server's KV-cache
    usage and preemptions from its scraped /metrics on the tokens panel."""
    rows = [
        {"t": float(t), "class": "default", "n": 8, "ok": 8, "errors": {}, "p50_ms": 900.0,
         "p90_ms": 1200.0, "p99_ms": 1500.0, "max_ms": 1500.0, "tokens_out_per_s": 250.0 + t,
         "ttft_p50_ms": 90.0, "ttft_p99_ms": 120.0, "tpot_p50_ms": 48.0, "tpot_p99_ms": 52.0}
        for t in range(10)
    ]  # fmt: skip
    ts = [float(t) for t in range(11)]
    metrics = {
        "series": {
            'vllm:kv_cache_usage_perc{model_name="m"}': {"t": ts, "v": [0.03] * 11},
            'vllm:num_preemptions_total{model_name="m"}': {"t": ts, "v": [0.0] * 5 + [2.0] * 6},
        }
    }
    from harness.report import plots

    sc = scenario("llm_steady", 10.0, windows={"width_s": 1.0, "rows": rows}, metrics=metrics)
    fig = plots.tokens(sc)
    assert not isinstance(fig, plots.Missing)
    tokens_panel = fig.axes[2]
    assert [line.get_label() for line in tokens_panel.get_lines()] == ["default output tokens/s"]
    right = {line.get_label(): line for ax in fig.axes[3:] for line in ax.get_lines()}
    assert set(right) == {"server KV cache used (%)", "server preemptions/s"}
    assert max(right["server KV cache used (%)"].get_ydata()) == pytest.approx(3.0)
    assert max(right["server preemptions/s"].get_ydata()) == pytest.approx(2.0)
    bare = scenario("steady_state", 10.0, windows={"width_s": 1.0, "rows": rows[:1]})
    del bare["windows"]["rows"][0]["tokens_out_per_s"]
    assert isinstance(plots.tokens(bare), plots.Missing)


def test_render_dir_rerenders_from_results_json(tmp_path):
    write_document(tmp_path / "results.json", build_document(scenarios=["linearity", "spike"]))
    paths = render_dir(tmp_path)
    assert {p.name for p in paths.values()} == {"junit.xml", "summary.md", "report.html"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "junit.xml",
        "report.html",
        "results.json",
        "summary.md",
    ]


def test_render_dir_refuses_an_unknown_version(tmp_path):
    doc = copy.deepcopy(load_document(DATA / "results_v1.json"))
    doc["schema"] = "harness.results/7"
    write_document(tmp_path / "results.json", doc)
    with pytest.raises(ResultFormatError, match=r"harness\.results/7"):
        render_dir(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_a_dead_server_is_shown_with_its_cause_and_output(tmp_path):
    doc = new_document(machine=MACHINE)
    doc["partial"] = True
    doc["scenarios"].append(
        scenario(
            "soak",
            12.3,
            partial=True,
            error={"type": "TargetUnavailable", "message": "connection refused"},
            sut_exit={
                "t_s": 12.3,
                "exit_code": -9,
                "cause": "the server under test exited (code -9) during the run",
                "log_tail": ["MemoryError <boom>"],
            },
            checks=[
                check("soak.rss_trend", False, None, 1.0, "<=", "MiB/min", None, "server died")
            ],
            verdict="fail",
        )
    )
    paths = render_all(doc, tmp_path)
    md = paths["summary"].read_text()
    assert "> ❌ the server under test exited (code -9) during the run at t=12.3 s" in md
    assert "> ❌ harness error TargetUnavailable: connection refused" in md
    html = paths["html"].read_text()
    assert "<pre>MemoryError &lt;boom&gt;</pre>" in html
    assert not _parse(html).errors


def test_resource_trend_line_only_where_the_scenario_judges_that_trend():
    """The Theil–Sen line on a resource panel is the leak detector's: drawn for a soak that
    judges the trend, not for a steady run that judges none (a slope nobody judged)."""
    from matplotlib.lines import Line2D

    from harness.report import plots

    n = 120
    t = [float(i) for i in range(n)]
    series = {
        "t": t,
        "rss_bytes": [100 * 2**20 + i * 2**16 for i in range(n)],
        "threads": [20] * n,
        "fds": [30] * n,
    }
    server = {"pid": 1, "interval_s": 1.0, "series": series, "threads_top": []}

    def dashed_labels(sc):
        fig = plots.resources(sc)
        return [
            ln.get_label()
            for ax in fig.axes
            for ln in ax.get_lines()
            if isinstance(ln, Line2D) and ln.get_linestyle() == "--"
        ]

    steady = scenario("steady_state", 120.0, server=server, checks=[check("steady.p99_ms", True)])
    assert dashed_labels(steady) == []
    soak = scenario(
        "soak", 120.0, server=server, checks=[check("soak.rss_trend", True, 1.5, 1.0, "<=")]
    )
    (label,) = dashed_labels(soak)  # the RSS panel's only: threads and fds are not judged
    assert label.startswith("Theil–Sen trend +3.7") and "MiB/min" in label
