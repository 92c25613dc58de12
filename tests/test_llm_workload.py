"""LLM token workloads (harness.load.llm_workload*): seeded lengths, exact prompt token
counts under the shipped tokenizer, shared prefixes at block granularity, multi-turn
conversations that carry the answers, and the user's JSONL file. Pure: no server."""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.load.llm_workload import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    Conversation,
    build_plan,
    config_from_table,
    conversations_from_plan,
    play_with_reference,
    reference_answer,
    requests_from_plan,
)
from harness.load.llm_workload_lengths import parse_length
from harness.load.llm_workload_text import extended_count
from harness.protocols.openai import reference_expectation
from harness_reference_server.llm.kv_cache import block_hashes
from harness_reference_server.llm.tokens import chat_prompt, count_tokens, token_ids

ROOT = Path(__file__).resolve().parent.parent


def _plan(**table: object) -> dict:
    """A plan as a worker receives it: through JSON."""
    return json.loads(json.dumps(build_plan(config_from_table(table, "test.toml"))))


def _prompt_text(body: dict) -> str:
    return chat_prompt(body["messages"]) if "messages" in body else body["prompt"]


# -- length specs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "low", "high"),
    [
        (128, "constant", 128, 128),
        ("128", "constant", 128, 128),
        ("constant:128", "constant", 128, 128),
        ("constant:value=128", "constant", 128, 128),
        ("uniform:min=64,max=1024", "uniform", 64, 1024),
        ("normal:mean=512,stdev=128,min=16,max=2048", "normal", 16, 2048),
        ("normal:mean=512,stdev=128", "normal", 1, None),
        ("lognormal:mean=256,stdev=200,max=4096", "lognormal", 1, 4096),
        ("empirical:128,256,256,1024", "empirical", 128, 1024),
    ],
)
def test_a_spec_names_its_kind_and_bounds(spec, kind, low, high) -> None:
    s = parse_length(spec, "llm.input")
    assert (s.kind, s.low, s.high) == (kind, low, high)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "not a length spec"),
        (True, "not a length spec"),
        ("gauss:mean=1,stdev=2", "unknown kind 'gauss'"),
        ("normal:mean=512", "normal needs stdev"),
        ("normal:mean=512,stdev=128,min=0", "min 0 is below 1"),
        ("normal:mean=512,stdev=128,min=9,min=10", "min is given twice"),
        ("normal:mean=512,stdev=128,foo=2", "not 'foo'"),
        ("normal:mean=-5,stdev=1", "mean must be > 0"),
        ("normal:mean=5,stdev=1,min=10,max=5", "min 10 > max 5"),
        ("uniform:min=10,max=5", "min 10 > max 5"),
        ("uniform:min=a,max=5", "min 'a' is not an integer"),
        ("uniform:min=1 max=5", "uniform needs max"),
        ("uniform:min", "'min' is not NAME=VALUE"),
        ("lognormal:mean=5,stdev=0", "needs stdev > 0"),
        ("normal:mean=nan,stdev=1", "not finite"),
        ("empirical:", "no values"),
        ("empirical:1,x", "'x' is not an integer"),
        (0, "below 1"),
    ],
)
def test_a_bad_spec_is_a_one_line_config_error_with_an_example(spec, says) -> None:
    with pytest.raises(ConfigError) as err:
        parse_length(spec, "llm.output")
    message = str(err.value)
    assert says in message and "llm.output" in message
    assert "e.g. 'normal:mean=512,stdev=128,min=16,max=2048'" in message
    assert "\n" not in message


def _draws(spec: str, n: int = 20_000, seed: str = "moments") -> list[int]:
    return parse_length(spec).draws(random.Random(seed), n)


