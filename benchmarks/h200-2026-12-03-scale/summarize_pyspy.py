"""Samples per thread (process for the front ends) and the engine thread's leading leaf frames,
from a `py-spy record --format raw --threads --subprocesses` file (kept xz-compressed here).

    python summarize_pyspy.py run5-pyspy-160ms-1536.txt.xz
"""
import collections
import lzma
import sys

per_thread: collections.Counter[str] = collections.Counter()
engine: collections.Counter[str] = collections.Counter()
for line in (lzma.open if sys.argv[1].endswith(".xz") else open)(sys.argv[1], "rt"):
    stack, _, count = line.rstrip().rpartition(" ")
    frames = stack.split(";")
    n = int(count)
    who = frames[1] if len(frames) > 1 else frames[0]
    who = "front end " + who.split(":")[0] if who.startswith("process") else who.split(" ")[-1]
    per_thread[who] += n
    if "streamd-engine" in who:
        engine[" < ".join(f.split(" (")[0] for f in frames[-1:-3:-1])] += n
print("samples per thread or process (50 per second):")
for who, n in per_thread.most_common():
    print(f"  {n:5d}  {who}")
print("engine thread, innermost frames:")
for where, n in engine.most_common(12):
    print(f"  {n:5d}  {where}")
