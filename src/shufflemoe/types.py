"""The small typed results passed between the parts of an MoE layer."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor


@dataclass(frozen=True)
class Routing:
    """Token-expert pairs sorted by expert: the output of MetaShuffling's IndexShuffling.

    A = T * k pairs (static). The first ``num_valid`` pairs are routed, expert-major, and within one
    expert in ascending token order, so results do not depend on batch composition. Pairs past
    ``num_valid`` (dropped by the capacity factor, or not routed to this rank's experts) hold
    in-range token ids and must not contribute. Nothing here was copied to the host.
    ``positions`` is the inverse permutation: it lets a token-major kernel find a token's k pairs
    (scatter_add(positions=...): one store per output row, no atomics).
    """

    counts: Tensor  # [E] int32: routed pairs per expert (after capacity dropping)
    token_ids: Tensor  # [A] int32: source token of each pair, always in [0, T)
    expert_ids: Tensor  # [A] int32: expert of each pair (meaningful for the first num_valid)
    weights: Tensor  # [A] float32: routing weight of each pair (after renormalize and scaling)
    num_valid: Tensor  # [1] int32: sum(counts), the number of routed pairs
    # [A] int32: where pair (t, j) (token t's j-th choice) sits in the sorted order, so
    # token_ids[positions[t * k + j]] == t; a permutation of 0..A-1. Pairs not routed (dropped
    # by capacity, or not on this rank's experts) point at positions >= num_valid.
    positions: Tensor

    @property
    def num_experts(self) -> int:
        return self.counts.shape[0]

    @property
    def num_pairs(self) -> int:
        return self.token_ids.shape[0]

    def offsets(self) -> Tensor:
        """[E + 1] int64 exclusive prefix sum of counts: pairs of expert e are offsets[e]:offsets[e+1]."""
        return torch.nn.functional.pad(self.counts.long().cumsum(0), (1, 0))

    def valid_mask(self) -> Tensor:
        """[A] bool: which pairs are routed."""
        idx = torch.arange(self.num_pairs, device=self.token_ids.device)
        return idx < self.num_valid.to(idx.dtype)

    def dense_weights(self, num_tokens: int) -> Tensor:
        """[T, E] float32 routing weights, zero where a token is not routed to an expert."""
        dense = torch.zeros(
            num_tokens, self.num_experts, dtype=torch.float32, device=self.weights.device
        )
        w = torch.where(self.valid_mask(), self.weights, 0.0)
        experts = self.expert_ids.long().clamp(0, self.num_experts - 1)
        return dense.index_put_((self.token_ids.long(), experts), w, accumulate=True)


@dataclass(frozen=True)
class ExpertWeights:
    """Routed expert weights in the canonical layout (HF transformers 5.x / vLLM), stored in the
    format ``quantization`` (ops/quantize/formats.py): e.g. fp8_rowwise float8_e4m3fn with one
    float32 scale per output row, fp8_block with one per 128 x 128 block (w13's blocks restart at
    its up half), mxfp4 two e2m1 a byte ([E, N, K/2] uint8) with e8m0 scales [E, N, K/32]."""

    w13: Tensor  # [E, 2I, D]: gate rows then up rows (mxfp4: [E, 2I, D/2] bytes)
    w2: Tensor  # [E, D, I] (mxfp4: [E, D, I/2])
    w13_scale: Tensor | None = None  # fp8_rowwise/fp8_w8a16 [E, 2I] float32; see the formats
    w2_scale: Tensor | None = None  # fp8_rowwise/fp8_w8a16 [E, D] float32
    w13_bias: Tensor | None = None  # [E, 2I], added after the first GEMM (gpt-oss)
    w2_bias: Tensor | None = None  # [E, D], added after the second GEMM, before the routing weight
    quantization: str = "none"

    def __post_init__(self) -> None:
        if (self.w13_scale is None) != (self.quantization == "none"):
            raise ValueError(f"ExpertWeights: quantization={self.quantization!r} "
                             f"{'needs' if self.w13_scale is None else 'takes no'} scales")

    @property
    def quantized(self) -> bool:
        return self.quantization != "none"

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def intermediate_size(self) -> int:
        return self.w13.shape[1] // 2

    @property
    def hidden_size(self) -> int:
        return self.w2.shape[1]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def experts(self, start: int, stop: int) -> ExpertWeights:
        """Experts [start, stop) of every tensor (views)."""
        return replace(self, **{f.name: getattr(self, f.name)[start:stop] for f in fields(self)
                                if isinstance(getattr(self, f.name), Tensor)})

    def _tensors(self) -> list[Tensor]:
        return [t for t in (self.w13, self.w2, self.w13_scale, self.w2_scale, self.w13_bias,
                            self.w2_bias) if t is not None]
