"""Where the model lives: device/dtype parsing and the one place that moves the model. The
device and dtype names and their aliases are the configuration's (`config.normalize_device`,
`config.normalize_dtype`)."""
from __future__ import annotations

from typing import cast

import torch

from streamd.config import TORCH_DTYPE_NAMES, normalize_device, normalize_dtype
from streamd.model.transducer import Transducer

DTYPE_NAMES = {getattr(torch, torch_name): name for name, torch_name in TORCH_DTYPE_NAMES.items()}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in DTYPE_NAMES:
            raise ValueError(f"unsupported dtype {name}")
        return name
    return cast(torch.dtype, getattr(torch, TORCH_DTYPE_NAMES[normalize_dtype(name)]))


def parse_device(name: str) -> torch.device:
    """A device name as the configuration takes it (`config.normalize_device`: auto, cpu, cuda,
    cuda:N; 'auto' is cuda:0 if available, else cpu) as a torch.device. Checks the device exists."""
    device = normalize_device(name)
    if device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available on this machine")
    index = int(device.removeprefix("cuda:"))
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def exact_fp32() -> None:
    """Make fp32 mean fp32 on a GPU too, process-wide: torch lets cuDNN convolutions (the
    subsampling and the conformer's convolution modules) compute in TF32, 10 bits of mantissa, by
    default. With it an fp32 model's tokens differ between a GPU and the CPU (a live move between
    them changes a stream's words) and from NeMo's reference run with TF32 off. bf16 and fp16
    are the fast placements; fp32 is the exact one. Matmuls already default to full fp32."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def move_model(model: Transducer, device: torch.device, dtype: torch.dtype) -> None:
    """Move and cast the model in place. The features' window and filterbank stay fp32 (the
    front end always computes in fp32, on the CPU for live streams). On the CPU the subsampling
    convolutions keep their weights channels-last, which halves their time there (oneDNN). A
    model placed on a GPU turns TF32 off for the process (`exact_fp32`)."""
    if device.type == "cuda":
        exact_fp32()
    model.to(device=device, dtype=dtype)
    model.preprocessor.float()
    conv_format = torch.channels_last if device.type == "cpu" else torch.contiguous_format
    model.encoder.pre_encode.conv.to(memory_format=conv_format)  # type: ignore[call-overload]  # torch's stub lacks it
