"""The OpenAI-compatible chat API as a harness wire protocol: streamed, read token by token.

``--protocol openai`` (or ``protocol = "openai"`` in a scenario's ``[load]``) drives any
scenario against vLLM, SGLang, TGI, llama.cpp's server or the bundled reference LLM server
(``python -m harness_reference_server --api openai``):

- ready: ``GET /v1/models`` answers 200 (every OpenAI-compatible server has it; vLLM and
  SGLang answer it only once the engine is up); its first model is the default
  ``--model``, and a ``--model`` it does not list is refused before any load;
- inference: ``POST /v1/chat/completions`` with ``stream: true`` and
  ``stream_options.include_usage``; the request id goes in OpenAI's ``user`` field
  (servers log it, none echo it); a traffic class's ``priority`` goes in vLLM's
  ``priority`` field, left out when the class sets none (vLLM refuses a priority unless
  it schedules by priority);
- answers are read as they arrive (``harness.load.stream_http``), so the request's
  latency is its end-to-end time and the stream's TTFT, TPOT and gaps are recorded
  (``harness.load.stream_recording``); ``streaming`` tells the load side to do that.

**Inputs.** The pool is a seeded token workload (``harness.load.llm_workload``): the
scenario's ``[llm]`` table (``synthetic`` or ``shared_prefix``, chat), each ``--input
KEY=VALUE`` overriding one key of it (``--input output=64``, ``--input
input=uniform:min=16,max=64``). Each pool entry is a JSON-able
``{"body", "prompt_tokens", "max_tokens"}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from harness.errors import ConfigError
from harness.protocols.openai import CHAT_PATH, Generation
from harness.protocols.protocol import BadResponse, ClassParams, WireProtocol

MODELS_PATH = "/v1/models"
# where the request id goes: OpenAI's end-user field, accepted (and ignored) by every
# OpenAI-compatible server
ID_FIELD = "user"
_MARK = "\x00harness-request-id\x00"
# the workloads a scenario sends: a pool of independent requests, or (multi_turn) a pool
# of conversations, each input its first turn; the load engine sends the later turns,
# each built from the answer streamed for the turn before (harness.load.users)
POOL_WORKLOADS = ("synthetic", "shared_prefix", "jsonl", "multi_turn")
# the [llm] defaults of a scenario that has no [llm] table: short chats a 2-core machine
# serves at tens of requests per second against the reference server
DEFAULT_WORKLOAD: Mapping[str, Any] = {
    "workload": "synthetic",
    "api": "chat",
    "input": "uniform:min=32,max=96",
    "output": "uniform:min=16,max=48",
}


class OpenAIChat(WireProtocol):
    """OpenAI-compatible ``/v1/chat/completions``, streamed (see the module docstring)."""

    name = "openai"
    ready_path = MODELS_PATH
    request_name = "chat"
    stats_source = None
    #: answers are server-sent event streams, read as they arrive
    streaming = True

    def server_metadata_path(self) -> str | None:
        return MODELS_PATH

    def default_model(self, server_meta: Mapping[str, Any] | None) -> str | None:
        models = served_models(server_meta)
        return models[0] if models else None

    def model_metadata_path(self, model: str) -> str:
        # the list: not every server answers /v1/models/{id} (vLLM does not)
        return MODELS_PATH

    def infer_path(self, model: str) -> str:
        return CHAT_PATH

    def resolve_inputs(
        self,
        meta: Mapping[str, Any],
        model: str,
        input_options: Sequence[str] = (),
        sample_request: str | None = None,
        *,
        workload: Mapping[str, Any] | None = None,
    ) -> Any:
        from harness.load.llm_workload import config_from_table, longest_request

        listed = served_models(meta)
        if listed and model not in listed:
            raise ConfigError(
                f"--model has value {model!r}, which GET {MODELS_PATH} does not list "
                f"(it lists {', '.join(listed)}); pass one of them with --model NAME"
            )
        if sample_request:
            raise ConfigError(
                "--sample-request is a KServe V2 option; with --protocol openai describe the "
                "requests with the scenario's [llm] table or --input KEY=VALUE"
            )
        table = dict(workload if workload is not None else DEFAULT_WORKLOAD)
        for opt in input_options:
            key, sep, value = opt.partition("=")
            if not sep or not key.strip():
                raise ConfigError(
                    f"--input has value {opt!r}; with --protocol openai it is KEY=VALUE, "
                    "a key of the [llm] table (e.g. --input output=64)"
                )
            if key.strip().startswith("abort_"):
                raise ConfigError(
                    f"--input has value {opt!r}: client aborts are a scenario's plan, per "
                    "stage; set abort_share / abort_after / abort_stages in its [llm] table"
                )
            table[key.strip()] = _scalar(value.strip())
        cfg = config_from_table(table, "--input / [llm]")
        served = served_max_model_len(meta, model)
        most = longest_request(cfg) if cfg.workload != "jsonl" else 0
        if served is not None and most > served:
            # a request longer than the server's context is a 400 on every try: known now
            raise ConfigError(
                f"a request of this [llm] workload can reach {most} tokens (prompt and "
                f"max_tokens, counted by the harness's tokenizer; the server's may count "
                f"more), but GET {MODELS_PATH} gives {model!r} a max_model_len of {served}: "
                "start the server with a longer context, or lower the input / output max "
                "(--input input=..., --input output=...)"
            )
        if cfg.workload not in POOL_WORKLOADS or cfg.api != "chat":
            raise ConfigError(
                f"[llm] workload = {cfg.workload!r}, api = {cfg.api!r}: a scenario sends "
                f"chat requests of a {' / '.join(POOL_WORKLOADS)} workload"
            )
        return {"table": table, "model": model}

    def generate_inputs(self, template: Any, count: int, seed: int) -> list[Any]:
        """The pool: one input per request, or for ``multi_turn`` one per conversation (as
        many conversations as the pool holds unless the table says): its first turn's
        request, and under ``conversation`` what builds its later turns (the plan's header,
        its index and its turns' lengths)."""
        from harness.load.llm_workload import (
            build_plan,
            config_from_table,
            conversations_from_plan,
            plan_header,
            requests_from_plan,
        )

        table = dict(template["table"])
        table.setdefault("requests", count)
        table.setdefault("seed", seed)
        if table.get("workload") == "multi_turn":
            table.setdefault("conversations", count)
        plan = build_plan(config_from_table(table, "[llm]"))
        if plan["workload"] != "multi_turn":
            return [_input(req) for req in requests_from_plan(plan, template["model"])]
        header = plan_header(plan)
        out = []
        for conv in conversations_from_plan(plan, template["model"]):
            item = _input(conv.next_request(None))
            item["conversation"] = {"plan": header, "index": conv.index, "turns": conv.turns}
            out.append(item)
        return out

    def turn_input(self, request: Any) -> dict[str, Any]:
        """A later turn of a conversation (an ``LlmRequest``) as a pool input is."""
        return _input(request)

    def request_parts(self, inputs: Any, cls: ClassParams) -> tuple[bytes, bytes]:
        body = dict(inputs["body"])
        if cls.priority:
            body["priority"] = cls.priority
        # stream: true, and stream_options.include_usage unless the workload says not to
        body.update(Generation(include_usage=inputs.get("include_usage", True)).fields())
        body[ID_FIELD] = _MARK
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        before, after = text.split(json.dumps(_MARK)[1:-1], 1)
        return before.encode(), after.encode()

    def parse_answer(self, body: bytes) -> tuple[str | None, tuple[Any, ...]]:
        """A whole streamed answer read at once: its text (the load side reads streams as
        they arrive; this serves a caller that holds a finished body)."""
        from harness.protocols.openai_stream import StreamRecorder

        rec = StreamRecorder(0.0)
        rec.headers(200, 0.0)
        rec.feed(body, 0.0)
        record = rec.finish(0.0)
        if record.failed:
            raise BadResponse("; ".join(str(p) for p in record.problems) or "not a stream")
        return None, (record.text,)


def _input(request: Any) -> dict[str, Any]:
    """An ``LlmRequest`` as a pool input: its body without the stream fields (the protocol
    adds them, with the class's priority and the request id), its token counts."""
    body = {k: v for k, v in request.body.items() if k not in ("stream", "stream_options")}
    out = {
        "body": body,
        "prompt_tokens": request.prompt_tokens,
        "max_tokens": request.max_tokens,
    }
    if "stream_options" not in request.body:
        out["include_usage"] = False  # the workload's include_usage = false
    return out


def served_models(meta: Mapping[str, Any] | None) -> list[str]:
    """The model ids a ``GET /v1/models`` answer lists."""
    data = (meta or {}).get("data") if isinstance(meta, Mapping) else None
    return [str(m["id"]) for m in data or [] if isinstance(m, Mapping) and m.get("id")]


def served_max_model_len(meta: Mapping[str, Any] | None, model: str) -> int | None:
    """The context length a ``GET /v1/models`` answer gives ``model`` (vLLM's and the
    reference server's ``max_model_len``), None when it gives none."""
    data = (meta or {}).get("data") if isinstance(meta, Mapping) else None
    for m in data or []:
        if isinstance(m, Mapping) and m.get("id") == model:
            value = m.get("max_model_len")
            return value if isinstance(value, int) and value > 0 else None
    return None


def is_reference_server(meta: Mapping[str, Any] | None) -> bool:
    """Whether a ``GET /v1/models`` answer is the bundled reference server's (its answers
    are then predictable: ``harness.protocols.openai.reference_expectation``)."""
    data = (meta or {}).get("data") if isinstance(meta, Mapping) else None
    return bool(data) and all(
        isinstance(m, Mapping) and m.get("owned_by") == "harness_reference_server" for m in data
    )


def _scalar(text: str) -> Any:
    """An --input value as TOML would read it: a number when it is one, else the text."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)
