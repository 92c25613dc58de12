"""Reference dynamic-batching KServe V2 inference server (``python -m harness_reference_server``)."""

__version__ = "0.1.0"
