"""Experiment only: GC_THRESHOLDS="g0,g1,g2" sets the cyclic collector's thresholds in every Python process."""
import gc
import os

_t = os.environ.get("GC_THRESHOLDS")
if _t:
    gc.set_threshold(*(int(x) for x in _t.split(",")))
