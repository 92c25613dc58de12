"""Locust entry point of the streaming LLM user (OpenAI-compatible chat / completions).

    locust -f locustfiles/llm.py --host http://127.0.0.1:8000 --headless -u 4 -r 4 -t 10s \
        [--llm-rate 1] [--llm-max-tokens 64] [--llm-prompt-tokens 32] [--llm-api chat] \
        [--llm-summary summary.json]

``locust --help`` lists the options under "llm streams"; harness/load/stream_plugin.py
says what the end-of-test summary holds and how workers' statistics are merged.
"""

from harness.load.stream_plugin import LLMUser

__all__ = ["LLMUser"]
