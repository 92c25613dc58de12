"""Per-request server timestamps (``--record-timings``, ``GET /debug/timings``): every
admitted request's record is ordered (arrival <= scheduled <= each event's write <=
finish), its events carry the tokens the client received, in the same number of events,
and the timestamps are on the clock the client reads (``time.monotonic``). In-process,
at the ASGI level (tests/test_llm_server_api.py's driver)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harness_reference_server.llm.api import LLMState
from harness_reference_server.llm.config import parse_llm_config
from tests.test_llm_server_api import Answer, chat, completion, request, serve

CHAT = "/v1/chat/completions"


def token_events(answer: Answer) -> list[tuple[float, int]]:
    """(time the chunk was sent, tokens in the event) of each token-carrying event."""
    out = []
    for t, chunk in answer.chunks:
        for e in chunk.decode().split("\n\n"):
            if e.startswith("data: {"):
                doc = json.loads(e[6:])
                choices = doc.get("choices") or [{}]
                text = choices[0].get("text") or (choices[0].get("delta") or {}).get("content")
                if text:
                    out.append((t, len(text.split(" ")) - 1))  # each token is " word"
    return out


def check_record(record: dict[str, Any], answer: Answer, completion_tokens: int) -> None:
    times = [record["arrival_ns"], record["scheduled_ns"]]
    times += [t for t, _ in record["events"]] + [record["finish_ns"]]
    assert times == sorted(times), record
    assert sum(n for _, n in record["events"]) == completion_tokens
    assert record["completion_tokens"] == completion_tokens


def test_records_are_ordered_consistent_with_the_stream_and_on_the_clients_clock() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        streams = await asyncio.gather(
            request(app, "POST", CHAT, chat("a", max_tokens=9, ignore_eos=True, stream=True,
                                            stream_options={"include_usage": True})),
            request(app, "POST", "/v1/completions", completion("b", max_tokens=6, stream=True,
                                                               ignore_eos=True, priority=2,
                                                               stream_options={"include_usage": True})),
        )  # fmt: skip
        whole = await request(app, "POST", CHAT, chat("c", max_tokens=5, ignore_eos=True))
        records = (await request(app, "GET", "/debug/timings")).json()
        assert len(records) == 3
        by_id = {r["id"]: r for r in records}
        for answer in streams:
            usage = answer.data()[-2]["usage"]
            record = by_id[answer.data()[0]["id"]]
            assert record["stream"] and record["prompt_tokens"] == usage["prompt_tokens"]
            check_record(record, answer, usage["completion_tokens"])
            sent = token_events(answer)
            assert [n for _, n in sent] == [n for _, n in record["events"]]
            # the client's clock reads each chunk inside the transport call the server
            # times just after: the same clock, so client time <= server time
            for (t_client, _), (t_ns, _) in zip(sent, record["events"], strict=True):
                assert t_client * 1e9 <= t_ns + 1_000  # float rounding of monotonic()
            assert record["finish_reason"] == "length" and record["preemptions"] == 0
        assert by_id[streams[1].data()[0]["id"]]["priority"] == 2
        one = by_id[whole.json()["id"]]
        assert not one["stream"] and one["route"] == "chat" and len(one["events"]) == 1
        check_record(one, whole, whole.json()["usage"]["completion_tokens"])

    serve(scenario, record_timings=True)


def test_coalesced_events_count_their_tokens() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        answer = await request(app, "POST", CHAT, chat(max_tokens=10, ignore_eos=True, stream=True))
        (record,) = (await request(app, "GET", "/debug/timings")).json()
        assert [n for _, n in record["events"]] == [n for _, n in token_events(answer)]
        assert [n for _, n in record["events"]] == [4, 4, 2]
        check_record(record, answer, 10)

    serve(scenario, "coalesce:4", record_timings=True)


def test_clear_empties_and_the_log_keeps_the_latest() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        ids = []
        for i in range(3):
            answer = await request(app, "POST", CHAT, chat(str(i), max_tokens=2))
            ids.append(answer.json()["id"])
        kept = (await request(app, "GET", "/debug/timings?clear=1")).json()
        assert [r["id"] for r in kept] == ids[1:]
        assert (await request(app, "GET", "/debug/timings")).json() == []

    serve(scenario, record_timings=True, timings_keep=2)


def test_off_by_default_nothing_is_recorded() -> None:
    async def scenario(app: Any, state: LLMState) -> None:
        task = asyncio.create_task(request(app, "POST", CHAT, chat(max_tokens=3, stream=True)))
        while not state.engine.running:
            await asyncio.sleep(0.001)
        assert state.timings is None and state.engine.running[0].timings is None
        await task
        answer = await request(app, "GET", "/debug/timings")
        assert answer.status == 404 and "--record-timings" in answer.json()["error"]["message"]

    serve(scenario)


def test_the_flags() -> None:
    assert not parse_llm_config([]).record_timings
    config = parse_llm_config(["--record-timings", "--timings-keep", "50"])
    assert config.record_timings and config.timings_keep == 50
    assert config.describe()["record_timings"] is True
