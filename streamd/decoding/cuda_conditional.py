"""The label-looping decode as one CUDA graph with conditional WHILE nodes (cuda-python).

The four step graphs captured by PyTorch (`before_outer`, `before_inner`, `inner`,
`after_inner`, captured with ``keep_graph=True``) become child-graph nodes of a graph built
with the driver API::

    before_outer -> set(outer, active_any) -> WHILE outer {
        before_inner -> set(inner, advance_any) -> WHILE inner {
            inner -> set(inner, advance_any) }
        -> after_inner -> set(outer, active_any) }

`set` is a one-thread kernel compiled with NVRTC that copies a 0-dim bool device flag into the
loop's conditional handle (`cudaGraphSetConditional`). The whole decode is then one launch with
no host synchronisation. The step graphs keep owning their memory pool, so they must outlive
this graph (the caller keeps them).

Composing already-captured graphs (rather than capturing PyTorch ops straight into the loop
bodies, as NeMo does) keeps every tensor the loop bodies allocate inside PyTorch's private
graph pool: a capture into a body graph runs on a different capture sequence, which PyTorch's
allocator does not route to the graph's pool.

Needs the `cuda.bindings` layout of cuda-python (12.6 and later, 13.x) and a driver for CUDA
>= 12.6 (conditional nodes exist since 12.3, but LSTM kernels inside them need 12.6).
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from torch import Tensor

from streamd.cuda_capture import DEVICE_LOCK

MIN_DRIVER = 12060  # CUDA 12.6

_SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                       unsigned int value);

extern "C" __global__ void streamd_set_while_condition(cudaGraphConditionalHandle handle, const bool* flag)
{
    cudaGraphSetConditional(handle, flag[0] ? 1u : 0u);
}
"""
_KERNEL_NAME = b"streamd_set_while_condition"
_kernels: dict[tuple[int, int], Any] = {}  # (device index, context) -> CUfunction; modules stay loaded
_lock = threading.Lock()


def _bindings() -> tuple[Any, Any]:
    from cuda.bindings import driver, nvrtc  # cuda-python >= 12.6 layout (13.x has only this one)
    return driver, nvrtc


def unsupported_reason(device: torch.device) -> str | None:
    """Why conditional-node graphs cannot be built for `device`, or None if they can."""
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    if torch.version.hip:
        return "ROCm build of PyTorch"
    try:
        driver, _ = _bindings()
    except ImportError as e:
        return f"cuda-python's cuda.bindings is not importable ({e})"
    try:
        err, version = driver.cuDriverGetVersion()
    except Exception as e:  # noqa: BLE001 - a broken libcuda
        return f"cuDriverGetVersion failed ({e})"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuDriverGetVersion returned {err}"
    if version < MIN_DRIVER:
        return f"driver supports CUDA {version // 1000}.{version % 1000 // 10}; conditional nodes need 12.6"
    return None


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda-python (err, *values) tuple, raising on an error code."""
    driver, nvrtc = _bindings()
    err, *values = result if isinstance(result, tuple) else (result,)
    if isinstance(err, nvrtc.nvrtcResult):
        ok = err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    else:
        ok = err == driver.CUresult.CUDA_SUCCESS
    if not ok:
        name = err
        if isinstance(err, driver.CUresult):
            e2, s = driver.cuGetErrorName(err)
            name = s.decode() if e2 == driver.CUresult.CUDA_SUCCESS and s else err
        raise RuntimeError(f"{what} failed: {name}")
    return None if not values else values[0] if len(values) == 1 else tuple(values)


def _compile(device: torch.device) -> bytes:
    """The set-condition kernel as a CUBIN for this GPU's architecture (no driver JIT needed)."""
    _, nvrtc = _bindings()
    major, minor = torch.cuda.get_device_capability(device)
    prog = _check(nvrtc.nvrtcCreateProgram(_SOURCE.encode(), b"streamd_while.cu", 0, [], []),
                  "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture=sm_{major}{minor}".encode()]
        err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            buf = b" " * size
            _check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
            raise RuntimeError(f"NVRTC compile failed ({err}): {buf.decode(errors='replace')}")
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _current_context(device: torch.device) -> Any:
    driver, _ = _bindings()
    ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:  # runtime not yet bound on this thread: use the primary context
        ctx = _check(driver.cuDevicePrimaryCtxRetain(_check(driver.cuDeviceGet(device.index), "cuDeviceGet")),
                     "cuDevicePrimaryCtxRetain")
        _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def _kernel(device: torch.device, ctx: Any) -> Any:
    driver, _ = _bindings()
    key = (device.index, int(ctx))
    with _lock:
        if key not in _kernels:
            image = np.frombuffer(_compile(device), dtype=np.uint8).copy()
            module = _check(driver.cuModuleLoadData(image.ctypes.data), "cuModuleLoadData")
            _kernels[key] = _check(driver.cuModuleGetFunction(module, _KERNEL_NAME), "cuModuleGetFunction")
        return _kernels[key]


