"""Experiment only: SWITCH_INTERVAL_S sets the GIL's switch interval in spawned processes (front ends)."""
import os
import sys

_s = os.environ.get("SWITCH_INTERVAL_S")
if _s and "--multiprocessing-fork" in sys.argv:
    sys.setswitchinterval(float(_s))
