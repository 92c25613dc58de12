"""The plugin's command-line options (each with a ``HARNESS_*`` environment variable),
validated into a frozen ``Options``, and applied to the scenario they select."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from harness import protocols
from harness.errors import ConfigError, HarnessError
from harness.load.input_options import add_input_options, input_options_from
from harness.load.scenario import Scenario, load_scenario

# the environment variable of --golden-cache (set per scenario by harness.locust_run)
GOLDEN_CACHE_ENV = "HARNESS_GOLDEN_CACHE"


@dataclass(frozen=True)
class Options:
    """The plugin's command-line options, validated (see plugin.py for their help)."""

    scenario: str
    mode: str
    model: str | None
    sut_pid: int | None
    sut_cmd: str | None
    sut_cores: str | None
    out: str
    inputs: tuple[str, ...]
    sample_request: str | None
    closed_loop_users: int | None
    seed: int | None
    max_in_flight: int | None
    calibrate_s: float | None
    capacity_rps: float | None
    request_timeout_s: float | None
    ready_timeout_s: float
    sample: bool
    verify: bool
    duration_s: float | None = None
    checklist: str | None = None
    # deployment options: header values are secrets — the results record names
    headers: tuple[str, ...] = ()  # "Name: value", validated
    ca_cert: str | None = None
    insecure: bool = False
    metrics_url: str | None = None
    # the server on another host: sampler and chaos through `harness agent`
    agent_url: str | None = None
    agent_token: str | None = None  # a secret: never sent to workers, never in results
    golden_cache: str | None = None  # --golden-cache FILE: golden outputs kept per server
    # check ids / scenario names accepted unjudged or not run (--allow-skip)
    allow_skip: tuple[str, ...] = ()
    protocol: str = protocols.DEFAULT  # --protocol: what is said to the server
    batch_size: int = 1  # --batch-size: inferences per request
    input_data: str | None = None  # --input-data FILE (absolute): the requests' data

    def to_wire(self) -> dict[str, Any]:
        """A plain dict for the master's plan message (harness.load.wire)."""
        return {
            **asdict(self),
            "inputs": list(self.inputs),
            "headers": list(self.headers),
            "allow_skip": list(self.allow_skip),
            "agent_token": None,  # the workers never talk to the agent
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Options:
        """The master's options as a worker gets them (fields checked by the caller)."""
        return cls(
            **{
                **data,
                "inputs": tuple(data["inputs"]),
                "headers": tuple(data["headers"]),
                "allow_skip": tuple(data.get("allow_skip") or ()),
            }
        )


HARNESS_DESTS: set[str] = set()  # the plugin's option names (the web form's harness fields)
WEB_FORM_HIDDEN = ("--quick", "--full", "--header", "--agent-token")


def add_options(parser: Any) -> None:
    g = parser.add_argument_group(
        "harness",
        "Inference load & chaos harness. The scenario decides users and rates stage by stage: "
        "-u/--users and -r/--spawn-rate are refused; -t/--run-time sets the scenario's length "
        "(its stages scaled, as --duration does).",
    )
    g.add_argument(
        "--scenario",
        default="steady_state",
        env_var="HARNESS_SCENARIO",
        help="scenario name (scenarios/NAME.toml) or path to a .toml file; it sets the users "
        "and rates of every stage (Locust's users and spawn rate do not apply)",
    )
    g.add_argument(
        "--mode",
        choices=["quick", "full"],
        default="quick",
        env_var="HARNESS_MODE",
        help="quick (CI) or full variant of the scenario",
    )
    g.add_argument(
        "--quick", dest="mode", action="store_const", const="quick", help="same as --mode quick"
    )
    g.add_argument(
        "--full", dest="mode", action="store_const", const="full", help="same as --mode full"
    )
    g.add_argument(
        "--model",
        default=None,
        env_var="HARNESS_MODEL",
        help="model name on the server (default: the one the server's metadata names)",
    )
    g.add_argument(
        "--protocol",
        default=None,
        env_var="HARNESS_PROTOCOL",
        help=f"wire protocol (default: the scenario's, else {protocols.DEFAULT}): "
        f"{', '.join(protocols.names())} or MODULE:ATTRIBUTE",
    )
    g.add_argument(
        "--sut-pid",
        type=int,
        default=None,
        env_var="HARNESS_SUT_PID",
        help="pid of the running server: sample it, apply chaos, watch it",
    )
    g.add_argument(
        "--sut-cmd",
        default=None,
        env_var="HARNESS_SUT_CMD",
        help="start this server command ({port}, {threads} filled in); --host is derived",
    )
    g.add_argument(
        "--sut-cores",
        default=None,
        env_var="HARNESS_SUT_CORES",
        help="cores for a --sut-cmd server, e.g. 1 or 0,2-3 (default: half of them)",
    )
    g.add_argument(
        "--out",
        default="harness-results",
        env_var="HARNESS_OUT",
        help="directory for results.json and samples/",
    )
    add_input_options(g)
    g.add_argument(
        "--closed-loop",
        type=int,
        default=None,
        env_var="HARNESS_CLOSED_LOOP",
        metavar="USERS",
        help="run every stage closed loop with USERS users",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=None,
        env_var="HARNESS_SEED",
        metavar="N",
        help="override the scenario's seed (arrivals, payloads)",
    )
    g.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        env_var="HARNESS_MAX_IN_FLIGHT",
        metavar="N",
        help="open loop: in-flight cap over all workers; beyond it requests are dropped",
    )
    g.add_argument(
        "--calibrate-s",
        type=float,
        default=None,
        env_var="HARNESS_CALIBRATE_S",
        help="length of the capacity probe for relative rates",
    )
    g.add_argument(
        "--capacity-rps",
        type=float,
        default=None,
        env_var="HARNESS_CAPACITY_RPS",
        metavar="RPS",
        help="known capacity in req/s (skips the probe)",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        env_var="HARNESS_REQUEST_TIMEOUT",
        metavar="SECONDS",
        help="client deadline per request in seconds (default: the scenario's)",
    )
    g.add_argument(
        "--ready-timeout",
        type=float,
        default=60.0,
        env_var="HARNESS_READY_TIMEOUT",
        help="seconds to wait for a --sut-cmd server to become ready",
    )
    g.add_argument(
        "--no-sample",
        action="store_true",
        default=False,
        env_var="HARNESS_NO_SAMPLE",
        help="do not run the server sampler even when the pid is known",
    )
    g.add_argument(
        "--duration",
        type=float,
        default=None,
        env_var="HARNESS_DURATION",
        help="stretch or shrink the scenario's stages to this many seconds in all "
        "(-t/--run-time does the same)",
    )
    g.add_argument(
        "--checklist",
        default=None,
        env_var="HARNESS_CHECKLIST",
        help="TOML file overriding check thresholds (see docs/checks.md)",
    )
    g.add_argument(
        "--allow-skip",
        dest="allow_skip",
        default=None,
        env_var="HARNESS_ALLOW_SKIP",
        help="comma-separated check ids to accept unjudged: a scenario passes only when "
        "every check that defines it was judged (docs/checks.md)",
    )
    g.add_argument(
        "--header",
        dest="harness_header",
        action="append",
        default=None,
        env_var="HARNESS_HEADER",
        metavar="NAME:VALUE",
        help="send this header with every request to the server, e.g. 'Authorization: Bearer "
        "TOKEN' or 'Host: model.example.com' (repeatable; the environment variable holds one "
        "or a JSON list). Results record the names only",
    )
    g.add_argument(
        "--ca-cert",
        default=None,
        env_var="HARNESS_CA_CERT",
        metavar="FILE",
        help="https:// targets: trust the CA in this PEM file (default: the system's CAs)",
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        default=False,
        env_var="HARNESS_INSECURE",
        help="https:// targets: do not verify the server's certificate",
    )
    g.add_argument(
        "--metrics-url",
        default=None,
        env_var="HARNESS_METRICS_URL",
        metavar="URL",
        help="the server's Prometheus metrics when not at HOST/metrics, e.g. "
        "http://127.0.0.1:8002/metrics (Triton) or :8082/metrics (MLServer)",
    )
    g.add_argument(
        "--agent",
        dest="agent_url",
        default=None,
        env_var="HARNESS_AGENT",
        metavar="URL",
        help="the server runs on another host: sample it and apply chaos through the "
        "`harness agent` there (--sut-pid is then the server's pid on that host)",
    )
    g.add_argument(
        "--agent-token",
        default=None,
        env_var="HARNESS_AGENT_TOKEN",
        metavar="TOKEN",
        help="the agent's --token (prefer the environment variable: ps shows command lines)",
    )
    g.add_argument(
        "--no-verify",
        action="store_true",
        default=False,
        env_var="HARNESS_NO_VERIFY",
        help="skip golden outputs and response integrity checks",
    )
    g.add_argument(
        "--golden-cache",
        default=None,
        env_var=GOLDEN_CACHE_ENV,
        metavar="FILE",
        help="keep the golden outputs in FILE and reuse them in later runs: as they are "
        "against the same server process (same pid and start time, URL, model and inputs); "
        "against another process of the same model and inputs once its first 8 inputs, "
        "asked again, give their kept outputs, else fetched anew (harness run and "
        "acceptance keep OUT/golden.json; harness peak and tune one per search)",
    )
    # Locust's start form shows an option only when it carries include_in_web_ui (a group's
    # add_argument does not set it). Not shown: --quick/--full (--mode's shorthands) and
    # --header (credentials: the form would print them into the page).
    for action in g._group_actions:
        action.include_in_web_ui = action.option_strings[0] not in WEB_FORM_HIDDEN
        HARNESS_DESTS.add(action.dest)


