"""Host time of torch.stft on CUDA for batch sizes seen before and not (cuFFT plan cache)."""
import time, torch, numpy as np
d = torch.device("cuda")
w = torch.hann_window(400, periodic=False, device=d)
def t(b, S=2*160+512+1):
    x = torch.randn(b, S, device=d)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    torch.stft(x, n_fft=512, hop_length=160, win_length=400, window=w, center=False, return_complex=True)
    t1 = time.perf_counter(); torch.cuda.synchronize()
    return (t1 - t0) * 1e3
t(8)
rng = np.random.default_rng(0)
fresh = [t(int(b)) for b in rng.choice(np.arange(100, 600), 40, replace=False)]
again = [t(int(b)) for b in rng.choice(np.arange(100, 600), 40, replace=False) if False] or [t(256) for _ in range(20)]
print(f"stft host ms: fresh sizes median {np.median(fresh):.2f} max {max(fresh):.2f}; a cached size median {np.median(again):.2f}")
print("plan cache size", torch.backends.cuda.cufft_plan_cache.size, "max", torch.backends.cuda.cufft_plan_cache.max_size)
