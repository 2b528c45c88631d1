"""Helpers shared by the op references."""

from __future__ import annotations

import torch
from torch import Tensor


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

