"""CUDA graph capture that other threads' CUDA work cannot break, and that cannot poison the next.

Two threads of the daemon use CUDA: the engine thread (steps, and the captures of graphs for new
batch sizes) and a migration's preparation (the target's copy, probe and graphs, on a worker
thread). A capture runs in "thread_local" mode, so the other thread may launch and copy meanwhile;
but a device-wide synchronize or `empty_cache` (which `torch.cuda.graph` itself does before it
captures) while another thread captures invalidates that capture ("operation not permitted when
stream is capturing"). `DEVICE_LOCK` is held around every capture and every such call of streamd.

A capture that fails can leave the caching allocator recording to the capture's memory pool (some
torch versions skip `endAllocateToPool` when `cudaStreamEndCapture` fails), and every later
capture into that pool then fails with "beginAllocateToPool: already recording to mempool_id".
`capture` ends the recording itself on failure, and puts the caller's stream back.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

DEVICE_LOCK = threading.RLock()


def capture(graph: Any, fn: Callable[[], None], device: torch.device, pool: Any, stream: Any) -> None:
    """Capture `fn` into `graph` on `stream` (of `device`) with memory from `pool`, holding
    `DEVICE_LOCK`. Raises what the capture raised, after ending the pool's recording."""
    with DEVICE_LOCK, torch.cuda.device(device):
        caller = torch.cuda.current_stream(device)
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                fn()
        except BaseException:
            end_recording(device, pool)
            raise
        finally:
            torch.cuda.set_stream(caller)


def end_recording(device: torch.device, pool: Any) -> bool:
    """Stop the allocator recording to `pool` on `device` after a failed capture; False when it
    was not recording (torch already ended it)."""
    if pool is None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    end = getattr(torch._C, "_cuda_endAllocateToPool", None) or torch._C._cuda_endAllocateCurrentStreamToPool  # older torch
    try:
        end(index, pool)
    except RuntimeError:  # "not currently recording to mempool_id"
        return False
    return True


def synchronize_and_free(device: torch.device) -> None:
    """Wait for `device` and give its cached free memory back to the driver (never during a capture)."""
    if device.type != "cuda":
        return
    with DEVICE_LOCK:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
