"""A persisting L2 access-policy window over some tensors, set through the CUDA runtime torch loaded
(ctypes: torch has no API for it). Fault injection for the adversarial family's `persisting_l2` backend.

Facts (CUDA runtime API, CUDA 11+): cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize = 0x06) sets L2
aside for persisting accesses, at most cudaDevAttrMaxPersistingL2CacheSize (108) and a window at most
cudaDevAttrMaxAccessPolicyWindowSize (109) bytes; a stream's access-policy
window (cudaStreamSetAttribute, cudaStreamAttributeAccessPolicyWindow = 1) marks accesses to
[base_ptr, base_ptr + num_bytes) with hitProp cudaAccessPropertyPersisting (2) for hitRatio of them, and
missProp cudaAccessPropertyStreaming (1) for the rest."""

from __future__ import annotations

import ctypes

import torch

from kernels.measure.cuda_layer import CUDA_LIMIT_PERSISTING_L2, cudart

STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
ATTR_MAX_PERSISTING_L2, ATTR_MAX_WINDOW = 108, 109
ACCESS_PERSISTING, ACCESS_STREAMING = 2, 1


class _Window(ctypes.Structure):
    _fields_ = [
        ("base_ptr", ctypes.c_void_p),
        ("num_bytes", ctypes.c_size_t),
        ("hit_ratio", ctypes.c_float),
        ("hit_prop", ctypes.c_int),
        ("miss_prop", ctypes.c_int),
    ]


class _AttrValue(ctypes.Union):  # cudaStreamAttrValue: the window, padded past the union's largest member
    _fields_ = [("window", _Window), ("pad", ctypes.c_byte * 64)]


def keep_in_l2(*tensors: torch.Tensor) -> None:
    """Set aside as much L2 as the device allows for persisting accesses and put a persisting window over
    the largest of `tensors` on the current stream."""
    rt = cudart()
    if rt is None:
        raise RuntimeError("no CUDA runtime loaded in this process")
    device = tensors[0].device.index or 0
    aside, window = ctypes.c_int(0), ctypes.c_int(0)
    rt.cudaDeviceGetAttribute(ctypes.byref(aside), ATTR_MAX_PERSISTING_L2, device)
    rt.cudaDeviceGetAttribute(ctypes.byref(window), ATTR_MAX_WINDOW, device)
    if aside.value <= 0:
        raise RuntimeError("this GPU sets no L2 aside for persisting accesses")
    if rt.cudaDeviceSetLimit(CUDA_LIMIT_PERSISTING_L2, ctypes.c_size_t(aside.value)) != 0:
        raise RuntimeError("cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize) failed")
    big = max(tensors, key=lambda t: t.numel() * t.element_size())
    value = _AttrValue()
    nbytes = min(big.numel() * big.element_size(), aside.value, window.value)
    value.window = _Window(big.data_ptr(), nbytes, 1.0, ACCESS_PERSISTING, ACCESS_STREAMING)
    stream = ctypes.c_void_p(torch.cuda.current_stream(big.device).cuda_stream)
    if rt.cudaStreamSetAttribute(stream, STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, ctypes.byref(value)) != 0:
        raise RuntimeError("cudaStreamSetAttribute(access policy window) failed")