def test_normal_draws_have_the_asked_mean_and_stdev_and_stay_in_bounds() -> None:
    xs = _draws("normal:mean=500,stdev=100,min=1,max=2000")
    assert statistics.fmean(xs) == pytest.approx(500, rel=0.01)
    assert statistics.pstdev(xs) == pytest.approx(100, rel=0.03)
    clipped = _draws("normal:mean=100,stdev=100,min=50,max=150")
    assert min(clipped) == 50 and max(clipped) == 150  # clipped, and the clip is reached
    assert all(isinstance(x, int) for x in clipped)


def test_lognormal_draws_have_the_asked_mean_and_stdev_of_the_length() -> None:
    xs = _draws("lognormal:mean=200,stdev=150", n=50_000)
    assert statistics.fmean(xs) == pytest.approx(200, rel=0.03)
    assert statistics.pstdev(xs) == pytest.approx(150, rel=0.08)
    assert statistics.median(xs) < statistics.fmean(xs)  # right-skewed


def test_uniform_and_empirical_draw_each_value_at_its_share() -> None:
    xs = _draws("uniform:min=10,max=20")
    assert set(xs) == set(range(10, 21))
    for v in range(10, 21):
        assert xs.count(v) / len(xs) == pytest.approx(1 / 11, abs=0.01)
    ys = _draws("empirical:7,9,9")
    assert set(ys) == {7, 9}
    assert ys.count(9) / len(ys) == pytest.approx(2 / 3, abs=0.015)
    assert set(_draws("constant:33", n=100)) == {33}


def test_the_same_seed_draws_the_same_lengths_and_another_seed_others() -> None:
    spec = "lognormal:mean=256,stdev=200,max=4096"
    assert _draws(spec, 500, "a") == _draws(spec, 500, "a")
    assert _draws(spec, 500, "a") != _draws(spec, 500, "b")


# -- exact lengths ------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("workload", ["synthetic", "shared_prefix"])
def test_every_prompt_has_exactly_the_drawn_token_count(workload, api) -> None:
    plan = _plan(
        workload=workload,
        api=api,
        requests=60,
        groups=3,
        prefix_tokens=64,
        input="uniform:min=11,max=400",
        output="normal:mean=40,stdev=20,min=1,max=90",
        seed=5,
    )
    requests = requests_from_plan(plan, "reference-llm")
    assert len(requests) == 60
    for request, (n_in, n_out, *group) in zip(requests, plan["requests"], strict=True):
        expected_in = n_in + (plan["prefix_tokens"] if group else 0)
        assert count_tokens(_prompt_text(request.body)) == request.prompt_tokens == expected_in
        assert request.path == (CHAT_PATH if api == "chat" else COMPLETIONS_PATH)
        body = request.body
        assert body["max_tokens"] == request.max_tokens == n_out
        assert body["ignore_eos"] is True and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["model"] == "reference-llm"
        # the reference server counts the same prompt and, with ignore_eos, sends n_out
        answer = reference_expectation(body)
        assert (answer.prompt_tokens, answer.completion_tokens) == (expected_in, n_out)
        assert json.loads(request.encoded()) == body


def test_without_ignore_eos_the_body_leaves_it_out_and_outputs_may_stop_early() -> None:
    plan = _plan(requests=40, input=64, output=600, ignore_eos=False)
    requests = requests_from_plan(plan, "m")
    assert all("ignore_eos" not in r.body for r in requests)
    reasons = {reference_expectation(r.body).finish_reason for r in requests}
    assert "stop" in reasons  # one token in 256 ends a sequence: 600 tokens rarely survive


