"""Where one attention layer's 0.55 ms (B=1024, T=2, n=72, H=8, dk=64, bf16) goes."""
import torch, sys
sys.path.insert(0, ".")
from streamd.model import attention as A
F = torch.nn.functional
def t(fn, it=30):
    fn(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    xs = []
    for _ in range(it):
        s.record(); fn(); e.record(); e.synchronize(); xs.append(s.elapsed_time(e))
    xs.sort(); return xs[it // 2]
bf = torch.bfloat16
for B, T in [(1024, 2), (1024, 14)]:
    n, H, dk = 70 + T, 8, 64
    q = torch.randn(B, H, T, dk, device="cuda", dtype=bf)
    kv = torch.randn(B, n, 2 * H * dk, device="cuda", dtype=bf)
    k = kv[..., :512].view(B, n, H, dk).transpose(1, 2); v = kv[..., 512:].view(B, n, H, dk).transpose(1, 2)
    bias = torch.randn(B, H, T, n, device="cuda", dtype=bf)
    kc, vc = k.contiguous(), v.contiguous()
    x = torch.randn(B * T, 512, device="cuda", dtype=bf); lin = torch.nn.Linear(512, 512).cuda().to(bf)
    with torch.no_grad():
        r = {
          "sdpa bias (k,v strided)": t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)),
          "sdpa no mask (k,v strided)": t(lambda: F.scaled_dot_product_attention(q, k, v)),
          "sdpa bias (k,v contiguous)": t(lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=bias)),
          "explicit matmul softmax matmul": t(lambda: torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-2, -1)) + bias, -1), v)),
          "einsum bhtd,bhnd (strided)": t(lambda: torch.einsum("bhtd,bhnd->bhtn", q, k)),
          "mul-sum scores (broadcast)": t(lambda: (q.unsqueeze(3) * k.unsqueeze(2)).sum(-1)),
          "one linear 512x512 on B*T rows": t(lambda: lin(x)),
          "copy k contiguous": t(lambda: k.contiguous()),
        }
        for bk in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
            try:
                from torch.nn.attention import sdpa_kernel, SDPBackend
                with sdpa_kernel(getattr(SDPBackend, bk)):
                    r[f"sdpa bias backend {bk}"] = t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
            except Exception as ex:
                r[f"sdpa bias backend {bk}"] = float("nan"); print(bk, type(ex).__name__, str(ex)[:100])
    for name, ms in r.items():
        print(f"B={B} T={T}: {name:40s} {ms:.3f} ms", flush=True)
