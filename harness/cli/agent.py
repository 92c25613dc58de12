"""``harness agent``: the sampler and allow-listed chaos on the server's host, behind
token-checked HTTP, for a master elsewhere (``--agent URL``)."""

from __future__ import annotations

import argparse
import os
import sys

from harness.cli.common import Subparsers, add_protocol, check_sut_cmd, positive_float


def add_agent(sub: Subparsers) -> None:
    p = sub.add_parser(
        "agent",
        help="serve the sampler and chaos actions on the server's host (for --agent URL)",
        description="Run beside the server under test (same host, or a sidecar sharing its "
        "process namespace) so a Locust master on another host samples it and applies "
        "chaos through it (--agent URL --agent-token TOKEN --sut-pid PID there). Every "
        "request needs the bearer token; applied actions are reverted when the master's "
        "heartbeat stops for --lease seconds and when the agent exits.",
    )
    p.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765)")
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: loopback only; 0.0.0.0 for all)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="shared secret every request must carry (default: $HARNESS_AGENT_TOKEN; the "
        "environment keeps it out of `ps`)",
    )
    p.add_argument(
        "--allow",
        default="cpu_hog,pause,kill",
        help="chaos actions the master may apply here, comma-separated (default "
        "cpu_hog,pause,kill; '' for none): anything else is refused with 403",
    )
    p.add_argument(
        "--lease",
        type=positive_float,
        default=10.0,
        help="seconds without a word from the master before the agent reverts every "
        "applied action and stops its samplers (default 10)",
    )
    p.add_argument("--dir", default=None, help="where sampler files go (default: a temp dir)")
    p.add_argument(
        "--sut-cmd",
        default=None,
        help="start the server under test here and own it: the master needs no --sut-pid, "
        "kill chaos may restart it (on this host), and it is stopped when the agent exits. "
        "{port} is filled from --sut-port; bind it where the load can reach it",
    )
    p.add_argument(
        "--sut-port", type=int, default=None, help="{port} of --sut-cmd (default: a free port)"
    )
    p.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="serve HTTPS with this PEM certificate chain (with --tls-key); required for a "
        "--bind other hosts reach, unless --plain-http",
    )
    p.add_argument("--tls-key", default=None, metavar="FILE", help="the certificate's PEM key")
    p.add_argument(
        "--plain-http",
        action="store_true",
        help="serve plain HTTP on a non-loopback --bind: the token, and the power to pause "
        "or kill the server, cross the network unencrypted",
    )
    add_protocol(p)
    p.set_defaults(handler=_run_agent)


def _run_agent(args: argparse.Namespace) -> int:
    from harness.agent.server import AgentConfig, serve

    config = AgentConfig(
        token=args.token or os.environ.get("HARNESS_AGENT_TOKEN", ""),
        allow=tuple(a.strip() for a in args.allow.split(",") if a.strip()),
        bind=args.bind,
        port=args.port,
        lease_s=args.lease,
        root=args.dir,
        sut_cmd=args.sut_cmd,
        sut_port=args.sut_port,
        protocol=args.protocol,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        plain_http=args.plain_http,
    ).validate()
    check_sut_cmd(args.sut_cmd)

    def ready(url: str) -> None:
        print(
            f"harness agent: listening on {url} (allow: {', '.join(config.allow) or 'none'}; "
            f"lease {config.lease_s:g} s)",
            file=sys.stderr,
            flush=True,
        )

    return serve(config, ready=ready)
