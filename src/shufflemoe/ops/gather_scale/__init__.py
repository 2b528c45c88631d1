"""GatherMul: xs[i] = x[token_ids[i]] * weights[i] (optionally fused fp8 quantization, one scale a
row or a 128-column group)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import (INDEX_DTYPES, check_num_valid, check_positions, check_same_device,
                        check_tensor)
from .._impl import ops_for, resolve
from ..quantize import FP8_BLOCK, FP8_DTYPE
from ..quantize.reference import QUANTIZE_MODES

X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def gather_scale(
    x: Tensor,
    token_ids: Tensor,
    weights: Tensor | None = None,
    *,
    num_valid: Tensor | None = None,
    quantize: bool | str = False,
    out: Tensor | tuple[Tensor, Tensor] | None = None,
    positions: Tensor | None = None,
    impl: str | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """x [T, D], token_ids [A], weights [A] float32 or None -> xs [A, D] in x's dtype, or with
    quantize=True / "rowwise" (q [A, D] float8_e4m3fn, scale [A] float32), or with "groups" (q,
    scale [A, ceil(D / 128)]: fp8_block's activations, each 128-column group of the row xs
    would hold quantized with its own scale). Rows at or past num_valid [1] are neither read
    nor written.

    positions [A = T * k] int32/int64 (Routing.positions: token t's j-th pair is output row
    positions[t * k + j]) lets the kernel read each token's row once and write its k rows
    (token-major, at 1 < k <= 16: unquantized, and fp8 rowwise with one amax a token for rows
    up to 16384 long at k >= 8 or where x's bytes times k exceed twice the L2; "groups" stays
    row-major). The result is the same. token_ids must be its inverse (token_ids[positions[t *
    k + j]] == t, as in a Routing); positions is checked for shape only."""
    mode = QUANTIZE_MODES.get(quantize)
    if mode is None:
        raise ValueError(f"quantize must be one of {list(QUANTIZE_MODES)}, got {quantize!r}")
    check_tensor("x", x, dim=2, dtypes=X_DTYPES, contiguous=True)
    check_tensor("token_ids", token_ids, dim=1, dtypes=INDEX_DTYPES)
    A, D = token_ids.shape[0], x.shape[1]
    if weights is not None:
        check_tensor("weights", weights, shape=[A], dtypes=(torch.float32,))
    if positions is not None:
        check_positions(positions, A, x.shape[0])
    dev = check_same_device(x=x, token_ids=token_ids, weights=weights, num_valid=num_valid,
                            positions=positions)
    check_num_valid(num_valid, dev)
    if out is not None:
        if mode != "none":
            if not isinstance(out, tuple) or len(out) != 2:
                raise TypeError(f"out must be a (q, scale) tuple when quantize={quantize!r}")
            check_tensor("out[0]", out[0], shape=[A, D], dtypes=(FP8_DTYPE,), device=dev,
                         contiguous=True)
            check_tensor("out[1]", out[1], shape=[A] if mode == "rowwise" else
                         [A, -(-D // FP8_BLOCK)], dtypes=(torch.float32,), device=dev,
                         contiguous=True)
        else:
            check_tensor("out", out, shape=[A, D], dtypes=(x.dtype,), device=dev, contiguous=True)
    return ops_for(resolve(impl, x)).gather_scale(x, token_ids, weights, num_valid, quantize, out,
                                                  positions)


__all__ = ["gather_scale"]
