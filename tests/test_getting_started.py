"""docs/getting-started.md, executed: the tutorial's server and harness run, as the doc
writes them.

The doc marks what this test takes with an HTML comment before a fenced block:
``<!-- tutorial: my_model.py -->`` (a file the user pastes, written here as is),
``<!-- tutorial: server -->`` (the command that starts it), ``<!-- tutorial: run -->``
(the harness command), ``<!-- tutorial: verdict -->`` (the verdict line the doc shows) and
``<!-- tutorial: files -->`` (the files the doc says the run writes). The only substitutions
are the ones the doc names: its venv's interpreter (``kserve-venv/bin/python``) becomes
``HARNESS_KSERVE_PYTHON``, its port (``8080``) a free port, ``$SERVER_PID`` the server's pid.

The run must end as the doc says: exit 0 and a verdict line of the shape the doc shows
(the same words, any figures). One server start and one 15 s ``steady_state`` run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness.testing.locust_runs import REPO, stop
from harness.testing.server import wait_http_ok

pytestmark = pytest.mark.slow

DOC = REPO / "docs" / "getting-started.md"
DOC_PYTHON = "kserve-venv/bin/python"
DOC_PORT = "8080"
DOC_PID = "$SERVER_PID"
MARK = re.compile(r"<!-- tutorial: (\S+) -->\s*\n```[a-z]*\n(.*?)\n```", re.S)

KSERVE_PY = os.environ.get("HARNESS_KSERVE_PYTHON", "")
if not (KSERVE_PY and Path(KSERVE_PY).exists()):
    pytest.skip(
        "kserve's venv is not set up: .ci/run makes it (python3 -m venv V && V/bin/pip install "
        "kserve==0.21.0; export HARNESS_KSERVE_PYTHON=V/bin/python)",
        allow_module_level=True,
    )


def tutorial_blocks(text: str) -> dict[str, str]:
    """Each marked block's text by its mark; a mark used twice is a defect of the doc."""
    blocks: dict[str, str] = {}
    for mark, body in MARK.findall(text):
        assert mark not in blocks, f"<!-- tutorial: {mark} --> marks two blocks"
        blocks[mark] = body
    return blocks


def verdict_pattern(shown: str) -> re.Pattern[str]:
    """The doc's verdict line with each figure free: the same words, any numbers."""
    parts = re.split(r"\d+(?:\.\d+)?", shown.strip())
    return re.compile(r"\d+(?:\.\d+)?".join(re.escape(p) for p in parts))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_argv(block: str, port: int) -> list[str]:
    """The doc's start command (its first line, run in the background there) as argv."""
    line = block.splitlines()[0].strip()
    assert line.endswith(" &") and line.startswith(DOC_PYTHON), line
    words = shlex.split(line.removesuffix(" &"))
    words[0] = KSERVE_PY
    assert words.count(DOC_PORT) == 1, words
    return [str(port) if w == DOC_PORT else w for w in words]


def test_the_verdict_pattern_frees_figures_and_keeps_words() -> None:
    pat = verdict_pattern("PASS — 4 of 4 checks passed in 1.5 s")
    assert pat.fullmatch("PASS — 12 of 12 checks passed in 0.25 s")
    assert not pat.fullmatch("FAIL — 4 of 4 checks passed in 1.5 s")


def test_the_doc_marks_every_block_the_tutorial_runs() -> None:
    blocks = tutorial_blocks(DOC.read_text())
    assert set(blocks) == {"my_model.py", "server", "run", "verdict", "files"}, set(blocks)
    assert "$SERVER_PID" in blocks["run"] and f"127.0.0.1:{DOC_PORT}" in blocks["run"]
    assert blocks["server"].splitlines()[1].strip() == "SERVER_PID=$!"


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    blocks = tutorial_blocks(DOC.read_text())
    (tmp_path / "my_model.py").write_text(blocks["my_model.py"] + "\n")
    port = _free_port()
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        _server_argv(blocks["server"], port),
        cwd=tmp_path,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        ready = f"http://127.0.0.1:{port}/v2/health/ready"
        wait_http_ok(ready, server, 60, log, "the tutorial's server")
        line = blocks["run"].strip()
        assert line.count(DOC_PID) == 1 and line.startswith("harness "), line
        line = line.replace(f"127.0.0.1:{DOC_PORT}", f"127.0.0.1:{port}")
        line = line.replace(DOC_PID, str(server.pid))
        words = shlex.split(line)
        # the harness of this venv, as the doc's activated venv would find it
        run = subprocess.run(
            [sys.executable, "-m", "harness", *words[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=150,
        )
    finally:
        stop(server)
    said = run.stdout + run.stderr
    pattern = verdict_pattern(blocks["verdict"])
    assert run.returncode == 0, said[-3000:]
    assert any(pattern.fullmatch(x.strip()) for x in said.splitlines()), (pattern, said[-3000:])
    for name in blocks["files"].split():
        assert (tmp_path / name).is_file(), f"the doc names {name}; the run did not write it"
