"""The package as a user installs it: a wheel built from the repository, installed outside
the clone, runs a scenario against the reference server it ships.

The scenarios and the locustfiles live at the top of the repository and install as
package data of harness (``harness.scenarios``, ``harness.locustfiles``); the reference
server installs as ``harness_reference_server``: nothing generic at the top of
site-packages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from harness.load.scenario import packaged_scenarios
from harness.packaged import locustfile, packaged_dir

REPO = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed_in_pyproject() -> None:
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        ".".join(d.relative_to(REPO).parts)
        for top in ("harness", "harness_reference_server")
        for d in [REPO / top, *(REPO / top).rglob("*")]
        if d.is_dir() and any(d.glob("*.py"))
    }
    assert listed == on_disk | {"harness.scenarios", "harness.locustfiles"}


def test_the_source_checkout_finds_its_scenarios_and_locustfiles() -> None:
    assert packaged_dir("scenarios").samefile(REPO / "scenarios")
    assert locustfile("llm").samefile(REPO / "locustfiles" / "llm.py")
    shipped = {p.stem for p in (REPO / "scenarios").glob("*.toml")}
    assert set(packaged_scenarios()) == shipped and "steady_state" in shipped


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository built into a wheel (as ``pip install .`` builds it) and unpacked
    with ``pip install --target``: its dependencies come from this venv."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp / "dist").glob("inference_harness-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"harness", "harness_reference_server"}, tops
    assert "harness/scenarios/steady_state.toml" in names
    assert "harness/locustfiles/inference.py" in names
    assert "harness_reference_server/llm/tokens.py" in names
    site = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    return site


def _from_wheel(
    site: Path, cwd: Path, *argv: str, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_wheel_installed_outside_the_clone_runs_a_scenario_on_its_own_files(
    installed_wheel: Path, tmp_path: Path
) -> None:
    site = installed_wheel
    where = _from_wheel(
        site,
        tmp_path,
        "-c",
        "import harness, harness_reference_server; from harness.packaged import locustfile, "
        "packaged_dir; print(harness.__file__); print(harness_reference_server.__file__); "
        "print(packaged_dir('scenarios')); print(locustfile())",
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert Path(line).is_relative_to(site), line  # nothing read from the clone
    listed = Path(
        _from_wheel(site, tmp_path, "-m", "harness", "where", "locustfile").stdout.strip()
    )
    assert listed.is_file() and listed.is_relative_to(site)

    # the LLM halves import from the wheel too (the server's engine, the harness's protocol)
    llm = _from_wheel(
        site,
        tmp_path,
        "-c",
        "import harness_reference_server.llm.api as a, harness.protocols.openai_wire as w; "
        "print(a.__file__); print(w.__file__)",
    )
    assert llm.returncode == 0, llm.stderr
    assert all(Path(line).is_relative_to(site) for line in llm.stdout.split())

    # a scenario against the shipped reference server, started by the harness from the
    # wheel, with the shipped locustfile and scenario file
    out = tmp_path / "steady_state"
    r = _from_wheel(
        site, tmp_path, "-m", "harness", "run", "steady_state", "--duration", "6",
        "--capacity-rps", "150", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    (sc,) = doc["scenarios"]
    assert sc["name"] == "steady_state" and not doc["partial"]
    assert "harness_reference_server" in doc["sut"]["cmd"]
    assert (out / "report.html").stat().st_size > 0
