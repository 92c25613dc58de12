"""Locust entry point of the harness.

    locust -f locustfiles/inference.py --host http://127.0.0.1:8000 --scenario spike \
        [--model NAME] [--sut-pid PID | --sut-cmd "CMD {port}"] [--out DIR] [--headless]

Everything lives in the plugin; ``harness locust-options`` lists its options (Locust
prints its own ``--help`` before it loads this file, so that cannot show them).
"""

from harness.load.plugin import *  # noqa: F403 (users, shape and listeners for Locust)
