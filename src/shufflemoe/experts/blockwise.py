"""Blockwise matmul (the Neuron guide's BWMM): pairs are placed in blocks of ``block_size`` rows,
one expert per block, N = ceil(A / B) + E - 1 blocks provisioned statically (enough for any
routing, dropless). Each expert's rows are padded to whole blocks; blocks past the last used one
are skipped by the grouped GEMM (its sizes are on the device), and consecutive blocks of one
expert reuse its weights. Static shapes, no host sync."""

from __future__ import annotations

import math

import torch

from ..ops import backend_for
from .base import Experts, expert_gemm, gather_input, glu, register


def num_blocks(num_pairs: int, num_experts: int, block_size: int) -> int:
    """Blocks a dropless BWMM provisions: ceil(A / B) + E - 1 (0 when there are no pairs)."""
    return math.ceil(num_pairs / block_size) + num_experts - 1 if num_pairs else 0


@register
class Blockwise(Experts):
    name = "blockwise"
    summary = "fixed-size blocks, one expert each, padded blocks skipped (no sync)"

    def forward(self, x, routing, weights, out, cfg, before_combine=lambda: None):
        r, w, B = routing, weights, cfg.block_size
        E, A = r.num_experts, r.num_pairs
        N = num_blocks(A, E, B)
        if N == 0:
            return
        dev, ops = x.device, backend_for(x)
        blocks = (r.counts.long() + B - 1) // B  # [E] blocks per expert
        first_row = (blocks.cumsum(0) - blocks) * B  # [E] first row of expert e's blocks
        e = r.expert_ids.long().clamp(0, E - 1)
        rank = torch.arange(A, device=dev) - r.offsets()[e]
        row = torch.where(r.valid_mask(), first_row[e] + rank, N * B)  # [A]; dropped -> spare
        # Padding rows keep token 0 and weight 0: as input weights they make zero rows (SwiGLU of
        # zero is zero), as output weights they add nothing.
        row_token = torch.zeros(N * B + 1, dtype=torch.int32, device=dev)
        row_token = row_token.index_copy_(0, row, r.token_ids)[: N * B]
        on_input = cfg.apply_router_weight_on_input
        row_weight = None
        if on_input:
            row_weight = torch.zeros(N * B + 1, dtype=torch.float32, device=dev)
            row_weight = row_weight.index_copy_(0, row, r.weights)[: N * B]
        sizes = (blocks * B).int()  # whole blocks per expert
        used = sizes.sum().reshape(1)
        xb = gather_input(ops, x, row_token, row_weight, w, num_valid=used)
        hb = expert_gemm(ops, xb, w, "w13", sizes, cfg.dtype)  # [N * B, 2I]
        ab = glu(ops, hb, w, cfg, num_valid=used)
        yb = expert_gemm(ops, ab, w, "w2", sizes, cfg.dtype)  # [N * B, D]
        before_combine()  # pair p's row is row[p]
        ops.token_sum(out, yb, r.positions, None if on_input else r.weights, r.num_valid, row)