# Options whose value Locust's web UI hands back as text (the start form edits every
# custom option as a string when its default is None): converted here like argparse would.
_NUMERIC: Mapping[str, tuple[type, str]] = {
    "sut_pid": (int, "sut-pid"),
    "closed_loop": (int, "closed-loop"),
    "seed": (int, "seed"),
    "max_in_flight": (int, "max-in-flight"),
    "calibrate_s": (float, "calibrate-s"),
    "capacity_rps": (float, "capacity-rps"),
    "request_timeout": (float, "request-timeout"),
    "ready_timeout": (float, "ready-timeout"),
    "duration": (float, "duration"),
    "batch_size": (int, "batch-size"),
}
_TEXT = (
    *("model", "sut_cmd", "sut_cores", "sample_request", "checklist", "agent_url", "protocol"),
    "input_data",
)

USERS_REFUSED = (
    "{flag} {value} does not apply: the scenario sets users and rates stage by stage "
    "(scenarios/*.toml; open-loop stages are rates relative to the measured capacity) — "
    "drop {flag}, or pass --closed-loop USERS to run every stage closed loop with USERS users"
)


def _form_value(parsed: Any, name: str) -> Any:
    """``parsed.name`` as argparse would have typed it (web-form text converted)."""
    value = getattr(parsed, name, None)
    if name in _NUMERIC and isinstance(value, str):
        kind, flag = _NUMERIC[name]
        if not value.strip():
            return None
        try:
            return kind(value.strip())
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ConfigError(f"--{flag} has value {value!r}; expected {what}") from None
    if name in _TEXT and isinstance(value, str) and not value.strip():
        return None
    return value


