"""ScatterAdd: combine routed outputs into the token-major output without unshuffling.

out[token_ids[i]] += y[rows[i]] * weights[i] for every pair i < num_valid. ``rows`` (default:
i) is the padded form used by expert parallelism, where pair i's output sits at another row.
With ``positions`` (Routing.positions, the inverse of the pair order) the sum is token-major:
out[t] += sum over j of y[rows[p]] * weights[p], p = positions[t * k + j] < num_valid, in
ascending p, in float32 with one rounding: no atomics, deterministic, the reference's result bit
for bit. Every expert strategy combines this way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._checks import (INDEX_DTYPES, check_num_valid, check_positions, check_same_device,
                        check_tensor)
from .._impl import ops_for, resolve

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def scatter_add(
    out: Tensor,
    y: Tensor,
    token_ids: Tensor,
    weights: Tensor | None = None,
    *,
    num_valid: Tensor | None = None,
    rows: Tensor | None = None,
    positions: Tensor | None = None,
    impl: str | None = None,
) -> Tensor:
    """out [T, D] (added to in place and returned), y [R, D], token_ids [A], weights [A] float32
    or None, rows [A] or None (then R >= A and pair i reads row i), positions [A = T * k]
    int32/int64 or None. Only rows of valid pairs are read.

    With positions, token t's pairs are found through positions: token_ids must be their
    inverse (token_ids[positions[t * k + j]] == t, as in a Routing), is checked for shape only
    and its values are not read."""
    check_tensor("out", out, dim=2, dtypes=DTYPES, contiguous=True)
    check_tensor("y", y, dim=2, dtypes=DTYPES, contiguous=True)
    check_tensor("token_ids", token_ids, dim=1, dtypes=INDEX_DTYPES)
    A = token_ids.shape[0]
    if y.shape[1] != out.shape[1]:
        raise ValueError(f"y must have out's {out.shape[1]} columns, got shape {list(y.shape)}")
    if weights is not None:
        check_tensor("weights", weights, shape=[A], dtypes=(torch.float32,))
    if rows is not None:
        check_tensor("rows", rows, shape=[A], dtypes=INDEX_DTYPES)
    elif y.shape[0] < A:
        raise ValueError(f"y must have at least A={A} rows when rows is None, got {y.shape[0]}")
    if positions is not None:
        check_positions(positions, A, out.shape[0])
    dev = check_same_device(out=out, y=y, token_ids=token_ids, weights=weights, rows=rows,
                            num_valid=num_valid, positions=positions)
    check_num_valid(num_valid, dev)
    ops = ops_for(resolve(impl, out))
    if positions is not None:
        return ops.token_sum(out, y, positions, weights, num_valid, rows)
    return ops.scatter_add(out, y, token_ids, weights, num_valid, rows)


__all__ = ["scatter_add"]
