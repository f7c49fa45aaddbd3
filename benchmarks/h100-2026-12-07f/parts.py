"""bench_capacity.py with the Recognizer's part_rows set: python .carry/parts.py ROWS [bench_capacity args]."""
import runpy
import sys

sys.path.insert(0, ".")
import streamd.engine.recognizer as r  # noqa: E402

rows = int(sys.argv.pop(1))
init = r.Recognizer.__init__


def patched(self, *a, **k):  # type: ignore[no-untyped-def]
    k.setdefault("part_rows", rows)
    init(self, *a, **k)


r.Recognizer.__init__ = patched  # type: ignore[method-assign]
sys.argv[0] = "scripts/bench_capacity.py"
runpy.run_path("scripts/bench_capacity.py", run_name="__main__")
