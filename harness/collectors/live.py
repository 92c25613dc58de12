"""A pidstat-like table for the terminal (``harness sample --live``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from harness.collectors.process import ProcessTick, ThreadRow

_HEADER = (
    f"{'TID':>8} {'%usr':>7} {'%system':>7} {'%guest':>7} {'%wait':>7} {'%CPU':>7} "
    f"{'CPU':>3} {'cswch/s':>9} {'nvcswch/s':>9}  Command"
)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_live(tick: ProcessTick, threads: Sequence[ThreadRow], top: int = 20) -> str:
    """Process line, then the busiest ``top`` threads (by %CPU), like ``pidstat -t``."""
    clock = time.strftime("%H:%M:%S", time.localtime(tick.ts)) if tick.ts else f"{tick.t:.1f}s"
    mib = tick.rss_bytes / 2**20
    lines = [
        "",
        f"{clock}  procs {tick.pid_count}  %CPU {tick.cpu_pct:.2f} (usr {tick.usr_pct:.2f} "
        f"sys {tick.sys_pct:.2f})  RSS {mib:.1f} MiB  threads {tick.threads}  fds {tick.fds}  "
        f"cswch/s {_num(tick.cswch_s)}  nvcswch/s {_num(tick.nvcswch_s)}  "
        f"late {tick.late_s * 1000:.1f} ms",
        _HEADER,
    ]
    for r in sorted(threads, key=lambda r: r.cpu_pct, reverse=True)[:top]:
        lines.append(
            f"{r.tid:>8} {r.usr_pct:>7.2f} {r.system_pct:>7.2f} {r.guest_pct:>7.2f} "
            f"{_num(r.wait_pct):>7} {r.cpu_pct:>7.2f} {'-' if r.cpu is None else r.cpu:>3} {_num(r.cswch_s):>9} "
            f"{_num(r.nvcswch_s):>9}  |__{r.name}"
        )
    if len(threads) > top:
        lines.append(f"  … {len(threads) - top} more threads")
    return "\n".join(lines)
