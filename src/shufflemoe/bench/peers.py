"""The MoE layers a user would run instead of shufflemoe, on the same weights, for the benchmarks:

- ``per_expert_loop``: the HuggingFace-style loop, one masked matmul pair per expert (host syncs);
- ``torch_pipeline``: the MetaShuffling pipeline written with stock torch ops (topk, a stable
  argsort, a scatter_add histogram, index_select, torch._grouped_mm / torch._scaled_grouped_mm,
  index_add_): sync-free, so it is timed eagerly, under a CUDA graph and torch.compile'd, each
  against ours issued the same way (fp8 with fast accumulation, as ours);
- ``hf_block``: transformers' own MoE block of the matching model (its experts implementation
  chosen by name), its parameters set to the layer's tensors.

Each takes x [T, D] and returns [T, D]; tests/bench/test_peers.py checks them against naive_moe.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layer import MoE
from ..ops.quantize.reference import quantize_fp8_rowwise


def _topk(layer: MoE, x: Tensor) -> tuple[Tensor, Tensor]:
    """Router -> (ids [T, k], weights [T, k] float32) with plain torch (topk and llama4 routers)."""
    cfg = layer.config
    if cfg.router not in ("topk", "llama4"):
        raise ValueError(f"the peers implement the topk and llama4 routers, not {cfg.router!r}")
    logits = F.linear(x, layer.router_weight).float()  # [T, E]
    if cfg.router == "llama4" or cfg.scoring == "sigmoid":
        top = logits.topk(cfg.top_k, dim=-1)
        weights = torch.sigmoid(top.values)
    else:
        top = torch.softmax(logits, dim=-1).topk(cfg.top_k, dim=-1)
        weights = top.values
    if cfg.renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return top.indices, weights * cfg.routed_scaling_factor


def _shared(layer: MoE, x: Tensor) -> Tensor:
    if layer.shared_w13 is None:
        return torch.zeros_like(x)
    gate, up = F.linear(x, layer.shared_w13).chunk(2, dim=-1)
    out = F.linear(F.silu(gate) * up, layer.shared_w2)
    if layer.shared_gate is not None:
        out = out * torch.sigmoid(F.linear(x, layer.shared_gate))
    return out


def _dequantized(layer: MoE) -> tuple[Tensor, Tensor]:
    if layer.w13_scale is None:
        return layer.w13, layer.w2
    dt = layer.config.dtype
    return ((layer.w13.float() * layer.w13_scale[..., None]).to(dt),
            (layer.w2.float() * layer.w2_scale[..., None]).to(dt))


def per_expert_loop(layer: MoE, x: Tensor, w13: Tensor | None = None, w2: Tensor | None = None) -> Tensor:
    """HF-style: for each expert, find its tokens (a host sync), run SwiGLU, add weighted.
    (bf16 weights: pass w13/w2 from ``_dequantized`` once for an fp8 layer.)"""
    cfg = layer.config
    w13 = layer.w13 if w13 is None else w13
    w2 = layer.w2 if w2 is None else w2
    ids, weights = _topk(layer, x)
    out = _shared(layer, x)
    for e in range(cfg.num_experts):
        token, slot = torch.where(ids == e)
        if token.numel() == 0:  # host sync
            continue
        w = weights[token, slot, None].to(x.dtype)
        inp = x[token] * w if cfg.apply_router_weight_on_input else x[token]
        gate, up = F.linear(inp, w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e])
        out.index_add_(0, token, y if cfg.apply_router_weight_on_input else y * w)
    return out


def _scaled_grouped_mm(q: Tensor, scale: Tensor, w: Tensor, w_scale: Tensor, offs: Tensor) -> Tensor:
    """torch's fp8 rowwise grouped GEMM: [M, K] e4m3 x [G, N, K] e4m3 -> [M, N] bf16, with fast
    accumulation like shufflemoe's fp8 kernels."""
    return torch._scaled_grouped_mm(q, w.transpose(-2, -1), scale, w_scale, offs=offs,
                                    out_dtype=torch.bfloat16, use_fast_accum=True)