def common_options(parsed: Any, form: bool = False) -> float | None:
    """Locust's own -t/-u/-r against a scenario: ``-t`` is the scenario's length (its
    stages scaled, as ``--duration`` does; both at once must agree), ``-u``/``-r`` are
    refused with the reason (on the command line: the web form hides them, and Locust
    fills them in after a headless start). Returns the duration they ask for, if any."""
    for attr, flag in (("num_users", "-u/--users"), ("spawn_rate", "-r/--spawn-rate")):
        value = getattr(parsed, attr, None)
        if value is not None and not form:
            raise ConfigError(USERS_REFUSED.format(flag=flag, value=value))
    run_time = getattr(parsed, "run_time", None)
    duration = _form_value(parsed, "duration")
    if run_time and duration is not None and abs(float(run_time) - duration) > 1e-9:
        raise ConfigError(
            f"-t/--run-time {run_time} s and --duration {duration:g} s disagree; both set the "
            "scenario's length — give one"
        )
    return float(run_time) if run_time else duration


def options_from(parsed: Any, form: bool = False) -> Options:
    """Validated Options from Locust's parsed options (a ConfigError names the bad one):
    the command line's, or (``form``) as the web UI's start form left them, its text
    converted like argparse would."""
    parsed = _Typed(parsed)
    duration = common_options(parsed, form)

    def positive(name: str, value: float | None) -> None:
        if value is not None and not value > 0:
            raise ConfigError(f"--{name} has value {value!r}; expected a number > 0")

    positive("max-in-flight", parsed.max_in_flight)
    positive("calibrate-s", parsed.calibrate_s)
    positive("capacity-rps", parsed.capacity_rps)
    positive("request-timeout", parsed.request_timeout)
    positive("ready-timeout", parsed.ready_timeout)
    positive("closed-loop", parsed.closed_loop)
    positive("duration", duration)
    if parsed.sut_cmd and parsed.sut_pid:
        raise ConfigError(
            "--sut-cmd and --sut-pid are both set; start a server or attach to one, not both"
        )
    agent_url = parsed.agent_url or None
    if agent_url and parsed.sut_cmd:
        raise ConfigError(
            "--agent and --sut-cmd are both set; with --agent the server runs on the agent's "
            "host: start it there (harness agent --sut-cmd CMD, or by hand and pass --sut-pid "
            "PID, its pid on that host)"
        )
    deployment = deployment_options(parsed)
    protocol = parsed.protocol or scenario_protocol(parsed.scenario) or protocols.DEFAULT
    protocols.get(protocol)  # unknown: a ConfigError naming the valid ones
    return Options(
        scenario=parsed.scenario,
        mode=parsed.mode or "quick",
        model=parsed.model,
        sut_pid=parsed.sut_pid,
        sut_cmd=parsed.sut_cmd,
        sut_cores=parsed.sut_cores,
        out=parsed.out,
        **input_options_from(parsed),
        closed_loop_users=parsed.closed_loop,
        seed=parsed.seed,
        max_in_flight=parsed.max_in_flight,
        calibrate_s=parsed.calibrate_s,
        capacity_rps=parsed.capacity_rps,
        request_timeout_s=parsed.request_timeout,
        ready_timeout_s=parsed.ready_timeout,
        sample=not parsed.no_sample,
        verify=not parsed.no_verify,
        golden_cache=parsed.golden_cache or None,
        allow_skip=tuple(
            n.strip() for n in (getattr(parsed, "allow_skip", None) or "").split(",") if n.strip()
        ),
        duration_s=duration,
        checklist=parsed.checklist,
        protocol=protocol,
        **deployment,
        agent_url=agent_url,
        agent_token=getattr(parsed, "agent_token", None) or None,
    )


