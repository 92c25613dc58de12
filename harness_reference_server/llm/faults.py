"""The LLM server's planted faults (``--api openai --fault NAME[:PARAM]``), declared once.

Each is a defect seen in real LLM servers, so the harness's checks can be shown to catch
it; the last three are measurement traps that test the harness, not the server.

- ``static-batching``: no sequence joins a running batch; the waiting ones start only
  when the batch has drained (request-level batching). TTFT grows with the batch's length.
- ``no-chunked-prefill``: a prompt is prefilled whole in a step of its own, during
  which the running sequences do not decode (vLLM V0's default): a long prompt stalls
  every stream for its whole prefill.
- ``kv-overcommit:FACTOR``: ``max_num_seqs`` set FACTOR times what the KV cache holds at
  full length: sequences are admitted while their prompts fit, then preempt each other
  as they grow (a preemption storm: streams freeze mid-way and are recomputed).
- ``unbounded-queue``: the waiting queue never sheds: no 429, TTFT grows without bound.
- ``priority-inversion``: ``priority``'s sign flipped (higher value first), as a
  server that reads it as "more important": the waiting queue is sorted so, and a
  waiting request preempts running ones of a *lower* value.
- ``stream-stall:SECONDS``: every tenth stream (the first, the 11th, ...) stops sending
  after its fourth token for SECONDS, kept open by SSE comments (``: keep-alive``);
  the engine keeps generating and the held tokens follow at once.
- ``truncate-on-arrival``: a new request ends every running stream with ``data: [DONE]``
  under its 200, without a ``finish_reason`` (llama-cpp-python's ``interrupt_requests``).
- ``usage-lie``: ``usage.completion_tokens`` counts one token more than was sent (the
  end-of-sequence or the prefill's token counted).
- ``error-in-200:P``: with probability P (seeded by ``--seed``) a request fails half way:
  a stream sends ``data: {"error": ...}`` then ``[DONE]``; a non-streaming request is
  answered 200 with an error body.
- ``kv-leak-on-abort``: a client that disconnects leaves its KV blocks allocated for
  good; ``vllm:kv_cache_usage_perc`` ratchets up until the server stops admitting.
- ``cross-stream:P``: in a step that emits several tokens, with probability P two
  streams' tokens are swapped.
- ``leak-memory:BYTES``: every stream answered keeps BYTES of memory for good (a
  per-request cache never evicted): RSS grows with the requests served.
- ``role-prelude-early`` (trap): a chat stream's role chunk is sent when the request is
  accepted, before the prefill, as a client that times the first chunk reads TTFT ~0.
- ``coalesce:N`` (trap): N tokens per event (vLLM's ``stream_interval``).
- ``crlf-framing`` (trap): events separated by ``\\r\\n\\r\\n`` (sse-starlette's default).
"""

from __future__ import annotations

from typing import Any

from harness_reference_server.fault_catalog import (
    Fault,
    fault_help,
    fault_parser,
    fault_set_class,
    number_fault,
    switch_fault,
)

_ENGINE = "EngineConfig (harness_reference_server/llm/engine.py)"
_STREAM = "the stream writer (harness_reference_server/llm/api.py)"

LLM_FAULTS: tuple[Fault, ...] = (
    switch_fault("static-batching", "static_batching", _ENGINE, "no join until the batch drains"),
    switch_fault("no-chunked-prefill", "no_chunked_prefill", _ENGINE, "a whole prompt per step, decodes wait"),
    number_fault(
        "kv-overcommit", "kv_overcommit_factor", "FACTOR", "4", int, 2, None, "FACTOR >= 2",
        _ENGINE, "max_num_seqs x FACTOR on the same KV: a preemption storm",
    ),
    switch_fault("unbounded-queue", "unbounded_queue", _ENGINE, "never answers 429"),
    switch_fault("priority-inversion", "priority_inversion", _ENGINE, "higher priority value first"),
    number_fault(
        "stream-stall", "stream_stall_s", "SECONDS", "5", float, 0.01, None, "SECONDS >= 0.01",
        _STREAM, "every tenth stream pauses SECONDS with keep-alive comments",
    ),
    switch_fault("truncate-on-arrival", "truncate_on_arrival", _ENGINE, "a new request ends running streams with [DONE]"),
    switch_fault("usage-lie", "usage_lie", _STREAM, "completion_tokens one more than sent"),
    number_fault(
        "error-in-200", "error_in_200_p", "P", "0.05", float, 0.0, 1.0, "P with 0 <= P <= 1",
        _STREAM, "an error object half way through a 200",
    ),
    switch_fault("kv-leak-on-abort", "kv_leak_on_abort", _ENGINE, "KV blocks of a disconnected client never freed"),
    number_fault(
        "cross-stream", "cross_stream_p", "P", "0.05", float, 0.0, 1.0, "P with 0 <= P <= 1",
        _ENGINE, "two streams' tokens swapped in a step",
    ),
    number_fault(
        "leak-memory", "leak_memory_bytes", "BYTES", "10000", int, 1, None, "BYTES >= 1",
        _STREAM, "every stream answered keeps BYTES for good",
    ),
    switch_fault("role-prelude-early", "role_prelude_early", _STREAM, "trap: role chunk at accept"),
    number_fault(
        "coalesce", "coalesce_tokens", "N", "4", int, 2, None, "N >= 2", _STREAM, "trap: N tokens per event",
    ),
    switch_fault("crlf-framing", "crlf_framing", _STREAM, "trap: \\r\\n framing"),
)  # fmt: skip

LLM_FAULT_NAMES: tuple[str, ...] = tuple(f.name for f in LLM_FAULTS)
LLM_FAULT_HELP = fault_help(LLM_FAULTS, "harness_reference_server/llm/faults.py")
LLMFaultSet: Any = fault_set_class(LLM_FAULTS, "LLMFaultSet", __name__)
parse_llm_faults = fault_parser(LLM_FAULTS, LLMFaultSet)
