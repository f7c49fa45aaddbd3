# Experiment: steps copy the rings' slot range (or host-gathered rows) instead of the GPU reading the pinned rings.
import streamd.engine.recognizer as _r
_r.MAPPED_RINGS = False
