"""Helpers shared by the op references."""

from __future__ import annotations

import torch
from torch import Tensor


def valid_rows(n_rows: int, num_valid: Tensor | None, device: torch.device) -> Tensor | None:
    """[n_rows] bool mask of rows below num_valid (None when every row is valid)."""
    if num_valid is None:
        return None
    return torch.arange(n_rows, device=device) < num_valid.to(torch.long)


def store_rows(out: Tensor | None, new: Tensor, num_valid: Tensor | None) -> Tensor:
    """Write ``new`` into ``out`` (allocated when None), leaving rows past num_valid untouched."""
    if out is None:
        out = torch.empty_like(new)
    mask = valid_rows(new.shape[0], num_valid, new.device)
    if mask is None:
        return out.copy_(new)
    shape = (-1,) + (1,) * (new.dim() - 1)
    # float8 has no where(); move the bytes instead, the values are already rounded.
    if new.dtype == torch.float8_e4m3fn:
        return out.view(torch.uint8).copy_(
            torch.where(mask.view(shape), new.view(torch.uint8), out.view(torch.uint8))
        ).view(new.dtype)
    return out.copy_(torch.where(mask.view(shape), new, out))
