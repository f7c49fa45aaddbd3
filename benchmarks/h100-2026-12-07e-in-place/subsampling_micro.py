"""The subsampling at 1024 streams (FastConformer-L: 80 mels, 256 channels, d 512, bf16) at 160 ms
(25 mel frames) and 1120 ms (121): the module as the graph body runs it (masks on), full=True,
channels_last, the trimmed variant (no frames the step drops), torch.compile; CUDA-graph replay
medians; then the eager kernels by GPU time."""
import sys, torch
from torch.nn import functional as F
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from graph_replay import graph_ms  # noqa: E402
from streamd.model.dims import ModelDims
from streamd.model.subsampling import CausalSubsampling, _row_mask, stage_length

def trimmed(sub, mel, lengths, start, drop=2):
    x = mel.transpose(1, 2).unsqueeze(1)[:, :, drop:]
    off = drop
    for layer in sub.conv:
        if isinstance(layer, torch.nn.Conv2d) and layer.stride == (2, 2):
            t = torch.arange(x.shape[2], device=x.device) + off
            x = x * ((t[None] < lengths[:, None]) & (t[None] >= start[:, None]))[:, None, :, None].to(x.dtype)
            lengths, start = stage_length(lengths), start // 2
            f = x.shape[3]
            x = F.conv2d(x, layer.weight, layer.bias, stride=2, padding=(0, 2), groups=layer.groups)[..., : f // 2 + 1]
        elif isinstance(layer, torch.nn.ReLU):
            x = torch.relu_(x)
        else:
            x = layer(x)
    t = torch.arange(x.shape[2], device=x.device) + off
    x = x * ((t[None] < lengths[:, None]) & (t[None] >= start[:, None]))[:, None, :, None].to(x.dtype)
    b, c, t, f = x.shape
    return sub.out(x.transpose(1, 2).reshape(b, t, c * f)), lengths

dims = ModelDims(vocab_size=1024)
sub = CausalSubsampling(dims).cuda().eval().to(torch.bfloat16)
B = 1024
with torch.no_grad():
    for W in (25, 121):
        mel = torch.randn(B, 80, W, device="cuda")
        lengths = torch.full((B,), W, device="cuda"); start = torch.zeros(B, dtype=torch.long, device="cuda")
        start[:100] = 16; lengths[100:200] = W - 8
        mb = mel.bfloat16()
        ref, _ = sub(mb, lengths, start)
        tr, _ = trimmed(sub, mb, lengths, start)
        print(f"W={W} trimmed vs module[:, 2:]: max abs diff {(tr.float() - ref[:, 2:].float()).abs().max().item():.3e} "
              f"(ref max {ref.float().abs().max().item():.2f}), shapes {tuple(tr.shape)} {tuple(ref.shape)}", flush=True)
        arms = {"module masks": lambda: sub(mb, lengths, start), "module full": lambda: sub(mb, lengths, start, True),
                "trimmed": lambda: trimmed(sub, mb, lengths, start)}
        for name, fn in list(arms.items()) * 2:
            print(f"W={W} {name:14s} {graph_ms(fn, 40):.3f} ms", flush=True)
        cl = CausalSubsampling(dims).cuda().eval().to(torch.bfloat16).to(memory_format=torch.channels_last)
        cl.load_state_dict(sub.state_dict())
        print(f"W={W} channels_last   {graph_ms(lambda: cl(mb, lengths, start), 40):.3f} ms", flush=True)
        try:
            comp = torch.compile(sub)
            comp(mb, lengths, start)
            print(f"W={W} compiled        {graph_ms(lambda: comp(mb, lengths, start), 40):.3f} ms", flush=True)
            ct = torch.compile(lambda: trimmed(sub, mb, lengths, start))
            ct()
            print(f"W={W} compiled trim   {graph_ms(ct, 40):.3f} ms", flush=True)
        except Exception as e:
            print("compile failed", type(e).__name__, str(e)[:200])
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5): sub(mb, lengths, start)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