def test_a_worker_rebuilds_the_same_bodies_from_the_plan_in_another_process() -> None:
    table = {"workload": "shared_prefix", "requests": 30, "prefix_tokens": 32, "seed": 11}
    plan = _plan(**table)
    assert plan == _plan(**table)  # the master's plan is a function of the config
    assert plan != _plan(**{**table, "seed": 12})

    def digest(p: dict) -> str:
        return hashlib.sha256(b"".join(r.encoded() for r in requests_from_plan(p, "m"))).hexdigest()

    script = (
        "import hashlib, json, sys\n"
        "from harness.load.llm_workload import requests_from_plan\n"
        "plan = json.loads(sys.stdin.read())\n"
        "print(hashlib.sha256(b''.join(r.encoded() for r in requests_from_plan(plan, 'm')))"
        ".hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(plan),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == digest(plan)


# -- shared prefixes ----------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_a_group_shares_whole_blocks_of_prefix_and_nothing_more(api) -> None:
    block, prefix = 16, 96
    table = {
        "workload": "shared_prefix",
        "api": api,
        "groups": 4,
        "requests": 40,
        "prefix_tokens": prefix,
        "input": "uniform:min=40,max=120",
        "output": 8,
        "seed": 2,
    }
    plan = _plan(**table)
    requests = requests_from_plan(plan, "m")
    shared = prefix // block
    by_group: dict[int, list[list[bytes]]] = {}
    for r in requests:
        hashes = block_hashes(token_ids(_prompt_text(r.body)), block)
        by_group.setdefault(r.group, []).append(hashes)
    assert sorted(by_group) == [0, 1, 2, 3] and all(len(v) == 10 for v in by_group.values())
    for hashes in by_group.values():
        assert len({tuple(h[:shared]) for h in hashes}) == 1  # the whole prefix is reused
        assert len({h[shared] for h in hashes}) == len(hashes)  # the suffix's block is not
    assert len({hashes[0][0] for hashes in by_group.values()}) == 4  # groups differ at block 0
    order = [r.group for r in requests]
    switches = sum(a != b for a, b in zip(order, order[1:], strict=False))
    assert switches > len(order) // 2  # interleaved, not group after group
    assert order != [i % 4 for i in range(40)]  # in a seeded order, not round-robin
    other = _plan(**{**table, "seed": 3})
    assert [g for _, _, g in other["requests"]] != [g for _, _, g in plan["requests"]]


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"workload": "shared_prefix", "prefix_tokens": 100}, "a multiple of block_size (16)"),
        ({"workload": "shared_prefix", "prefix_tokens": 8, "block_size": 8}, "of at least 16"),
        ({"workload": "synthetic", "input": "uniform:min=5,max=50"}, "needs at least 11"),
        ({"workload": "shared_prefix", "input": 6}, "needs at least 7"),
        ({"workload": "multi_turn", "input": 11}, "needs at least 12"),
        ({"workload": "multi_turn", "api": "completions"}, "multi_turn needs api = 'chat'"),
        ({"workload": "jsonl"}, "llm.file is missing"),
        ({"workload": "sharegpt"}, "use one of: synthetic, shared_prefix"),
        ({"inputs": "128"}, "did you mean 'input'"),
        ({"requests": 0}, "must be > 0"),
        ({"output": "normal:mean=5"}, "llm.output = 'normal:mean=5'"),
        ({"max_context": 4096, "input": "normal:mean=9,stdev=9,min=16"}, "input has no max"),
        ({"max_context": 2000, "input": 1000, "output": 1001}, "can reach 2001 tokens"),
        (
            {"workload": "shared_prefix", "max_context": 600, "input": 80, "output": 9},
            "can reach 601 tokens",
        ),
        (
            {"workload": "multi_turn", "max_context": 1000, "turns": "uniform:min=1,max=5"}
            | {"input": 100, "output": 101},
            "can reach 1005 tokens",
        ),
        (
            {"workload": "multi_turn", "max_context": 9000, "turns": "normal:mean=3,stdev=1"},
            "turns has no max",
        ),
    ],
)
def test_a_workload_it_cannot_build_is_refused_before_the_load(table, says) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_table(table, "s.toml")
    assert says in str(err.value) and "\n" not in str(err.value)


# -- multi-turn ---------------------------------------------------------------------------


