"""Where a Recognizer.step's time goes on the CPU (N ready streams, 1120 ms chunks): cProfile by phase.

    PYTHONPATH=. python benchmarks/cpu-2026-12-03/profile_step_phases.py MODEL N STEPS
"""
import cProfile, pstats, sys
from pathlib import Path
import numpy as np, torch
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import load
from streamd.engine.migration import placed_copy
from streamd.engine.recognizer import Recognizer
from streamd.model.checkpoint import load_model
m = placed_copy(load_model(sys.argv[1]).model, torch.device("cpu"), torch.float32)
n = int(sys.argv[2]); STEPS = int(sys.argv[3])
rec = Recognizer(m, capacity=n)
tone = np.frombuffer(load.tone_bursts(seconds=20.0).pcm, dtype="<i2").astype(np.float32) / 32768
streams = [rec.open() for _ in range(n)]
chunk = 160 * 8 * (rec.geometry.right + 1)
pos = [int(x) for x in np.random.default_rng(0).integers(0, tone.size - chunk, n)]
def step():
    for k, s in enumerate(streams):
        p = pos[k] % (tone.size - chunk); s.push_audio(tone[p:p + chunk]); pos[k] += chunk
    rec.step([s for s in streams if s.ready])
for _ in range(2): step()
pr = cProfile.Profile()
pr.enable()
for _ in range(STEPS): step()
pr.disable()
st = pstats.Stats(pr)
total = st.total_tt
def cum(pattern):
    return sum(v[3] for k, v in st.stats.items() if pattern in f"{k[0]}:{k[2]}")
parts = {"features (feature_segment + logmel_many)": cum("stream.py:feature_segment") + cum("features.py:logmel_many"),
         "window assembly (take_window, add_frames, np.stack)": cum("stream.py:take_window") + cum("stream.py:add_frames"),
         "encoder step": cum("encoder_step.py:__call__"),
         "decoder": cum("greedy.py:__call__"),
         "results (_results, to_lists)": cum("recognizer.py:_results") + cum("greedy.py:to_lists"),
         "audio push (test driver)": cum("stream.py:push_audio")}
print(f"{n} streams, {total/STEPS*1000:.0f} ms per step (profiled)")
for k, v in parts.items():
    print(f"  {k:55s} {v/STEPS*1000:8.1f} ms  {100*v/total:5.1f} %")
st.sort_stats("tottime").print_stats(12)