def deployment_options(parsed: Any) -> dict[str, Any]:
    """``--header``/``--ca-cert``/``--insecure``/``--metrics-url`` validated (ConfigError
    naming the fix, never a header's value) into Options fields."""
    from harness.load import http

    headers = http.parse_headers(getattr(parsed, "harness_header", None))
    ca_cert = getattr(parsed, "ca_cert", None) or None
    insecure = bool(getattr(parsed, "insecure", False))
    if ca_cert and insecure:
        raise ConfigError(
            "--ca-cert and --insecure are both set; verify with the CA or do not verify"
        )
    http.check_ca_cert(ca_cert)
    metrics_url = getattr(parsed, "metrics_url", None) or None
    if metrics_url is not None and not metrics_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"--metrics-url has value {metrics_url!r}; expected a URL such as "
            "http://127.0.0.1:8002/metrics"
        )
    return {
        "headers": tuple(f"{k}: {v}" for k, v in headers),
        "ca_cert": ca_cert,
        "insecure": insecure,
        "metrics_url": metrics_url,
    }


class _Typed:
    """A read-only view of Locust's parsed options with the web form's text typed."""

    def __init__(self, parsed: Any) -> None:
        self._parsed = parsed

    def __getattr__(self, name: str) -> Any:
        return _form_value(self._parsed, name)


def scenario_protocol(name_or_path: str | None) -> str | None:
    """The protocol a scenario file declares (``[load] protocol``); None when it declares
    none or cannot be read (its errors are reported when it is loaded for the run)."""
    if not name_or_path:
        return None
    try:
        return load_scenario(name_or_path).load.protocol
    except HarnessError:
        return None


def scenario_for(opts: Options) -> Scenario:
    """The scenario file in the chosen mode, with the command-line overrides applied."""
    sc = load_scenario(opts.scenario, opts.mode)  # type: ignore[arg-type]
    if opts.duration_s is not None:
        sc = sc.with_duration(opts.duration_s)
    load = sc.load
    changes: dict[str, Any] = {}
    if opts.seed is not None:
        changes["seed"] = opts.seed
    if opts.max_in_flight is not None:
        changes["max_in_flight"] = opts.max_in_flight
    if opts.calibrate_s is not None:
        changes["calibration_s"] = opts.calibrate_s
    if opts.capacity_rps is not None:
        changes["capacity_rps"] = opts.capacity_rps
    if opts.request_timeout_s is not None:
        changes["request_timeout_s"] = opts.request_timeout_s
    if not opts.verify:
        changes["verify"] = False
    if changes:
        sc = replace(sc, load=replace(load, **changes))
    if opts.closed_loop_users is not None:
        # --closed-loop N: the same stages, each run closed loop with N users
        stages = tuple(replace(s, rate=None, users=opts.closed_loop_users) for s in sc.stages)
        sc = replace(sc, stages=stages, load=replace(sc.load, mode="closed"))
    return sc