def test_each_turn_carries_the_earlier_messages_and_the_actual_answer() -> None:
    plan = _plan(
        workload="multi_turn",
        conversations=3,
        turns="uniform:min=2,max=5",
        input="uniform:min=12,max=80",
        output="uniform:min=1,max=30",
        seed=9,
    )
    assert all(2 <= len(turns) <= 5 for turns in plan["conversations"])
    for index, turns in enumerate(plan["conversations"]):
        played = play_with_reference(plan, index, "m")
        assert len(played) == len(turns)
        previous = None
        for (request, answer), (n_in, n_out) in zip(played, turns, strict=True):
            messages = request.body["messages"]
            assert count_tokens(chat_prompt(messages)) == request.prompt_tokens
            assert request.max_tokens == n_out and len(answer.split()) == n_out
            if previous is None:
                assert request.prompt_tokens == n_in and len(messages) == 1
            else:
                before, before_answer = previous
                assert messages[:-2] == before.body["messages"]
                assert messages[-2] == {"role": "assistant", "content": before_answer}
                assert messages[-1]["role"] == "user"
                grown = before.prompt_tokens + count_tokens(before_answer) + n_in
                assert request.prompt_tokens == grown
                # the earlier turn's prompt is a token prefix: a prefix cache reuses it
                ids = token_ids(chat_prompt(messages))
                assert ids[: before.prompt_tokens] == token_ids(
                    chat_prompt(before.body["messages"])
                )
            previous = (request, answer)


def test_a_conversation_takes_any_answer_text_and_counts_its_prompt_exactly() -> None:
    plan = _plan(workload="multi_turn", conversations=1, turns=3, input=20, output=5)
    (conv,) = conversations_from_plan(plan, "m")
    first = conv.next_request(None)
    assert reference_answer(first) == reference_expectation(first.body).text
    second = conv.next_request("Sure!  Here's an answer:\n\n1. one\n")
    assert count_tokens(chat_prompt(second.body["messages"])) == second.prompt_tokens
    assert second.body["messages"][1]["content"] == "Sure!  Here's an answer:\n\n1. one\n"
    with pytest.raises(ValueError, match="previous answer"):
        conv.next_request(None)
    third = conv.next_request("\n  starts and ends with whitespace  ")
    assert count_tokens(chat_prompt(third.body["messages"])) == third.prompt_tokens
    assert conv.done
    with pytest.raises(ValueError, match="has had its 3 turns"):
        conv.next_request("ok")
    with pytest.raises(ValueError, match="pass None for the first turn"):
        Conversation(plan, 0, "m").next_request("an answer before any question")


def test_counting_only_the_new_part_of_a_prompt_gives_the_whole_count() -> None:
    rng = random.Random("extended-count")
    alphabet = ["ab", "Zeta", " x", "12345", "!?", " ", "  ", "\n", "\n\n", "<|", "|>", "é"]
    for _ in range(2000):
        prefix = "".join(rng.choices(alphabet, k=rng.randrange(0, 8)))
        if rng.random() < 0.5:
            prefix += "|>\n"  # the end of a rendered chat prompt
        rest = "".join(rng.choices(alphabet, k=rng.randrange(0, 8)))
        text = prefix + rest if rng.random() < 0.9 else rest + prefix
        got = extended_count(prefix, count_tokens(prefix), text)
        assert got == count_tokens(text), (prefix, rest)


# -- the user's JSONL ---------------------------------------------------------------------


