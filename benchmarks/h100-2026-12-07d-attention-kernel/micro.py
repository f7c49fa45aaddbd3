"""One attention layer's forward_cached (1024 streams, T query frames, 70 cached keys in a ring,
8 heads of 64, bf16): the Triton kernel vs the SDPA path, each captured in a CUDA graph, median
replay; and their outputs' difference against an fp32 reference."""
import sys, torch
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from graph_replay import graph_ms  # noqa: E402
from streamd.model.attention import RelPositionMultiHeadAttention, RelPositionalEncoding

for B, T in [(1024, 2), (1024, 14)]:
    torch.manual_seed(0)
    att = RelPositionMultiHeadAttention(512, 8, bias=True).cuda().eval()
    with torch.no_grad():
        for p in att.parameters(): p.normal_(0, 0.05)
    c, n = 70, 70 + T
    q = torch.randn(B, T, 512, device="cuda"); win = torch.randn(B, n, 1024, device="cuda")
    _, pos = RelPositionalEncoding(512, 500, True).cuda()(q, n)
    mask = torch.rand(B, T, n, device="cuda") < 0.05
    head = torch.randint(0, c, (B,), device="cuda")
    order = torch.cat([(torch.arange(c, device="cuda")[None] - head[:, None]) % c, torch.arange(c, n, device="cuda").expand(B, T)], 1)
    with torch.no_grad():
        att.kernel, att.fused = False, False
        ref = att.forward_cached(q, win.clone(), pos, mask, order)
        att.to(torch.bfloat16)
        qb, wb, pb = q.bfloat16(), win.bfloat16(), pos.bfloat16()
        res = {}
        for name, kernel in (("sdpa", False), ("kernel", True), ("sdpa", False), ("kernel", True)):
            att.kernel, att.fused = kernel, True
            out = att.forward_cached(qb, wb, pb, mask, order).float()
            err = ((out - ref).norm() / ref.norm()).item()
            ms = graph_ms(lambda: att.forward_cached(qb, wb, pb, mask, order))
            print(f"B={B} T={T} {name:6s}: {ms:.3f} ms a layer, rel err vs fp32 {err:.2e}", flush=True)
