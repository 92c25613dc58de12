"""llama-cpp-python's OpenAI-compatible server judged by the harness's LLM checklist, with
its request interruption on and off.

    flock /tmp/harness-cpu.lock python bench/llama_cpp_peer.py
        [--python /tmp/harness-llamacpp-venv/bin/python] [--scenarios llm_steady]
        [--out /tmp/llama-cpp-peer] [--settings true,false] [--input include_usage=false]

llama-cpp-python (PyPI ``llama-cpp-python[server]``) builds llama.cpp from source when
it installs (no wheel for this machine on PyPI: ~10 minutes of both cores here), so it is
a benchmark, not a CI peer. It lives in a venv of its own (``--python``), made once::

    python3 -m venv /tmp/harness-llamacpp-venv
    /tmp/harness-llamacpp-venv/bin/pip install "llama-cpp-python[server]" gguf tokenizers

The model is a tiny random Llama written as GGUF by that venv's python
(tests/servers/build_tiny_gguf.py: the vLLM peer's shape and tokenizer; nothing is
downloaded). For each setting of the server's ``--interrupt_requests`` (its default is
True: a stream that is running when another request arrives is ended with ``[DONE]``
and no ``finish_reason``, so the next one can take the model), one server is started on
the highest core (the harness's generator gets the others), ``harness acceptance
--protocol openai --quick --scenarios S --target URL --sut-pid PID`` runs against it, and
the server is stopped by its pid. Prints, per setting, each scenario's verdict, its
checks, its streams (ok, failed, by problem) and TTFT / TPOT p50 and p99.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUILDER = REPO / "tests" / "servers" / "build_tiny_gguf.py"
MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server was not ready in {timeout_s:g} s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def judged(out: Path) -> list[dict[str, Any]]:
    """Each scenario's verdict, checks and token figures from ``out/results.json``."""
    doc = json.loads((out / "results.json").read_text())
    rows = []
    for sc in doc["scenarios"]:
        total = ((sc.get("tokens") or {}).get("by_class") or {}).get("total") or {}
        rows.append(
            {
                "scenario": sc["name"],
                "verdict": sc["verdict"],
                "validity": sc.get("validity") or [],
                "capacity_rps": sc.get("capacity_rps"),
                "checks": {c["id"]: (c["passed"], c.get("value")) for c in sc["checks"]},
                "failed_checks": {
                    c["id"]: c.get("detail", "")[:400] for c in sc["checks"] if c["passed"] is False
                },
                "streams": total.get("requests"),
                "ok": total.get("ok"),
                "failed": total.get("failed"),
                "problems": (total.get("goodput") or {}).get("by_problem"),
                "ttft_ms": {q: (total.get("ttft_ms") or {}).get(f"{q}_ms") for q in ("p50", "p99")},
                "tpot_ms": {q: (total.get("tpot_ms") or {}).get(f"{q}_ms") for q in ("p50", "p99")},
                "tokens_out": total.get("tokens_out"),
            }
        )
    return rows


def run_setting(
    python: str, model: Path, interrupt: bool, scenarios: str, out: Path, inputs: list[str]
) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    server_core = {cores[-1]}
    port = free_port()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    argv = [
        python, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
        "--n_threads", "1", "--n_threads_batch", "1",
        "--interrupt_requests", str(interrupt),
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: os.sched_setaffinity(0, server_core),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/v1/models", proc, 120, log)
        ready_s = time.monotonic() - started
        t0 = time.monotonic()
        run = subprocess.run(
            [
                sys.executable, "-m", "harness", "acceptance", "--protocol", "openai",
                "--quick", "--scenarios", scenarios, "--target", url,
                "--sut-pid", str(proc.pid), "--model", MODEL, "--out", str(out / "run"),
                "--no-html-report", *(a for spec in inputs for a in ("--input", spec)),
            ],
            cwd=REPO, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        wall_s = time.monotonic() - t0
    finally:
        stop(proc)
    (out / "harness.log").write_text(run.stdout + run.stderr)
    if not (out / "run" / "results.json").exists():
        raise SystemExit(f"no results (exit {run.returncode}): {run.stderr[-2000:]}")
    return {
        "interrupt_requests": interrupt,
        "exit": run.returncode,
        "server_ready_s": round(ready_s, 1),
        "wall_s": round(wall_s, 1),
        "scenarios": judged(out / "run"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/tmp/harness-llamacpp-venv/bin/python")
    ap.add_argument("--scenarios", default="llm_steady")
    ap.add_argument("--out", type=Path, default=Path("/tmp/llama-cpp-peer"))
    ap.add_argument(
        "--settings", default="true,false", help="interrupt_requests settings, in order"
    )
    ap.add_argument(
        "--input",
        action="append",
        default=[],
        help="KEY=VALUE of the [llm] table for every scenario, passed to harness acceptance "
        "(e.g. include_usage=false: llama-cpp-python sends no usage chunk); repeatable",
    )
    args = ap.parse_args()
    if not Path(args.python).exists():
        raise SystemExit(f"no python at {args.python}: make the venv (module docstring)")
    version = subprocess.run(
        [args.python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.out / "tiny.gguf"
    if not model.exists():
        subprocess.run([args.python, str(BUILDER), str(model)], check=True, timeout=300)
    print(
        f"llama-cpp-python {version}; {os.cpu_count()} CPUs ({platform.processor() or '?'}), "
        f"Python {platform.python_version()}; server on core {max(os.sched_getaffinity(0))}, "
        f"scenarios {args.scenarios}, inputs {args.input or 'none'}"
    )
    results = []
    for setting in args.settings.split(","):
        interrupt = setting.strip().lower() == "true"
        r = run_setting(
            args.python,
            model,
            interrupt,
            args.scenarios,
            args.out / f"interrupt-{setting}",
            args.input,
        )
        results.append(r)
        print(f"\ninterrupt_requests={interrupt}: exit {r['exit']}, server ready in "
              f"{r['server_ready_s']} s, acceptance {r['wall_s']} s")  # fmt: skip
        for sc in r["scenarios"]:
            print(f"  {sc['scenario']}: {sc['verdict']} {sc['validity'] or ''}")
            print(f"    capacity {sc['capacity_rps']}, streams {sc['streams']}, ok {sc['ok']}, "
                  f"failed {sc['failed']}, problems {sc['problems']}, tokens out {sc['tokens_out']}")  # fmt: skip
            print(f"    TTFT ms {sc['ttft_ms']}, TPOT ms {sc['tpot_ms']}")
            for cid, (passed, value) in sc["checks"].items():
                print(f"    {cid}: {passed} ({value})")
            for cid, detail in sc["failed_checks"].items():
                print(f"    FAILED {cid}: {detail}")
    (args.out / "summary.json").write_text(json.dumps(results, indent=1))
    print(f"\n(whole output: {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
