"""Timing for the micro-benchmarks beside it: a function captured in a CUDA graph, median replay."""
import torch


def graph_ms(fn, it=50):
    """Warm `fn` up on a side stream, capture it, and return the median of `it` replays in ms."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    xs = []
    for _ in range(it):
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        xs.append(a.elapsed_time(b))
    xs.sort()
    return xs[it // 2]
