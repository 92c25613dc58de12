"""A check is declared in one place (harness.catalog) and implemented by one function.

The catalog drives the registry, the ids the scenario format accepts, the checklist order
and the generated docs (README's check table, docs/checks.md's index); these tests pin
every check id once (a golden list), keep the generated docs current, and show that adding
a check is one declaration plus one function.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import harness.checks.registry as registry_module
from harness.catalog import CATALOG, Catalog, CheckDecl
from harness.catalog.__main__ import main as catalog_main
from harness.catalog.docs import COMMAND, problems, readme_table, regenerate, undocumented
from harness.checks import CHECK_IDS, REGISTRY, Check, evaluate
from harness.checks.model import Result
from harness.checks.registry import Registry
from harness.testing.checks import counters, result

ROOT = Path(__file__).resolve().parent.parent

# Every check id the catalog declares, sorted: the ids results, checklists and scenario
# files refer to. Pinned here and nowhere else, so adding, removing or renaming a check is
# a deliberate edit of this list (removing or renaming one breaks every document that
# names it).
CHECK_IDS_GOLDEN = (
    "accounting.balanced",
    "cold_start.first_error_rate",
    "cold_start.first_p99_ratio",
    "cold_start.time_to_ready_s",
    "contention.fail_fast",
    "contention.recovery_s",
    "contention.throughput_ratio",
    "crash.cold_penalty",
    "crash.errors_after_ready",
    "crash.recovery_s",
    "freeze.recovery_s",
    "freeze.resource_step",
    "freeze.unanswered",
    "integrity.failures",
    "integrity.mismatches",
    "linearity.efficiency",
    "llm.abort_recovery",
    "llm.goodput",
    "llm.overload",
    "llm.priority_ttft_p99",
    "llm.stall",
    "llm.stream_integrity",
    "llm.tpot_p99",
    "llm.ttft_p99",
    "network.latency_amplification",
    "network.leaks",
    "network.recovery_s",
    "priority.high_p99_ms",
    "priority.high_reject_rate",
    "shutdown.exit_s",
    "shutdown.lost",
    "soak.error_rate",
    "soak.fds_trend",
    "soak.latency_drift",
    "soak.rss_trend",
    "soak.threads_trend",
    "spike.fail_fast",
    "spike.recovery_s",
    "steady.error_rate",
    "steady.p99_ms",
    "steady.throughput",
)


def test_the_catalogs_check_ids_are_the_golden_list() -> None:
    assert list(CHECK_IDS_GOLDEN) == sorted(CHECK_IDS_GOLDEN), "keep the golden list sorted"
    declared = sorted(CATALOG.ids)
    assert len(declared) == len(set(declared)), "a check id is declared twice"
    added = sorted(set(declared) - set(CHECK_IDS_GOLDEN))
    gone = sorted(set(CHECK_IDS_GOLDEN) - set(declared))
    assert declared == list(CHECK_IDS_GOLDEN), (
        f"check ids added {added} / removed or renamed {gone}: edit CHECK_IDS_GOLDEN"
    )


def test_every_layer_takes_its_check_ids_from_the_catalog() -> None:
    from harness.load.scenario import CHECK_IDS as SCENARIO_IDS
    from harness.load.scenario_model import CHECK_IDS as MODEL_IDS

    assert CHECK_IDS == MODEL_IDS == SCENARIO_IDS == CATALOG.ids
    assert tuple(REGISTRY) == CATALOG.ids
    for decl in CATALOG:
        spec = REGISTRY[decl.id]
        assert (spec.unit, spec.op, spec.summary) == (decl.unit, decl.op, decl.summary)
        assert spec.defaults == dict(decl.defaults)


def test_declared_scenarios_are_the_packaged_scenarios_that_list_the_check() -> None:
    from harness.load.scenario import load_scenario

    listed: dict[str, set[str]] = {cid: set() for cid in CATALOG.ids}
    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        for mode in ("quick", "full"):
            for cid in load_scenario(path.stem, mode).check_config():  # type: ignore[arg-type]
                listed[cid].add(path.stem)
    for decl in CATALOG:
        if decl.always:
            assert decl.id in CATALOG.always
        else:
            assert listed[decl.id] == set(decl.scenarios), decl.id


def test_the_generated_check_tables_are_current() -> None:
    found = problems(ROOT)
    assert not found, "the docs do not match harness/catalog:\n  " + "\n  ".join(found)


def test_the_readme_cell_shows_the_declared_defaults() -> None:
    cells = {c.id: c.readme_cell() for c in CATALOG}
    assert cells["cold_start.time_to_ready_s"].endswith("within 30 s")
    assert cells["steady.error_rate"] == "≤ 1 % failed"
    assert cells["steady.throughput"].startswith("≥ 95 % of the offered rate")
    assert cells["soak.threads_trend"] == "no thread-count growth > 0.5/min"
    # a changed default changes the generated README
    decl = CATALOG["steady.error_rate"]
    loose = dataclasses.replace(decl, defaults={**decl.defaults, "threshold": 0.025})
    assert loose.readme_cell() == "≤ 2.5 % failed"


def test_the_catalog_refuses_an_incomplete_or_misplaced_declaration() -> None:
    base = CATALOG["steady.error_rate"]
    groups = CATALOG.groups
    with pytest.raises(ValueError, match="declared twice"):
        Catalog(groups, [base, base])
    with pytest.raises(ValueError, match="threshold"):
        Catalog(groups, [dataclasses.replace(base, defaults={"stage": ""})])
    with pytest.raises(ValueError, match="passes_when names no default: 'limit'"):
        Catalog(groups, [dataclasses.replace(base, passes_when="≤ {limit}")])
    with pytest.raises(ValueError, match="name its scenarios"):
        Catalog(groups, [dataclasses.replace(base, scenarios=())])
    with pytest.raises(ValueError, match="keep groups together"):
        Catalog(groups, [base, CATALOG["cold_start.time_to_ready_s"]])
    with pytest.raises(ValueError, match="is not one of"):
        Catalog(groups, [dataclasses.replace(base, id="bogus.error_rate")])


def _ok_share(result: Mapping[str, Any], r: Result) -> Check:
    c = result["counters"]
    n = int(c["scheduled"])
    if not n:
        return r.skipped("no requests were scheduled")
    share = int(c["ok"]) / n
    ok = r.compare(share)
    return r.judged(share, ok, f"{c['ok']} of {n} requests answered ok", n=n)


TOY = CheckDecl(
    "steady.ok_share",
    unit="ratio",
    op=">=",
    defaults={"threshold": 0.99},
    summary="share of scheduled requests answered ok",
    passes_when="≥ {threshold:%} of scheduled requests answered ok",
    scenarios=("steady_state",),
)


def test_the_registry_refuses_a_missing_extra_or_double_implementation() -> None:
    fresh = Registry(CATALOG)
    with pytest.raises(RuntimeError, match=r"'steady.ok_share' is implemented but not declared"):
        fresh.implements("steady.ok_share")
    fresh.implements("steady.error_rate")(_ok_share)
    with pytest.raises(RuntimeError, match=r"'steady.error_rate' is implemented twice"):
        fresh.implements("steady.error_rate")(_ok_share)
    with pytest.raises(RuntimeError, match="declared in harness/catalog but not implemented"):
        fresh.verify()
    REGISTRY.verify()  # the real one is complete


def test_a_toy_check_is_one_declaration_and_one_function(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    before = (tuple(REGISTRY), CATALOG.ids)

    # 1. the declaration; the registry will not run it without its function
    toy = REGISTRY.extended(TOY)
    with pytest.raises(RuntimeError, match=r"not implemented: \['steady.ok_share'\]"):
        toy.verify()

    # 2. the function
    toy.implements("steady.ok_share")(_ok_share)
    toy.verify()
    ids = list(toy)  # the toy goes at the end of its group: the order reports list checks in
    assert ids[ids.index("steady.throughput") + 1 : ids.index("spike.recovery_s")] == [
        "steady.ok_share"
    ]

    # the engine runs it with its declared defaults, layered like every check's
    monkeypatch.setattr(registry_module, "REGISTRY", toy)
    sc = result(counters=counters(99, {"http_503": 1}), check_config={"steady.ok_share": {}})
    checks = evaluate(sc)
    assert [c.id for c in checks] == ["steady.ok_share", "accounting.balanced"]
    assert (checks[0].passed, checks[0].value, checks[0].threshold) == (True, 0.99, 0.99)
    assert (checks[0].op, checks[0].unit, checks[0].n) == (">=", "ratio", 100)
    strict = evaluate(sc, {"steady.ok_share": {"threshold": 0.995}})[0]
    assert strict.passed is False and strict.threshold == 0.995

    # the docs test names what to regenerate, and the section to write by hand
    stale = problems(ROOT, toy.catalog)
    assert f"README.md: the generated check table is stale — run `{COMMAND}`" in stale
    assert f"docs/checks.md: the generated check table is stale — run `{COMMAND}`" in stale
    assert any("no section '### `steady.ok_share`'" in p for p in stale)

    # regenerating (here into a copy) leaves only the hand-written section to do
    (tmp_path / "docs").mkdir()
    for rel in ("README.md", "docs/checks.md"):
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert regenerate(tmp_path, toy.catalog, write=True) == ["README.md", "docs/checks.md"]
    assert regenerate(tmp_path, toy.catalog) == []
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    row = "| `steady.ok_share` | ≥ 99 % of scheduled requests answered ok | steady_state |"
    assert row in readme and row in readme_table(toy.catalog)
    assert "[`steady.ok_share`](#steadyok_share)" in (tmp_path / "docs/checks.md").read_text()
    assert [p for p in problems(tmp_path, toy.catalog) if "stale" in p] == []
    assert len(undocumented(tmp_path, toy.catalog)) == 1

    # nothing global changed
    monkeypatch.undo()
    assert (tuple(REGISTRY), CATALOG.ids) == before
    assert registry_module.REGISTRY is REGISTRY


def test_the_command_reports_stale_tables_and_rewrites_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "docs").mkdir()
    for rel in ("README.md", "docs/checks.md"):
        shutil.copy(ROOT / rel, tmp_path / rel)
    readme = tmp_path / "README.md"
    current = readme.read_text(encoding="utf-8")
    row = next(line for line in current.splitlines() if line.startswith("| `steady.error_rate`"))
    readme.write_text(current.replace(row + "\n", ""), encoding="utf-8")

    assert catalog_main(["--root", str(tmp_path)]) == 1
    assert COMMAND in capsys.readouterr().err
    assert catalog_main(["--write", "--root", str(tmp_path)]) == 0
    assert "wrote README.md" in capsys.readouterr().out
    assert readme.read_text(encoding="utf-8") == current
    assert catalog_main(["--root", str(tmp_path)]) == 0