class WhileLoopGraph:
    """One executable graph running the two nested label-looping loops on the GPU.

    Args: device; graphs: the four step graphs (torch.cuda.CUDAGraph, keep_graph=True);
    active_any, advance_any: the 0-dim bool flags the steps write (outer and inner condition).
    Raises RuntimeError/ImportError when the driver or bindings cannot build it.
    """

    def __init__(self, device: torch.device, graphs: dict[str, Any], active_any: Tensor, advance_any: Tensor
                 ) -> None:
        driver, _ = _bindings()
        self.device = device
        self._graph = self._exec = None
        self._args: list[np.ndarray] = []  # kernel argument buffers, kept alive with the graph
        with torch.cuda.device(device):
            ctx = _current_context(device)
            func = _kernel(device, ctx)
            steps = {k: driver.CUgraph(int(g.raw_cuda_graph())) for k, g in graphs.items()}
            active, advance = active_any.data_ptr(), advance_any.data_ptr()

            self._graph = root = _check(driver.cuGraphCreate(0), "cuGraphCreate")
            outer = _check(driver.cuGraphConditionalHandleCreate(root, ctx, 0, 0), "cuGraphConditionalHandleCreate")
            n = self._child(root, [], steps["before_outer"])
            n = self._set(root, [n], func, outer, active)
            _, outer_body = self._while(root, [n], outer, ctx)

            inner = _check(driver.cuGraphConditionalHandleCreate(outer_body, ctx, 0, 0),
                           "cuGraphConditionalHandleCreate")
            n = self._child(outer_body, [], steps["before_inner"])
            n = self._set(outer_body, [n], func, inner, advance)
            n, inner_body = self._while(outer_body, [n], inner, ctx)
            n = self._child(outer_body, [n], steps["after_inner"])
            self._set(outer_body, [n], func, outer, active)

            n = self._child(inner_body, [], steps["inner"])
            self._set(inner_body, [n], func, inner, advance)

            self._exec = _check(driver.cuGraphInstantiate(root, 0), "cuGraphInstantiate")
            _check(driver.cuGraphUpload(self._exec, torch.cuda.current_stream(device).cuda_stream), "cuGraphUpload")

    # -- graph building ----------------------------------------------------------------------
    @staticmethod
    def _child(graph: Any, deps: list[Any], child: Any) -> Any:
        driver, _ = _bindings()
        return _check(driver.cuGraphAddChildGraphNode(graph, deps, len(deps), child), "cuGraphAddChildGraphNode")

    def _set(self, graph: Any, deps: list[Any], func: Any, handle: Any, flag_ptr: int) -> Any:
        """A 1x1 kernel node: handle <- *flag."""
        driver, _ = _bindings()
        values = np.array([int(handle), flag_ptr], dtype=np.uint64)
        pointers = np.array([values.ctypes.data, values.ctypes.data + values.itemsize], dtype=np.uint64)
        self._args += [values, pointers]
        p = driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = func
        p.gridDimX = p.gridDimY = p.gridDimZ = 1
        p.blockDimX = p.blockDimY = p.blockDimZ = 1
        p.sharedMemBytes = 0
        p.kernelParams = pointers.ctypes.data
        return _check(driver.cuGraphAddKernelNode(graph, deps, len(deps), p), "cuGraphAddKernelNode")

    @staticmethod
    def _while(graph: Any, deps: list[Any], handle: Any, ctx: Any) -> tuple[Any, Any]:
        """A WHILE conditional node; returns it and its (empty) body graph."""
        driver, _ = _bindings()
        p = driver.CUgraphNodeParams()
        p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        p.conditional.handle = handle
        p.conditional.type = driver.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
        p.conditional.size = 1
        p.conditional.ctx = ctx
        try:  # CUDA 13 bindings: (graph, deps, edge data, count, params)
            result = driver.cuGraphAddNode(graph, deps, None, len(deps), p)
        except TypeError:  # CUDA 12.x bindings: (graph, deps, count, params)
            result = driver.cuGraphAddNode(graph, deps, len(deps), p)
        node = _check(result, "cuGraphAddNode(conditional WHILE)")
        return node, p.conditional.phGraph_out[0]

    # -- use ---------------------------------------------------------------------------------
    def replay(self) -> None:
        """Launch on the current stream of the graph's device (asynchronous)."""
        driver, _ = _bindings()
        _check(driver.cuGraphLaunch(self._exec, torch.cuda.current_stream(self.device).cuda_stream), "cuGraphLaunch")

    def close(self) -> None:
        """Destroy the executable and the graph (after the device finished any launch)."""
        if self._exec is None and self._graph is None:
            return
        driver, _ = _bindings()
        with DEVICE_LOCK:  # not while another thread captures
            torch.cuda.synchronize(self.device)
        if self._exec is not None:
            driver.cuGraphExecDestroy(self._exec)
        if self._graph is not None:
            driver.cuGraphDestroy(self._graph)
        self._exec = self._graph = None
        self._args.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing left to release
            pass
