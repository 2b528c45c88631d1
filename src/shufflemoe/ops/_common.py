"""Helpers shared by the ops: row masks for the references, launch arithmetic for the kernels."""

from __future__ import annotations

import contextlib
import functools

from typing import Sequence

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor


def valid_rows(n_rows: int, num_valid: Tensor | None, device: torch.device) -> Tensor | None:
    """[n_rows] bool mask of rows below num_valid (None when every row is valid)."""
    if num_valid is None:
        return None
    return torch.arange(n_rows, device=device) < num_valid


def store_rows(out: Tensor, new: Tensor, num_valid: Tensor | None) -> None:
    """out[r] = new[r] rounded to out's dtype for rows r < num_valid (every row when None); the
    other rows of ``out`` keep their values."""
    mask = valid_rows(new.shape[0], num_valid, new.device)
    if mask is None:
        out.copy_(new)
        return
    shape = (-1,) + (1,) * (new.dim() - 1)
    # float8 has no where(); move the bytes instead, the values are already rounded.
    if new.dtype == torch.float8_e4m3fn:
        out.view(torch.uint8).copy_(
            torch.where(mask.view(shape), new.view(torch.uint8), out.view(torch.uint8)))
        return
    out.copy_(torch.where(mask.view(shape), new, out))



# Host-side launch arithmetic. triton.cdiv and triton.next_power_of_2 are constexpr functions in
# Triton 3.6: called from Python each goes through a wrapper that unwraps its arguments (~2 us
# on an H100 host; a decode block made ~21 such calls). These are the same functions in plain
# Python, for launchers; kernels keep tl.cdiv.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n (0 for n = 0, as triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.cache
def _properties(index: int):
    return torch.cuda.get_device_properties(index)


def _cuda_properties(device: torch.device):
    """The properties of a CUDA device (the current one when ``device`` has no index), read
    once."""
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def device_sms(device: torch.device) -> int:
    """The SMs of a CUDA device (the current one when ``device`` has no index)."""
    return _cuda_properties(device).multi_processor_count


def device_l2_bytes(device: torch.device) -> int:
    """The L2 cache of a CUDA device in bytes; 50 MB (an H100's) for any other device (the
    interpreter), so that launch choices do not depend on where CI runs."""
    return _cuda_properties(device).L2_cache_size if device.type == "cuda" else 50 << 20


@torch._dynamo.assume_constant_result
def device_name(device: torch.device) -> str:
    """A CUDA device's name (the current one when ``device`` has no index); "" for any other
    device. A constant to torch.compile."""
    return _cuda_properties(device).name if device.type == "cuda" else ""


_CURRENT = contextlib.nullcontext()
_TRACED = (FakeTensor, FunctionalTensor)


def traced(args: Sequence) -> bool:
    """Whether the first tensor of ``args`` is torch.compile's stand-in (a fake or functional
    tensor): a launcher is being traced into the graph (ops/_impl.py), nothing runs."""
    for a in args:
        if isinstance(a, Tensor):
            return isinstance(a, _TRACED)
    return False


def on_device(t: Tensor):
    """A context making t's CUDA device current for a launch: nothing to do in the common case
    where it already is (torch.cuda.device costs a few us of host time per launch) or for a CPU
    tensor (the interpreter). Traced, nothing: the compiled code places its launches."""
    if not t.is_cuda or isinstance(t, _TRACED) or t.get_device() == torch.cuda.current_device():
        return _CURRENT
    return torch.cuda.device(t.device)
