"""What the subcommands share: the parser that exits 2 with one line, the argument types,
the options several commands take (one wording each), the checks of their combinations."""

from __future__ import annotations

import argparse
import sys

from harness.errors import ConfigError, ExitCode


class Parser(argparse.ArgumentParser):
    """argparse that exits 2 with one line naming the fix (no usage dump on stderr)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


Subparsers = argparse._SubParsersAction  # what each subcommand's ``add`` gets


# --- argument types ---------------------------------------------------------------------


def positive_float(text: str) -> float:
    """Seconds > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 seconds")
    return v


def positive_ms(text: str) -> float:
    """A latency > 0 ms."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of ms") from None
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a latency > 0 ms, e.g. 100")
    return v


def fraction(text: str) -> float:
    """A number (its range is checked by the config that takes it)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


# --- options several commands take --------------------------------------------------------


def add_target_url(g: argparse._ActionsContainer) -> None:
    """--target URL (or Locust's spelling, --host): a server the harness did not start."""
    g.add_argument(
        "--target",
        "--host",
        dest="target",
        default=None,
        metavar="URL",
        help="attach to a running server (--host is the same option, as Locust spells it)",
    )


def add_sut_pid(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--sut-pid",
        type=int,
        default=None,
        help="with --target: the server's pid, so its process is sampled (and chaos reaches it)",
    )


def add_deployment_options(g: argparse._ActionsContainer) -> None:
    """How requests reach a deployed server (headers, TLS, its metrics, the agent on its
    host): the same options, with the same meaning, on every command that sends load."""
    g.add_argument(
        "--header",
        action="append",
        default=None,
        metavar="NAME:VALUE",
        help="send this header with every request, e.g. 'Authorization: Bearer TOKEN' or "
        "'Host: model.example.com' (repeatable; default: $HARNESS_HEADER, one header or a "
        "JSON list). Results record the names only",
    )
    g.add_argument(
        "--ca-cert",
        default=None,
        metavar="FILE",
        help="https:// target: trust the CA in this PEM file (default: the system's CAs)",
    )
    g.add_argument(
        "--insecure", action="store_true", help="https:// target: do not verify its certificate"
    )
    g.add_argument(
        "--metrics-url",
        default=None,
        metavar="URL",
        help="the server's Prometheus metrics when not at TARGET/metrics, e.g. "
        "http://HOST:8002/metrics (Triton)",
    )
    g.add_argument(
        "--agent",
        default=None,
        metavar="URL",
        help="the server runs on another host: sample it and apply chaos through the "
        "`harness agent` there (needs --target and --sut-pid, its pid on that host)",
    )
    g.add_argument(
        "--agent-token",
        default=None,
        metavar="TOKEN",
        help="the agent's --token (default: $HARNESS_AGENT_TOKEN; the environment keeps it "
        "out of `ps`)",
    )
    g.add_argument(
        "--agent-ca-cert",
        default=None,
        metavar="FILE",
        help="an https:// agent: trust the CA in this PEM file (default: "
        "$HARNESS_AGENT_CA_CERT, else the system's CAs)",
    )


def add_sut_cores(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--sut-cores", default=None, help="cores for a server the harness starts, e.g. 1 or 0-1"
    )


def add_model(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--model", default=None, help="model name on the server (V2 protocol); default: its own"
    )


def add_protocol(g: argparse._ActionsContainer) -> None:
    from harness import protocols

    g.add_argument(
        "--protocol",
        default=None,
        help=f"the server's wire protocol: {', '.join(protocols.names())} (default "
        f"{protocols.DEFAULT}), or MODULE:ATTRIBUTE naming a WireProtocol of one's own",
    )


def add_checklist(p: argparse._ActionsContainer) -> None:
    p.add_argument("--checklist", default=None, help="TOML file overriding check thresholds")


def add_locust_arg(p: argparse._ActionsContainer, each: str, example: str = "") -> None:
    """--locust-arg, passed to ``each`` Locust run (e.g. "scenario's", "point's")."""
    p.add_argument(
        "--locust-arg",
        action="append",
        default=[],
        metavar="ARG",
        help=f"extra argument passed to each {each} locust run (repeatable){example}",
    )


# The Locust plugin's everyday load options that run and acceptance take as their own:
# declared once, in the plugin (harness.load.options), copied from there with their type
# and help, and handed to every Locust run of the command.
FORWARDED_LOAD_OPTIONS = (
    "--seed",
    "--capacity-rps",
    "--request-timeout",
    "--closed-loop",
    "--max-in-flight",
    "--batch-size",
    "--input-data",
)


def add_forwarded_load_options(p: argparse._ActionsContainer) -> None:
    """The plugin's ``FORWARDED_LOAD_OPTIONS``, declared as the plugin declares them."""
    import configargparse

    from harness.load.options import add_options

    plugin = configargparse.ArgumentParser(add_help=False)
    add_options(plugin)
    by_flag = {a.option_strings[0]: a for a in plugin._actions if a.option_strings}
    for flag in FORWARDED_LOAD_OPTIONS:
        a = by_flag[flag]
        p.add_argument(
            flag,
            dest="forward_" + a.dest,
            type=a.type,
            default=None,
            metavar=a.metavar or a.dest.upper(),
            help=a.help,
        )


def forwarded_load_args(args: argparse.Namespace) -> list[str]:
    """The forwarded options given, as Locust arguments."""
    out: list[str] = []
    for flag in FORWARDED_LOAD_OPTIONS:
        value = getattr(args, "forward_" + flag.lstrip("-").replace("-", "_"), None)
        if value is not None:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


SUT_CMD_HELP = (
    "start this server; {port} (and {threads}) are filled in, e.g. "
    '"tritonserver --model-repository /models --http-port {port}"'
)


def check_sut_cmd(sut_cmd: str | None) -> None:
    """--sut-cmd: a {port} placeholder, no other than {port}/{threads} (harness.sut's check)."""
    if sut_cmd:
        from harness.sut import check_command

        check_command(sut_cmd)


def check_attach(target: str | None, sut_pid: int | None) -> None:
    """--sut-pid names a running server's process: it needs that server's --target URL."""
    if target is None and sut_pid is not None:
        raise ConfigError("--sut-pid needs --target URL (the server's address)")


def to_stderr(text: str) -> None:
    """Progress of a long command: stderr, so stdout keeps its result line."""
    print(text, file=sys.stderr, flush=True)
