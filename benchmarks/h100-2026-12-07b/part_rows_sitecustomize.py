# Experiment: every Recognizer made in this process launches parts of $PART_ROWS streams.
import os
if os.environ.get("PART_ROWS"):
    import streamd.engine.recognizer as _r
    _init = _r.Recognizer.__init__
    def _with_parts(self, *a, **k):
        k.setdefault("part_rows", int(os.environ["PART_ROWS"]))
        _init(self, *a, **k)
    _r.Recognizer.__init__ = _with_parts
