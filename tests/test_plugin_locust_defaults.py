"""The plugin builds Locust's table of its own options' defaults once per process: a
worker asks for it once per forwarded option at every spawn message."""

from __future__ import annotations

from locust import argument_parser

from harness.load import plugin


def _fresh_defaults() -> dict:
    parser = argument_parser.get_empty_argument_parser()
    argument_parser.setup_parser_arguments(parser)
    parser._default_config_files = {}
    return vars(parser.parse([]))


def test_the_cached_table_is_locusts_own_defaults() -> None:
    table = argument_parser.default_args_dict()
    assert getattr(argument_parser.default_args_dict, "cached_by_harness", False)
    assert table == _fresh_defaults()
    # Locust's options only: the harness's own are forwarded to the workers
    assert "scenario" not in table and "host" in table


def test_built_once_and_each_caller_gets_its_own_copy(monkeypatch) -> None:
    built: list[int] = []

    def build() -> dict:
        built.append(1)
        return {"host": None, "users": 1}

    monkeypatch.setattr(argument_parser, "default_args_dict", build)
    plugin.cache_locust_defaults()
    first = argument_parser.default_args_dict()
    first["users"] = 99  # a caller that changes its copy changes nobody else's
    for _ in range(100):
        assert argument_parser.default_args_dict() == {"host": None, "users": 1}
    assert len(built) == 1
    plugin.cache_locust_defaults()  # a second call does not wrap the cache again
    argument_parser.default_args_dict()
    assert len(built) == 1
