"""Pure statistics over recorded data: percentiles and their confidence, leak trends,
recovery times, contention ratios, thread-scaling fits and run validity.

numpy, scipy and hdrh only — no Locust, psutil, network or collectors.
"""
