"""On-the-fly augmentation of padded waveform batches in torch (CPU or CUDA).

`augment(wav, lengths, generator)` applies, each to a random subset of the batch: speed
perturbation, simulated room reverberation, additive white / pink / babble noise at a random SNR,
telephone band-limiting, G.711 mu-law coding and random gain. `nonspeech` replaces chosen rows
with sounds that are not speech (silence, room noise, hum, tones, clicks, breaths), for training
with empty transcripts. All randomness comes from `generator`, which must be on
the batch's device; the same generator state gives the same output.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AugmentConfig:
    """Probabilities (per utterance) and ranges of each augmentation."""

    sample_rate: int = 16000
    speed_prob: float = 0.6
    # Up to 1.25: speed perturbation moves pitch and formants too, and the training voices outside
    # espeak are all male (flite awb/rms/kal16, festival kal/ked); a faster copy of them has the
    # higher formants and pitch of a shorter vocal tract.
    speed_range: tuple[float, float] = (0.85, 1.25)
    reverb_prob: float = 0.3
    rt60_range: tuple[float, float] = (0.15, 0.8)
    drr_db_range: tuple[float, float] = (-3.0, 12.0)
    noise_prob: float = 0.5
    snr_db_range: tuple[float, float] = (0.0, 30.0)
    babble_voices: int = 3
    telephone_prob: float = 0.1
    telephone_band: tuple[float, float] = (300.0, 4000.0)
    mulaw_prob: float = 0.1
    gain_prob: float = 0.5
    gain_db_range: tuple[float, float] = (-20.0, 6.0)


def augment(wav: torch.Tensor, lengths: torch.Tensor, generator: torch.Generator,
            config: AugmentConfig = AugmentConfig()) -> tuple[torch.Tensor, torch.Tensor]:
    """Augment a batch (B, T) of waveforms with valid lengths (B,); returns (B, T') and lengths."""
    dtype = wav.dtype
    x = wav.float()
    g, c = generator, config
    x, lengths = speed_perturb(x, lengths, _uniform(g, x, c.speed_range), _chance(g, x, c.speed_prob))
    x = reverberate(x, lengths, _uniform(g, x, c.rt60_range), _uniform(g, x, c.drr_db_range),
                    _chance(g, x, c.reverb_prob), g, c.sample_rate)
    x = add_noise(x, lengths, _uniform(g, x, c.snr_db_range),
                  torch.randint(0, 3, (x.shape[0],), generator=g, device=x.device),
                  _chance(g, x, c.noise_prob), g, c.babble_voices)
    x = band_limit(x, lengths, _chance(g, x, c.telephone_prob), c.telephone_band, c.sample_rate)
    x = mulaw_code(x, _chance(g, x, c.mulaw_prob))
    x = random_gain(x, _uniform(g, x, c.gain_db_range), _chance(g, x, c.gain_prob))
    return x.to(dtype), lengths


def valid_mask(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(B, T) True where a sample is inside its utterance."""
    return torch.arange(length, device=lengths.device)[None, :] < lengths[:, None]


def resample(x: torch.Tensor, orig: int, new: int, width: int = 16, rolloff: float = 0.99
             ) -> torch.Tensor:
    """Windowed-sinc resampling of (N, T) from rate `orig` to rate `new` (integers, any unit)."""
    d = math.gcd(orig, new)
    orig, new = orig // d, new // d
    if orig == new:
        return x
    cutoff = min(orig, new) * rolloff
    pad = math.ceil(width * orig / cutoff)
    taps = torch.arange(-pad, pad + orig, device=x.device, dtype=x.dtype)[None, None] / orig
    t = (torch.arange(0, -new, -1, device=x.device, dtype=x.dtype)[:, None, None] / new + taps)
    t = (t * cutoff).clamp(-width, width)
    window = torch.cos(t * math.pi / width / 2) ** 2
    t = t * math.pi
    kernels = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t) * window * (cutoff / orig)
    y = F.conv1d(F.pad(x[:, None], (pad, pad + orig)), kernels, stride=orig)
    return y.transpose(1, 2).reshape(x.shape[0], -1)[:, :math.ceil(new * x.shape[1] / orig)]


def speed_perturb(x: torch.Tensor, lengths: torch.Tensor, factors: torch.Tensor,
                  apply: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Play utterances `factors` times faster (pitch moves too), factors rounded to 0.01."""
    steps = torch.where(apply, (factors * 100).round(), torch.full_like(factors, 100)).long()
    new_lengths = torch.ceil(lengths * 100 / steps).long()
    out = x.new_zeros(x.shape[0], int(new_lengths.max()))
    for step in steps.unique().tolist():
        rows = (steps == step).nonzero().squeeze(1)
        y = resample(x[rows], step, 100)
        out[rows, :min(y.shape[1], out.shape[1])] = y[:, :out.shape[1]]
    return out * valid_mask(new_lengths, out.shape[1]), new_lengths


def room_impulse(rt60: torch.Tensor, drr_db: torch.Tensor, generator: torch.Generator,
                 sample_rate: int) -> torch.Tensor:
    """(B, L) impulse responses: a direct path then exponentially decaying noise of the given RT60."""
    length = int(rt60.max() * sample_rate) + 1
    t = torch.arange(length, device=rt60.device, dtype=rt60.dtype)[None] / sample_rate
    tail = torch.randn(rt60.shape[0], length, generator=generator, device=rt60.device)
    tail = tail * torch.exp(-3 * math.log(10) * t / rt60[:, None])
    tail[:, 0] = 0
    tail = tail / tail.norm(dim=1, keepdim=True) * 10 ** (-drr_db[:, None] / 20)
    tail[:, 0] = 1
    return tail


def reverberate(x: torch.Tensor, lengths: torch.Tensor, rt60: torch.Tensor, drr_db: torch.Tensor,
                apply: torch.Tensor, generator: torch.Generator, sample_rate: int) -> torch.Tensor:
    """Convolve the chosen utterances with synthetic room responses, keeping their RMS level."""
    rows = apply.nonzero().squeeze(1)
    rir = room_impulse(rt60, drr_db, generator, sample_rate)[rows]
    if rows.numel() == 0:
        return x
    src = x[rows]
    n = 1 << (src.shape[1] + rir.shape[1] - 1).bit_length()
    wet = torch.fft.irfft(torch.fft.rfft(src, n) * torch.fft.rfft(rir, n), n)[:, :src.shape[1]]
    wet = wet * valid_mask(lengths[rows], src.shape[1])
    wet = wet * (_rms(src, lengths[rows]) / _rms(wet, lengths[rows]).clamp_min(1e-8))[:, None]
    out = x.clone()
    out[rows] = wet
    return out


def pink_noise(shape: tuple[int, int], generator: torch.Generator, device: torch.device
               ) -> torch.Tensor:
    """Noise with a 1/f power spectrum."""
    spec = torch.fft.rfft(torch.randn(shape, generator=generator, device=device))
    f = torch.arange(spec.shape[1], device=device).clamp_min(1)
    spec = spec / f.sqrt()
    spec[:, 0] = 0
    return torch.fft.irfft(spec, shape[1])


def add_noise(x: torch.Tensor, lengths: torch.Tensor, snr_db: torch.Tensor, kind: torch.Tensor,
              apply: torch.Tensor, generator: torch.Generator, babble_voices: int) -> torch.Tensor:
    """Add white (kind 0), pink (1) or babble (2: other utterances of the batch) noise at an SNR."""
    white = torch.randn(x.shape, generator=generator, device=x.device)
    pink = pink_noise((x.shape[0], x.shape[1]), generator, x.device)
    if x.shape[0] > 1:
        babble = sum(torch.roll(x, s, dims=0) for s in range(1, babble_voices + 1))
    else:
        babble = pink
    noise = torch.where((kind == 0)[:, None], white, torch.where((kind == 1)[:, None], pink, babble))
    noise = noise * valid_mask(lengths, x.shape[1])
    scale = _rms(x, lengths) / _rms(noise, lengths).clamp_min(1e-8) * 10 ** (-snr_db / 20)
    return x + noise * (scale * apply)[:, None]


def band_limit(x: torch.Tensor, lengths: torch.Tensor, apply: torch.Tensor,
               band: tuple[float, float], sample_rate: int) -> torch.Tensor:
    """Keep only `band` (Hz) of the chosen utterances: a telephone-like channel."""
    rows = apply.nonzero().squeeze(1)
    if rows.numel() == 0:
        return x
    spec = torch.fft.rfft(x[rows])
    freqs = torch.fft.rfftfreq(x.shape[1], 1 / sample_rate).to(x.device)
    spec = spec * ((freqs >= band[0]) & (freqs <= band[1]))
    out = x.clone()
    out[rows] = torch.fft.irfft(spec, x.shape[1]) * valid_mask(lengths[rows], x.shape[1])
    return out


def mulaw_code(x: torch.Tensor, apply: torch.Tensor, mu: float = 255.0) -> torch.Tensor:
    """Round the chosen utterances through 8-bit G.711-style mu-law companding (the telephone codec)."""
    y = x.clamp(-1, 1)
    q = torch.sign(y) * torch.log1p(mu * y.abs()) / math.log1p(mu)
    q = torch.round(q * 127) / 127
    coded = torch.sign(q) * ((1 + mu) ** q.abs() - 1) / mu
    return torch.where(apply[:, None], coded, x)


NONSPEECH_KINDS = ("silence", "white", "pink", "hum", "tone", "clicks", "breath")


def nonspeech(x: torch.Tensor, lengths: torch.Tensor, apply: torch.Tensor, generator: torch.Generator,
              sample_rate: int = 16000) -> torch.Tensor:
    """Replace the chosen rows of (B, T) by non-speech of their length: digital silence, white or
    pink room noise, mains hum (50/60 Hz and harmonics), a tone or beeps, clicks, or breath-like
    noise bursts, each at a random level from -75 to -15 dBFS (silence: none)."""
    rows = apply.nonzero().squeeze(1)
    if rows.numel() == 0:
        return x
    out = x.clone()
    out[rows] = _nonspeech_sounds(lengths[rows], x.shape[1], generator, sample_rate).to(x.dtype)
    return out


def _nonspeech_sounds(lengths: torch.Tensor, t: int, g: torch.Generator, sample_rate: int) -> torch.Tensor:
    """(N, T) non-speech signals for utterances of `lengths` (N,); see `nonspeech`."""
    b, dev = lengths.shape[0], lengths.device
    kind = torch.randint(0, len(NONSPEECH_KINDS), (b,), generator=g, device=dev)
    time = torch.arange(t, device=dev, dtype=torch.float32)[None] / sample_rate
    phase = 2 * math.pi * torch.rand(b, 1, generator=g, device=dev)
    white = torch.randn(b, t, generator=g, device=dev)
    pink = pink_noise((b, t), g, dev)
    mains = torch.where(torch.rand(b, 1, generator=g, device=dev) < 0.5, 50.0, 60.0)
    hum = sum(torch.sin(2 * math.pi * mains * k * time + phase * k) / k for k in (1, 2, 3, 5))
    freq = 100 * 40 ** torch.rand(b, 1, generator=g, device=dev)  # 100 Hz .. 4 kHz, log-uniform
    beeping = torch.rand(b, 1, generator=g, device=dev) < 0.5
    gate = torch.where(beeping, (torch.sin(2 * math.pi * 2 * time + phase) > 0).float(), 1.0)
    tone = torch.sin(2 * math.pi * freq * time + phase) * gate
    clicks = (torch.rand(b, t, generator=g, device=dev) < 4 / sample_rate) * torch.sign(white)
    decay = torch.exp(-torch.arange(32.0, device=dev) / 4).flip(0)[None, None]
    clicks = F.conv1d(clicks[:, None], decay, padding=31)[:, 0, :t]
    envelope = torch.sin((math.pi * 0.4 * time + phase / 2) % math.pi) ** 2  # a breath every 2.5 s
    breath = band_limit(white, lengths, torch.ones(b, dtype=torch.bool, device=dev), (500.0, 3000.0),
                        sample_rate) * envelope
    sounds = torch.stack([torch.zeros_like(white), white, pink, hum, tone, clicks, breath])  # (K, N, T)
    sound = sounds[kind, torch.arange(b, device=dev)]
    level = 10 ** (_uniform(g, white, (-75.0, -15.0)) / 20)
    sound = sound / _rms(sound, lengths).clamp_min(1e-8)[:, None] * level[:, None]
    return (sound * valid_mask(lengths, t)).clamp(-1, 1)


def random_gain(x: torch.Tensor, gain_db: torch.Tensor, apply: torch.Tensor) -> torch.Tensor:
    """Scale the chosen utterances by `gain_db`, clipping at full scale."""
    gain = torch.where(apply, 10 ** (gain_db / 20), torch.ones_like(gain_db))
    return (x * gain[:, None]).clamp(-1, 1)


def _rms(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return ((x ** 2).sum(dim=1) / lengths.clamp_min(1)).sqrt()


def _uniform(g: torch.Generator, x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    lo, hi = bounds
    return lo + (hi - lo) * torch.rand(x.shape[0], generator=g, device=x.device)


def _chance(g: torch.Generator, x: torch.Tensor, p: float) -> torch.Tensor:
    return torch.rand(x.shape[0], generator=g, device=x.device) < p
