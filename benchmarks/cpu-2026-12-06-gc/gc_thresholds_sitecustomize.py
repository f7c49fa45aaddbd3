import gc, os
t = os.environ.get("GC_THRESHOLDS")
if t:
    gc.set_threshold(*map(int, t.split(",")))
