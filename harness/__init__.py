"""Load-testing and chaos harness for ML inference servers."""

__version__ = "0.1.0"