def test_a_jsonl_file_becomes_its_requests_with_the_lines_fields(tmp_path) -> None:
    path = tmp_path / "requests.jsonl"
    lines = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
            ]
        },
        {"prompt": "Once upon a time", "max_tokens": 7, "priority": -1, "class": "interactive"},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + json.dumps(lines[2]))
    plan = _plan(workload="jsonl", file=str(path), output="uniform:min=20,max=40", seed=4)
    assert plan == _plan(workload="jsonl", file=str(path), output="uniform:min=20,max=40", seed=4)
    chat, completion, parts = requests_from_plan(plan, "m")
    assert (chat.path, completion.path, parts.path) == (CHAT_PATH, COMPLETIONS_PATH, CHAT_PATH)
    assert chat.body["messages"] == lines[0]["messages"] and 20 <= chat.max_tokens <= 40
    assert completion.body["prompt"] == "Once upon a time" and completion.max_tokens == 7
    assert completion.body["priority"] == -1 and completion.traffic_class == "interactive"
    assert "priority" not in chat.body and chat.traffic_class is None
    for r in (chat, completion, parts):
        assert r.prompt_tokens == reference_expectation(r.body).prompt_tokens
        assert r.body["max_tokens"] == r.max_tokens and r.body["ignore_eos"] is True


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"prompt": "x", "max_token": 5}', "unknown key 'max_token'"),
        ('{"prompt": "x", "messages": []}', "exactly one of 'messages'"),
        ('{"max_tokens": 5}', "exactly one of 'messages'"),
        ('{"prompt": ""}', "'prompt' must be a non-empty string"),
        ('{"prompt": ["a", "b"]}', "'prompt' must be a non-empty string"),
        ('{"messages": []}', "'messages' must be a non-empty list"),
        ('{"messages": ["hi"]}', "messages[0] is a JSON str"),
        ('{"messages": [{"role": "bot", "content": "hi"}]}', "messages[0].role = 'bot'"),
        ('{"messages": [{"role": "user", "content": 5}]}', "messages[0].content must be"),
        ('{"prompt": "x", "max_tokens": 0}', "'max_tokens' = 0 must be an integer >= 1"),
        ('{"prompt": "x", "max_tokens": true}', "'max_tokens' = True must be"),
        ('{"prompt": "x", "priority": "high"}', "'priority' = 'high' must be an integer"),
        ('{"prompt": "x", "class": " "}', "'class' = ' ' must be a non-empty string"),
    ],
)
def test_a_bad_jsonl_line_is_named_by_file_and_line(tmp_path, line, says) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n\n' + line + "\n")
    with pytest.raises(ConfigError) as err:
        _plan(workload="jsonl", file=str(path))
    message = str(err.value)
    assert message.startswith(f"{path}:3: ") and says in message and "\n" not in message


def test_within_max_context_a_workload_builds_and_a_long_jsonl_line_is_named(tmp_path) -> None:
    plan = _plan(workload="shared_prefix", max_context=601, input=80, output=9, requests=8)
    assert max(r.prompt_tokens + r.max_tokens for r in requests_from_plan(plan, "m")) == 601
    path = tmp_path / "long.jsonl"
    path.write_text('{"prompt": "a b c", "max_tokens": 7}\n\n{"prompt": "a b c"}\n')
    items = _plan(workload="jsonl", file=str(path), max_context=10, output=7)["items"]
    assert [x["max_tokens"] for x in items] == [7, 7]  # 3 prompt tokens + 7: fits exactly
    with pytest.raises(ConfigError, match=r"long.jsonl:3: 11 tokens .* > max_context 10"):
        _plan(workload="jsonl", file=str(path), max_context=10, output=8)
    with pytest.raises(ConfigError, match=r"long.jsonl:1: 10 tokens .* > max_context 9"):
        _plan(workload="jsonl", file=str(path), max_context=9, output=1)


def test_an_empty_or_missing_jsonl_file_is_refused(tmp_path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(ConfigError, match="no requests"):
        _plan(workload="jsonl", file=str(empty))
    with pytest.raises(ConfigError, match="cannot read the request file"):
        _plan(workload="jsonl", file=str(tmp_path / "absent.jsonl"))


def test_a_plan_of_another_schema_or_workload_is_refused() -> None:
    plan = _plan(requests=2, input=20, output=2)
    with pytest.raises(ConfigError, match="schema"):
        requests_from_plan({**plan, "schema": "harness.llm_workload/0"}, "m")
    with pytest.raises(ConfigError, match="'synthetic' plan"):
        conversations_from_plan(plan, "m")
