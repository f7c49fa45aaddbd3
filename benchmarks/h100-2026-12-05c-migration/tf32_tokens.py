"""How sensitive is the benchmarks' random FastConformer-L's greedy output to numeric noise?
Offline, on the CPU, on three 20 s tone-burst streams at the 160 ms context, fp32 against: fp64;
the same model with every linear layer's output perturbed by 1e-5 relative noise; and with its
convolutions' inputs and weights rounded to TF32 (10 bits of mantissa, to nearest), what cuDNN's
TF32 convolutions compute from. Run from the repo root:
    python benchmarks/h100-2026-12-05c-migration/tf32_tokens.py"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, "scripts")
import load  # noqa: E402
from bench_migration import make_model  # noqa: E402
from streamd.decode import transcribe_offline  # noqa: E402
from streamd.decoding.greedy import GreedyLabelLooping  # noqa: E402
from streamd.model.checkpoint import load_model  # noqa: E402


def tf32(x: torch.Tensor) -> torch.Tensor:
    return ((x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def first_difference(a: list[int], b: list[int]) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return "identical" if a == b else f"differ from token {k if k is not None else min(len(a), len(b))}"


path = Path(tempfile.mkdtemp()) / "fcl.pt"
make_model(path, 1024)
fp32 = load_model(path).model.eval()
ctx = fp32.dims.att_context_with_right(1)
fp64 = load_model(path).model.eval().double()
fp64.preprocessor.float()
noisy = load_model(path).model.eval()
for mod in noisy.encoder.modules():
    if isinstance(mod, torch.nn.Linear):
        mod.register_forward_hook(lambda mod, args, out: out * (1 + 1e-5 * torch.randn_like(out)))
cut = load_model(path).model.eval()
with torch.no_grad():
    for mod in cut.encoder.modules():
        if isinstance(mod, (torch.nn.Conv1d, torch.nn.Conv2d)):
            mod.weight.copy_(tf32(mod.weight))
            mod.register_forward_pre_hook(lambda mod, args: (tf32(args[0]), *args[1:]))
for seed in range(3):
    pcm = load.looped(load.tone_bursts(seed=seed), 20)
    a = torch.from_numpy(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768)[: 16000 * 20]
    tokens, _ = transcribe_offline(fp32, a, att_context=ctx)
    with torch.no_grad():
        mel, mel_len = fp64.preprocessor(a[None], torch.tensor([a.shape[0]]))
        enc, enc_len = fp64.encoder(mel.double(), mel_len, ctx)
        hyps, _ = GreedyLabelLooping.for_model(fp64)(enc, enc_len)
    tokens64 = hyps.to_lists()[0][0]
    torch.manual_seed(seed)
    tokens_noisy, _ = transcribe_offline(noisy, a, att_context=ctx)
    tokens_tf32, _ = transcribe_offline(cut, a, att_context=ctx)
    print(f"stream {seed}: {len(tokens)} tokens; fp64: {first_difference(tokens, tokens64)}; 1e-5 noise: "
          f"{first_difference(tokens, tokens_noisy)}; TF32 convolutions: {first_difference(tokens, tokens_tf32)}",
          flush=True)
