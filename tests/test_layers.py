"""The import contract of docs/architecture.md, enforced: no lower layer imports a higher one.

Measure ≠ judge: the server, the sampler, the chaos runner and the load side never import
the analysis, the checks or the reports (the Locust plugin reaches the judging side only
through ``harness.finish``); the analysis is pure statistics; the reference server knows
nothing of the harness. An AST scan of every module, imports inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# module prefix → harness/harness_reference_server packages it may import (besides itself).
# The first matching prefix wins, so exceptions come before their package.
ALLOWED: tuple[tuple[str, frozenset[str]], ...] = (
    ("harness_reference_server", frozenset()),
    ("harness.errors", frozenset()),
    ("harness.primitives", frozenset()),  # atomic write, signal trap: every layer's
    ("harness.catalog", frozenset()),  # the check declarations: stdlib only
    ("harness.packaged", frozenset()),  # where the shipped scenarios / locustfiles are
    # the results owner computes the derived numbers it stores (window percentiles, the
    # USL fit) with the pure analysis functions; the load side reaches them only through it
    ("harness.results", frozenset({"harness", "harness.errors", "harness.analysis"})),
    # the wire protocols: pure codecs of what is said to a server, below every layer
    ("harness.protocols", frozenset({"harness.errors"})),
    ("harness.sut", frozenset({"harness.errors"})),
    ("harness.collectors", frozenset({"harness.errors"})),
    ("harness.chaos", frozenset({"harness.errors", "harness.sut", "harness.collectors"})),
    # `harness agent` on the server's host: the sampler and the chaos actions behind HTTP
    (
        "harness.agent",
        frozenset({"harness.errors", "harness.sut", "harness.collectors", "harness.chaos"}),
    ),
    (
        "harness.load.plugin",
        frozenset(
            {"harness", "harness.errors", "harness.sut", "harness.collectors"}
            | {"harness.chaos", "harness.results", "harness.finish"}
        ),
    ),
    # the web UI's live Checklist tab judges the run so far, through harness.finish too
    (
        "harness.load.live",
        frozenset(
            {"harness", "harness.errors", "harness.sut", "harness.collectors"}
            | {"harness.chaos", "harness.results", "harness.finish", "harness.catalog"}
        ),
    ),
    (
        "harness.load",
        frozenset(
            {"harness", "harness.errors", "harness.sut", "harness.collectors"}
            | {"harness.chaos", "harness.results", "harness.catalog", "harness.agent"}
            | {"harness.packaged"}
        ),
    ),
    ("harness.analysis", frozenset()),
    (
        "harness.checks",
        frozenset({"harness.analysis", "harness.results", "harness.errors", "harness.catalog"}),
    ),
    ("harness.report", frozenset({"harness.analysis", "harness.results", "harness.errors"})),
    (
        "harness.finish",
        frozenset({"harness.checks", "harness.report", "harness.results", "harness.errors"}),
    ),
    # one scenario as one `locust -f --headless` subprocess: what acceptance and peak share
    (
        "harness.locust_run",
        frozenset(
            {"harness.finish", "harness.results", "harness.load", "harness.errors", "harness.sut"}
            | {"harness.packaged"}
        ),
    ),
    # `harness peak` / `harness tune` drive whole runs (harness.locust_run's run_one)
    # and read their judged results; they render their own summary and report
    (
        "harness.peak",
        frozenset(
            {"harness.locust_run", "harness.results", "harness.analysis", "harness.report"}
            | {"harness.errors", "harness.sut"}
        ),
    ),
    # the plan (checked with the agent, --capacity=peak searched first), its scenarios in
    # order, retries, merge, finish (and the peak search's one-line answer, from report)
    (
        "harness.acceptance",
        frozenset(
            {"harness.locust_run", "harness.finish", "harness.results", "harness.load"}
            | {"harness.checks", "harness.errors", "harness.sut", "harness.agent"}
            | {"harness.peak", "harness.report"}
        ),
    ),
    ("harness.cli", None),  # type: ignore[arg-type]  # the top: everything
    # the tests' and benchmarks' builders and helpers: may import anything, imported by
    # nothing in the harness (test_nothing_in_the_harness_imports_its_test_helpers)
    ("harness.testing", None),  # type: ignore[arg-type]
    ("harness.__main__", frozenset({"harness.cli"})),
    ("harness", frozenset()),  # harness/__init__.py: the version only
    ("locustfiles", frozenset({"harness.load"})),
)

# Single modules one layer may import from a layer it otherwise may not: (importer prefix,
# imported module).
EXCEPTIONS: frozenset[tuple[str, str]] = frozenset(
    {
        # the LLM protocol checks each stream against the server's own output oracle:
        # pure and stdlib-only (test_the_llm_output_oracle_is_stdlib_only)
        ("harness.protocols", "harness_reference_server.llm.tokens"),
        # the LLM workloads build prompts of an exact token count with the same tokenizer
        ("harness.load.llm_workload", "harness_reference_server.llm.tokens"),
        # the OpenAI protocol's inputs are the token workloads, built by the one module
        # that builds them (pure: no gevent, no Locust, no sockets)
        ("harness.protocols.openai_wire", "harness.load.llm_workload"),
        # the streaming user counts goodput as it records, with the per-stream definitions
        # the checks use (TPOT, SLO conformance: pure, stdlib-only): one definition, not two
        ("harness.load.stream_recording", "harness.analysis.token_metrics"),
    }
)

# What "the package" of an imported name is, for the contract (the first two parts,
# except the top-level modules of harness, which are their own layer).
_TOP_MODULES = {"errors", "results", "sut", "finish", "locust_run", "acceptance", "cli", "__main__"}
# below every layer: any module may import them
_BASE = {"harness.primitives", "harness.protocols"}


def _layer(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "harness_reference_server":
        return "harness_reference_server"
    if len(parts) == 1:
        return "harness"
    if parts[1] == "__version__":
        return "harness"
    return ".".join(parts[:2])


def _module_name(path: Path) -> str:
    mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return mod.removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "harness":  # from harness import sut → harness.sut
                out |= {f"harness.{a.name}" for a in node.names}
            else:
                out.add(node.module)
    return {n for n in out if n.split(".")[0] in ("harness", "harness_reference_server")}


def _rule(module: str) -> frozenset[str] | None:
    for prefix, allowed in ALLOWED:
        if module == prefix or module.startswith(prefix + "."):
            return allowed
    raise AssertionError(f"{module}: no layer in the import contract; add it to ALLOWED")


MODULES = sorted(
    p
    for pkg in ("harness", "harness_reference_server", "locustfiles")
    for p in (ROOT / pkg).rglob("*.py")
)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_no_module_imports_a_higher_layer(path: Path) -> None:
    module = _module_name(path)
    allowed = _rule(module)
    if allowed is None:
        return
    own = _layer(module)
    bad = sorted(
        name
        for name in _imports(path)
        if _layer(name) != own
        and _layer(name) not in allowed
        and _layer(name) not in _BASE
        and not any(module.startswith(prefix) and name == target for prefix, target in EXCEPTIONS)
    )
    assert not bad, (
        f"{module} imports {bad}; its layer may import only {sorted(allowed)} "
        "(docs/architecture.md, 'Packages and who owns what')"
    )


def test_the_llm_output_oracle_is_stdlib_only() -> None:
    """harness_reference_server.llm.tokens is what a client imports to check streams (the one
    exception above): it imports nothing but the standard library."""
    import sys

    path = ROOT / "harness_reference_server" / "llm" / "tokens.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    outside = sorted(n for n in names if n.split(".")[0] not in sys.stdlib_module_names)
    assert not outside, f"harness_reference_server/llm/tokens.py imports {outside}: stdlib only"


def test_nothing_in_the_harness_imports_its_test_helpers() -> None:
    """harness.testing serves tests/ and bench/ only: no other module of the harness, the
    reference server or the locustfile imports it (harness.cli included)."""
    offenders = {
        _module_name(path): sorted(n for n in _imports(path) if _layer(n) == "harness.testing")
        for path in MODULES
        if _layer(_module_name(path)) != "harness.testing"
    }
    offenders = {module: names for module, names in offenders.items() if names}
    assert not offenders, f"modules importing the test helpers: {offenders}"


def test_the_contract_catches_a_violation(tmp_path: Path) -> None:
    """The scan is not vacuous: a load module importing the checks is reported."""
    fake = ROOT / "harness" / "load" / "_layer_probe_tmp.py"
    try:
        fake.write_text("def f():\n    from harness.checks import evaluate\n")
        with pytest.raises(AssertionError, match=r"imports \['harness.checks'\]"):
            test_no_module_imports_a_higher_layer(fake)
    finally:
        fake.unlink()


def test_docs_and_code_stand_on_their_own() -> None:
    """What the code relies on lives in docs/: nothing points at design notes outside the
    repository (a clone has none of them)."""
    import re

    outside = re.compile(r"\.\./shared|\b(?:DESIGN|REFERENCE) §")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for pkg in (
            "harness",
            "harness_reference_server",
            "locustfiles",
            "scenarios",
            "docs",
            "bench",
        )
        for p in sorted((ROOT / pkg).rglob("*"))
        if p.suffix in (".py", ".md", ".toml")
        for i, line in enumerate(p.read_text().splitlines(), start=1)
        if outside.search(line)
    ]
    offenders += [
        f"README.md:{i}"
        for i, line in enumerate((ROOT / "README.md").read_text().splitlines(), start=1)
        if outside.search(line)
    ]
    assert not offenders, f"references outside the repository: {offenders}"
