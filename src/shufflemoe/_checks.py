"""Argument checks shared by the public functions: a bad input raises and names the argument."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(
    name: str,
    t: object,
    *,
    dim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
    shape: Sequence[int | None] | None = None,
    contiguous: bool = False,
) -> Tensor:
    """Raise TypeError/ValueError naming ``name`` unless ``t`` is a tensor as described.

    ``shape`` entries that are None are not checked.
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t


def check_same_device(**tensors: Tensor | None) -> torch.device:
    """All given (non-None) tensors live on one device; returns it."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first = next(iter(devices.values()))
    for name, dev in devices.items():
        if dev != first:
            others = ", ".join(f"{n}={d}" for n, d in devices.items())
            raise ValueError(f"{name} is on {dev} but the other arguments are not ({others})")
    return first


def check_num_valid(num_valid: Tensor | None, device: torch.device) -> None:
    if num_valid is not None:
        check_tensor("num_valid", num_valid, shape=[1], dtypes=INDEX_DTYPES, device=device)


def check_positions(positions: Tensor, A: int, T: int) -> None:
    """positions [A = T * k]: Routing.positions of T tokens' pairs."""
    check_tensor("positions", positions, shape=[A], dtypes=INDEX_DTYPES, contiguous=True)
    if A % max(T, 1) or (T == 0 and A):
        raise ValueError(f"positions must have T * k entries for T={T} tokens, got {A}")
