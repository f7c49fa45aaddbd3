"""One attention layer's step, old (rel_shift + permute gather) vs new (_by_distance), on CUDA:
B streams, T query frames, C cached keys (ring order, random heads), bf16, CUDA events."""
import importlib.util, sys, torch
sys.path.insert(0, ".")
from streamd.model import attention as new
spec = importlib.util.spec_from_file_location("old_attention", ".carry/attn/old_attention.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)

def run(mod, b, t, c, ring, dtype=torch.bfloat16, iters=30):
    torch.manual_seed(0)
    att = mod.RelPositionMultiHeadAttention(512, 8, bias=True).cuda().to(dtype).eval()
    n = c + t
    q = torch.randn(b, t, 512, device="cuda", dtype=dtype)
    window = torch.randn(b, n, 1024, device="cuda", dtype=dtype)
    _, pos = mod.RelPositionalEncoding(512, 500, xscaling=True).cuda()(q, n)
    mask = torch.rand(b, t, n, device="cuda") < 0.05
    order = None
    if ring:
        head = torch.randint(0, c, (b,), device="cuda")
        order = torch.cat([(torch.arange(c, device="cuda")[None] - head[:, None]) % c,
                           torch.arange(c, n, device="cuda").expand(b, t)], 1)
    with torch.no_grad():
        out = att.forward_cached(q, window, pos, mask, order)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(iters):
            s.record(); att.forward_cached(q, window, pos, mask, order); e.record(); e.synchronize()
            times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2], out.float()

for b, t, c in [(1024, 2, 70), (6144, 2, 70), (1024, 14, 70)]:
    for ring in (True, False):
        to, oo = run(old, b, t, c, ring)
        tn, on = run(new, b, t, c, ring)
        diff = (oo - on).abs().max().item()
        print(f"B={b} T={t} C={c} {'ring' if ring else 'time'}: old {to:.3f} ms, new {tn:.3f} ms a layer "
              f"(x17 layers: {17*to:.1f} -> {17*tn:.1f} ms); max |diff| {diff:.3g}", flush=True)

# The subsampling (pre_encode) of one part: 1024 streams x 25 mel frames (9 cached + 16 new at
# 160 ms), and x 121 at 1120 ms; cudnn.benchmark off, then on.
sys.path.insert(0, "scripts")
from bench_model import FASTCONFORMER_L
from streamd.model.dims import ModelDims
from streamd.model.subsampling import CausalSubsampling
sub = CausalSubsampling(ModelDims(vocab_size=1024, **FASTCONFORMER_L)).cuda().to(torch.bfloat16).eval()
for bench in (False, True):
    torch.backends.cudnn.benchmark = bench
    for b, frames in [(1024, 25), (1024, 121)]:
        mel = torch.randn(b, 80, frames, device="cuda", dtype=torch.bfloat16)
        lengths = torch.full((b,), frames, device="cuda")
        with torch.no_grad():
            for _ in range(3):
                sub(mel, lengths, full=True)
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ts = []
            for _ in range(20):
                s.record(); sub(mel, lengths, full=True); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
        ts.sort()
        print(f"subsampling B={b} x {frames} mel frames, cudnn.benchmark {bench}: {ts[10]:.3f} ms", flush=True)
