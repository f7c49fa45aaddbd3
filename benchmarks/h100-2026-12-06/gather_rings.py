"""How to read the slots' rings into the attention windows on a GPU: (L, S, C, D) rings of S slots
into the first C frames of (L, n, C + T, D) windows, n of the slots in random or sorted order, six ways
(FastConformer-L at 160 ms: 17 layers, C = 70, T = 2, keys and values D = 1024, bf16, 5120 of 6144
slots). Prints each way's time, its effective bandwidth (bytes read + written) and whether it
gave the same windows as the first (e_plain_copy copies the first n slots: no index, the bandwidth of
the copy alone).

    python3 benchmarks/h100-2026-12-06/gather_rings.py
"""
import torch
L, S, n, C, T, D = 17, 6144, 5120, 70, 2, 1024
dev, dt = "cuda", torch.bfloat16
ch = torch.randn(L, S, C, D, device=dev, dtype=dt)
win = torch.zeros(L, n, C + T, D, device=dev, dtype=dt)
for order in ("random", "sorted"):
    rows = torch.randperm(S, device=dev)[:n]
    if order == "sorted":
        rows = rows.sort().values
    flat_ch, flat_win = ch.view(L, S, C * D), win.view(L, n, (C + T) * D)
    def a(): torch.index_select(ch, 1, rows, out=win[:, :, :C])
    def b(): torch.index_select(flat_ch, 1, rows, out=flat_win[:, :, :C * D])
    def c():
        for l in range(L):
            torch.index_select(flat_ch[l], 0, rows, out=flat_win[l, :, :C * D])
    def d(): win[:, :, :C].copy_(ch.index_select(1, rows))
    def e(): win[:, :, :C].copy_(ch[:, :n])
    def f(): flat_win[:, :, :C * D] = flat_ch[:, rows]
    ref = None
    for name, fn in dict(a_strided4d=a, b_flat3d=b, c_per_layer=c, d_tmp_copy=d, e_plain_copy=e, f_adv_index=f).items():
        fn(); torch.cuda.synchronize()
        if name != "e_plain_copy":
            got = win[:, :, :C].clone()
            if ref is None:
                ref = got
            ok = torch.equal(got, ref)
        else:
            ok = "-"
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        for _ in range(10):
            fn()
        ev1.record(); torch.cuda.synchronize()
        ms = ev0.elapsed_time(ev1) / 10
        gb = 2 * L * n * C * D * 2 / 1e9
        print(f"{order:6s} {name:14s} {ms:7.2f} ms  {gb / ms:6.2f} TB/s  same={ok}", flush=True)
