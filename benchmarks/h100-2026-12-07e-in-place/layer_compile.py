"""One FastConformer-L layer's streaming step (kv cache, ring order), eager vs torch.compile
(inductor), each captured in a CUDA graph and timed by replay. bf16, B streams x T frames."""
import sys, time, os
import torch
sys.path.insert(0, ".")
from streamd.model.conformer import ConformerLayer
from streamd.model.dims import ModelDims
sys.path.insert(0, "scripts")
from bench_model import FASTCONFORMER_L

torch.backends.cuda.matmul.allow_tf32 = False
dev, bf = torch.device("cuda"), torch.bfloat16
dims = ModelDims(vocab_size=1024, **FASTCONFORMER_L)
torch.manual_seed(0)
layer = ConformerLayer(dims).to(dev, bf).eval()
for p in layer.parameters():
    p.data.normal_(0, 0.05)
C, d = 70, dims.d_model


def inputs(B, T, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    n = C + T
    x = torch.randn(B, T, d, device=dev, dtype=bf, generator=g)
    pos = torch.randn(1, 2 * n - 1, d, device=dev, dtype=bf, generator=g)
    att = torch.rand(B, T, n, device=dev, generator=g) < 0.05
    pad = torch.zeros(B, T, dtype=torch.bool, device=dev)
    win = torch.randn(B, n, 2 * d, device=dev, dtype=bf, generator=g)
    tm = torch.randn(B, d, dims.conv_kernel - 1, device=dev, dtype=bf, generator=g)
    head = torch.randint(0, C, (B,), device=dev, generator=g)
    r = torch.arange(n, device=dev)
    order = torch.cat([(r[:C] - head[:, None]) % C, r[C:].expand(B, T)], dim=1)
    return [x, pos, att, pad, win, tm, True, order]


def timed_graph(fn, args, it=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*args)
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    xs = []
    for _ in range(it):
        a.record(); g.replay(); b.record(); b.synchronize(); xs.append(a.elapsed_time(b))
    xs.sort()
    return xs[it // 2], out


def run(fn, B, T):
    with torch.no_grad():
        args = inputs(B, T, 1)
        ms, out = timed_graph(fn, args)
        return ms, out[0].float().clone(), out[1].float().clone(), args[4].float().clone()


from streamd.model.attention import RelPositionMultiHeadAttention as Att
modes = sys.argv[1:] or ["default", "max-autotune-no-cudagraphs"]
for B, T in [(1024, 2), (1024, 14)]:
    Att.kernel = None
    ms_k, *_ = run(layer, B, T)
    print(f"B={B} T={T} eager graph, attention kernel: {ms_k:.3f} ms", flush=True)
    Att.kernel = False  # compiled arms: the SDPA path (fullgraph), compared with eager SDPA
    ms_e, xe, te, we = run(layer, B, T)
    print(f"B={B} T={T} eager graph, SDPA: {ms_e:.3f} ms", flush=True)
    for mode in modes:
        torch._dynamo.reset()
        c = torch.compile(layer, mode=mode, dynamic=False, fullgraph=True)
        t0 = time.time()
        with torch.no_grad():
            c(*inputs(B, T, 2))
        torch.cuda.synchronize()
        comp = time.time() - t0
        ms_c, xc, tc, wc = run(c, B, T)
        rel = lambda a, b: ((a - b).norm() / b.norm()).item()
        print(f"B={B} T={T} {mode}: {ms_c:.3f} ms ({ms_e / ms_c:.2f}x; compile {comp:.0f} s); "
              f"rel diff x {rel(xc, xe):.2e} time {rel(tc, te):.2e} window {rel(wc, we):.2e}", flush=True)
        ms_e2, *_ = run(layer, B, T)
        print(f"B={B} T={T} eager again: {ms_e2:.3f} ms", flush=True)