def torch_pipeline(layer: MoE, x: Tensor) -> Tensor:
    """Route, sort by expert, gather, grouped GEMM, SwiGLU, grouped GEMM, scatter: stock torch."""
    cfg = layer.config
    E, k, inter = cfg.num_experts, cfg.top_k, cfg.intermediate_size
    ids, weights = _topk(layer, x)  # [T, k]
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)  # pairs by expert, then token
    token = order // k
    w = weights.reshape(-1)[order]
    counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))  # bincount would sync
    offs = counts.cumsum(0, dtype=torch.int32)
    xs = x.index_select(0, token)
    if cfg.apply_router_weight_on_input:
        xs = (xs.float() * w[:, None]).to(x.dtype)
    if layer.w13_scale is not None:
        h = _scaled_grouped_mm(*quantize_fp8_rowwise(xs), layer.w13, layer.w13_scale, offs)
        a = F.silu(h[:, :inter]) * h[:, inter:]
        y = _scaled_grouped_mm(*quantize_fp8_rowwise(a), layer.w2, layer.w2_scale, offs)
    else:
        h = torch._grouped_mm(xs, layer.w13.transpose(-2, -1), offs=offs)
        a = F.silu(h[:, :inter]) * h[:, inter:]
        y = torch._grouped_mm(a, layer.w2.transpose(-2, -1), offs=offs)
    if not cfg.apply_router_weight_on_input:
        y = y * w[:, None].to(y.dtype)
    return _shared(layer, x).index_add_(0, token, y.to(x.dtype))


# The transformers config fields of a layer, per model type (its widths and routing options).
def _hf_fields(model_type: str, layer: MoE) -> dict:
    c = layer.config
    if model_type == "llama4_text":
        return dict(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                    num_local_experts=c.num_experts, num_experts_per_tok=c.top_k)
    if model_type == "qwen3_moe":
        return dict(hidden_size=c.hidden_size, moe_intermediate_size=c.intermediate_size,
                    num_experts=c.num_experts, num_experts_per_tok=c.top_k,
                    norm_topk_prob=c.renormalize)
    if model_type == "mixtral":
        return dict(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                    num_local_experts=c.num_experts, num_experts_per_tok=c.top_k)
    raise ValueError(f"no HF block peer for model_type {model_type!r}")


def _set(module: nn.Module, path: str, value: Tensor) -> None:
    *parents, name = path.split(".")
    for p in parents:
        module = getattr(module, p)
    setattr(module, name, nn.Parameter(value, requires_grad=False))


def hf_block(model_type: str, layer: MoE, experts_implementation: str | None = None) -> nn.Module:
    """transformers' MoE block of ``model_type`` holding ``layer``'s weights (shared where the
    layouts agree, transposed copies for Llama 4). The block returns what transformers' returns."""
    from transformers import AutoConfig

    from ..integrations.transformers.specs import spec_for

    spec = spec_for(model_type)
    config = AutoConfig.for_model(model_type, **_hf_fields(model_type, layer))
    if experts_implementation is not None:
        config._experts_implementation = experts_implementation
    cls = getattr(importlib.import_module(spec.module), spec.block)
    with torch.device("meta"):
        block = cls(config)
    w13, w2 = _dequantized(layer)
    if spec.transposed:
        w13, w2 = w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    _set(block, spec.router, layer.router_weight)
    _set(block, spec.w13, w13)
    _set(block, spec.w2, w2)
    if spec.shared is not None:
        gate, up = layer.shared_w13.chunk(2, dim=0)
        for path, t in zip(spec.shared, (gate, up, layer.shared_w2)):
            _set(block, path, t)
    if any(p.is_meta for p in block.parameters()) or any(b.is_meta for b in block.buffers()):
        raise RuntimeError(f"{spec.block}: a parameter or buffer was not set from the layer")
    return block.eval()


def hf_block_candidates(model_type: str, layers: list[MoE],
                        implementations: tuple[str | None, ...]) -> dict[str, dict[int, nn.Module]]:
    """transformers' blocks for each experts implementation (None: the block's only one, named
    'default'), one per layer copy: {implementation: {id(layer): block}}. An implementation this
    transformers lacks is left out with a note."""
    out = {}
    for impl in implementations:
        try:
            out[impl or "default"] = {id(layer): hf_block(model_type, layer, impl) for layer in layers}
        except Exception as e:  # noqa: BLE001 - transformers missing or changed: report, keep the rest
            print(f"no transformers {model_type} block with experts {impl!r}: {type(e).__name__}: {e}")
    return out


def hf_block_forward(block: nn.Module, x: Tensor) -> Tensor:
    """Run an HF block on x [T, D] -> [T, D] (it takes [B, S, D]; Llama 4 returns a tuple)."""
    out = block(x[None])
    out = out[0] if isinstance(out, tuple) else out
    return out.reshape(x.shape)


__all__ = ["per_expert_loop", "torch_pipeline", "hf_block", "hf_block_candidates", "hf_block_forward"]
