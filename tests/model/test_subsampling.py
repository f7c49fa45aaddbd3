"""The subsampling's fast paths against its plain definition."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from helpers import random_model
from streamd.model.subsampling import stage_length


def reference_subsampling(conv: torch.nn.Sequential, mel: torch.Tensor) -> torch.Tensor:
    """NeMo's causal dw_striding as written: explicit (2, 1) zero padding before each strided conv."""
    x = mel.transpose(1, 2).unsqueeze(1)
    for i, layer in enumerate(conv):
        if i in (0, 2, 5):
            x = F.pad(x, (2, 1, 2, 1))
        x = layer(x)
    return x


def test_padding_inside_the_conv_equals_explicit_causal_padding() -> None:
    pe = random_model(0).encoder.pre_encode
    for t in (121, 17, 1, 64):
        mel = torch.randn(3, 80, t)
        lengths = torch.full((3,), t)
        with torch.no_grad():
            ref = reference_subsampling(pe.conv, mel)
            out, out_len = pe(mel, lengths)
            b, c, tt, f = ref.shape
            expected = pe.out(ref.transpose(1, 2).reshape(b, tt, c * f))
        assert torch.equal(out_len, stage_length(stage_length(stage_length(lengths))))
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_full_windows_skip_masks_without_changing_anything() -> None:
    pe = random_model(1).encoder.pre_encode
    mel = torch.randn(4, 80, 121)
    lengths = torch.full((4,), 121)
    with torch.no_grad():
        masked, _ = pe(mel, lengths, torch.zeros(4, dtype=torch.long))
        skipped, _ = pe(mel, lengths, None, full=True)
    assert torch.equal(masked, skipped)


def test_dropped_front_frames_are_not_computed_and_the_rest_is_unchanged() -> None:
    """`drop` (a streaming step's 2 re-encoded frames) computes only what the kept frames read,
    with no causal padding where real frames are there: the kept frames and lengths equal the
    full pass's, for odd windows (the engine's), even ones (the right padding), masked starts
    and ends, and windows too short to keep anything."""
    pe = random_model(2).encoder.pre_encode
    for t in (25, 121, 17, 24, 30, 9, 3):
        for drop in (1, 2, 3):
            mel = torch.randn(4, 80, t)
            lengths = torch.tensor([t, t, max(t - 8, 0), min(5, t)])
            start = torch.tensor([min(16, t - t % 8), 8 if t > 8 else 0, 0, 0])
            with torch.no_grad():
                whole, whole_len = pe(mel, lengths, start)
                kept, kept_len = pe(mel, lengths, start, drop=drop)
            assert kept.shape[1] == max(whole.shape[1] - drop, 0), (t, drop)
            torch.testing.assert_close(kept, whole[:, drop:], rtol=1e-5, atol=1e-5)
            assert torch.equal(kept_len, (whole_len - drop).clamp(min=0))
