"""The subsampling at 1024 streams (FastConformer-L sizes, bf16), CUDA-graph replay medians:
drop=0 (before today), drop=2 with ReLU and mask as two passes (the module of b027d7f, its path
the first argument: `git show b027d7f:streamd/model/subsampling.py > /tmp/sub_before.py`), drop=2
with the ReLU and mask fused into one clamp (the working tree); channels_last of the last."""
import sys, importlib.util, torch
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from graph_replay import graph_ms  # noqa: E402
from streamd.model.dims import ModelDims
from streamd.model.subsampling import CausalSubsampling
spec = importlib.util.spec_from_file_location("sub_before", sys.argv[1] if len(sys.argv) > 1 else "/tmp/sub_before.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)

dims = ModelDims(vocab_size=1024)
new = CausalSubsampling(dims).cuda().eval().to(torch.bfloat16)
before = old.CausalSubsampling(dims).cuda().eval().to(torch.bfloat16); before.load_state_dict(new.state_dict())
cl = CausalSubsampling(dims).cuda().eval().to(torch.bfloat16).to(memory_format=torch.channels_last); cl.load_state_dict(new.state_dict())
B = 1024
with torch.no_grad():
    for W in (25, 121):
        mel = torch.randn(B, 80, W, device="cuda").bfloat16()
        lengths = torch.full((B,), W, device="cuda"); start = torch.zeros(B, dtype=torch.long, device="cuda")
        start[:100] = 16; lengths[100:200] = W - 8
        a, _ = before(mel, lengths, start, drop=2); b, _ = new(mel, lengths, start, drop=2)
        print(f"W={W} clamp vs two passes: max abs diff {(a.float() - b.float()).abs().max().item():.3e}")
        arms = {"drop 0": lambda: before(mel, lengths, start), "two passes": lambda: before(mel, lengths, start, drop=2),
                "clamp": lambda: new(mel, lengths, start, drop=2), "clamp cl": lambda: cl(mel, lengths, start, drop=2)}
        for name, fn in list(arms.items()) * 2:
            print(f"W={W} {name:12s} {graph_ms(fn, 40):.3f} ms", flush=True)
