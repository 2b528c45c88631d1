"""What every parallel dispatcher shares: the mesh, the agreement on sizes before a forward, the
checks at construction, and how weights are cut.

Tensor-parallel cut (rank t of tp): rows [t * Il, (t + 1) * Il) of the gate half and of the up
half of w13 (Il = I / tp; the halves are cut separately so SwiGLU pairs gate and up of the same
columns) and of w13_bias, the same columns of w2, likewise for the shared expert (its sigmoid
gate, [1, D], whole). w2_bias is added once: tp rank 0 holds it, the others zeros, and the sum
over tp adds it. Quantized weights are cut on their scales' boundaries (formats.scale_block):
w13_scale with w13's rows (fp8_block: Il must be a multiple of 128 rows); w2_scale along w2's
columns (fp8_block: 128, mxfp4: 32 columns; a multiple is required, else a clear error) or kept
whole (one scale per output row: fp8_rowwise, fp8_w8a16), so the shard holds exactly the full
layer's values. fp8_rowwise's SwiGLU output is then quantized per row over the rank's I / tp
columns instead of all I (as vLLM does), so each rank rounds with its own scale; measured on
the 2-rank fp8 case of tests/dispatch: max error 0.045 rms, relative L2 0.013 against the full
layer's float64 reference (single device: 0.015, 0.0042; tolerance 0.25, 0.05). fp8_block's
groups of 128 columns fall on the cut, so its ranks round exactly as one device.
"""

from __future__ import annotations

import functools
import zlib
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..config import MoEConfig
from ..ops.quantize.formats import FORMATS
from ..routing import drops_before_normalizing, route, router_logits
from ..types import Routing
from .base import Dispatch
from .comm import agree, check_replicated
from .mesh import Mesh

if TYPE_CHECKING:
    from ..layer import MoE

WEIGHTS = ("router_weight", "router_bias", "router_logits_bias", "w13", "w2", "w13_scale",
           "w2_scale", "w13_bias", "w2_bias", "shared_w13", "shared_w2", "shared_gate")


class ParallelDispatch(Dispatch):
    """A dispatcher on a mesh: agrees on every rank's token count before its first collective."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self._layout_crc: int | None = None

    def describe(self) -> str:
        return f"{self.name} on {self.mesh.describe()}"

    def admit(self, layer: MoE, x: Tensor, error: Exception | None) -> list[int]:
        """Every rank's token count [mesh size], agreed on the gloo twin of the mesh: the same
        ValueError on every rank when one rank's input is bad or the sizes break a rule."""
        T = 0 if error is not None else x.numel() // layer.config.hidden_size
        settings = self.settings(layer)
        rows = agree(self.mesh, [T, *settings.values()], None if error is None else str(error),
                     self.describe())
        tokens = [row[0] for row in rows]
        for i, name in enumerate(settings, start=1):
            values = [row[i] for row in rows]
            if len(set(values)) > 1:
                raise ValueError(f"parallel MoE layer: the ranks built different layers: {name} "
                                 f"per rank {values}")  # no describe(): it differs by rank
        problem = self.size_error(tokens)
        if problem:
            raise ValueError(f"{self.describe()}: {problem} (tokens per rank: {tokens})")
        return tokens

    def settings(self, layer: MoE) -> dict[str, int]:
        """What every rank's layer must agree on, as ints: a checksum of the layout (dispatcher,
        mesh, options, config), and for some dispatchers the values named in their messages."""
        if self._layout_crc is None:  # once per layer: the repr costs more than the agreement
            self._layout_crc = zlib.crc32(f"{self.describe()} {layer.config}".encode())
        return {"layout (dispatcher, mesh, options or config)": self._layout_crc}

    def size_error(self, tokens: list[int]) -> str | None:
        """Why these token counts cannot run (the same answer on every rank), or None."""
        return None

    def replicated_rule(self, tokens: list[int]) -> str | None:
        """Ranks of one tp group run the same tokens."""
        m = self.mesh
        for e in range(m.ep):
            group = tokens[e * m.tp : (e + 1) * m.tp]
            if len(set(group)) > 1:
                return (f"the ranks of a tp group must run the same tokens, tp group {e} has "
                        f"{group}")
        return None


def routing_error(cfg: MoEConfig) -> str | None:
    """Why a dispatcher that routes dropless at the source and applies the capacity where the
    pairs arrive (tp_sp, ep_*) cannot route cfg as one device would (None: it can)."""
    if drops_before_normalizing(cfg):
        return ("a capacity_factor with renormalize=True and renormalize_over='kept' is not "
                "supported here: the capacity is applied where the pairs arrive, after their "
                "source normalized the weights (use renormalize_over='chosen', or dispatch 'tp')")
    return None


def require_local(layer: MoE, mesh: Mesh, what: str) -> None:
    """A transform starts from a single-device layer whose weights are the same on every rank."""
    if layer.dispatch.name != "local":
        raise ValueError(f"{what} transforms a single-device layer (dispatch 'local'), got one "
                         f"with dispatch {layer.dispatch.name!r}")
    check_replicated(mesh, {n: getattr(layer, n) for n in WEIGHTS}, what)


def own(t: Tensor) -> Tensor:
    """A contiguous copy that does not keep the full tensor's storage alive."""
    return t.clone(memory_format=torch.contiguous_format)


def gate_up_rows(t: Tensor, n: int, rank: int, dim: int) -> Tensor:
    """Rows [rank * n, (rank + 1) * n) of the gate half and of the up half of t along dim (whose
    length is 2 * I: gate rows then up rows), as one new tensor."""
    gate, up = t.chunk(2, dim=dim)
    return torch.cat([gate.narrow(dim, rank * n, n), up.narrow(dim, rank * n, n)], dim=dim)


def tp_cut_error(cfg: MoEConfig, tp: int) -> str | None:
    """Why the experts of cfg cannot be cut over tp ranks (None: they can)."""
    I, Is = cfg.intermediate_size, cfg.shared_intermediate_size
    if I % tp or Is % tp:
        return (f"tp={tp} must divide intermediate_size ({I}) and shared_intermediate_size "
                f"({Is})")
    fmt, Il = FORMATS[cfg.quantization], I // tp
    if tp == 1 or not fmt.quantized:
        return None
    rows, cols = fmt.scale_block
    for what, g in (("w13's scale rows", rows), ("w2's scale columns", cols),
                    ("w2's packed values", fmt.k_per_element)):
        if g > 1 and Il % g:
            return (f"tp={tp} cuts intermediate_size {I} into {Il} columns per rank, not a "
                    f"multiple of {g}: {cfg.quantization}'s {what} cannot be cut there "
                    f"(expert parallelism keeps experts whole)")
    return None


def tp_cut(layer: MoE, weights: dict[str, Tensor | None], tp: int, rank: int
           ) -> dict[str, Tensor | None]:
    """``weights`` (the layer's, experts possibly already cut by expert parallelism) with every
    expert and the shared expert cut to this tp rank's I / tp columns."""
    cfg = layer.config
    problem = tp_cut_error(cfg, tp)
    if problem:
        raise ValueError(problem)
    if tp == 1:
        return dict(weights)
    Il, Isl = cfg.intermediate_size // tp, cfg.shared_intermediate_size // tp
    fmt = FORMATS[cfg.quantization]
    rows, cols = fmt.scale_block
    kpe = fmt.k_per_element
    cut = dict(weights, w13=gate_up_rows(weights["w13"], Il, rank, dim=1),
               w2=own(weights["w2"].narrow(-1, rank * Il // kpe, Il // kpe)))
    if weights["w13_scale"] is not None:
        cut["w13_scale"] = gate_up_rows(weights["w13_scale"], Il // rows, rank, dim=1)
        if cols:  # else one scale per output row of w2: kept whole
            cut["w2_scale"] = own(weights["w2_scale"].narrow(-1, rank * Il // cols, Il // cols))
    if weights["w13_bias"] is not None:
        w2_bias = weights["w2_bias"]
        cut.update(w13_bias=gate_up_rows(weights["w13_bias"], Il, rank, dim=1),
                   w2_bias=own(w2_bias) if rank == 0 else torch.zeros_like(w2_bias))
    if weights["shared_w13"] is not None:
        cut.update(shared_w13=gate_up_rows(weights["shared_w13"], Isl, rank, dim=0),
                   shared_w2=own(weights["shared_w2"].narrow(-1, rank * Isl, Isl)))
    return cut


def tp_config(cfg: MoEConfig, tp: int) -> MoEConfig:
    """The config of a layer whose experts (and shared expert) are cut to I / tp."""
    return cfg.replace(intermediate_size=cfg.intermediate_size // tp,
                       shared_intermediate_size=cfg.shared_intermediate_size // tp)


def layer_weights(layer: MoE) -> dict[str, Tensor | None]:
    return {n: None if getattr(layer, n) is None else getattr(layer, n).data for n in WEIGHTS}


@functools.cache
def _dropless(cfg: MoEConfig) -> MoEConfig:
    if cfg.capacity_factor is None:
        return cfg
    return cfg.replace(capacity_factor=None, renormalize_over="kept")  # "chosen" needs a capacity


def dropless_routing(layer: MoE, x: Tensor) -> Routing:
    """The layer's routing of x [T, D] without capacity drops: a parallel dispatcher applies the
    capacity over every rank's tokens, as one device holding them all would."""
    logits = router_logits(x, layer.router_weight, layer.config.router_logits_dtype,
                           layer.router_logits_bias)
    return route(logits, _dropless(layer.config), layer.router_bias)


def topk_of(routing: Routing, top_k: int) -> tuple[Tensor, Tensor]:
    """(expert ids [T, k] int32, weights [T, k] float32) of token t's j-th choice, read back from
    a dropless Routing through its positions (the same values, bit for bit)."""
    pos = routing.positions.long()
    return routing.expert_ids[pos].view(-1, top_k), routing.weights[pos].view(-1, top_k)


def dropless_topk(layer: MoE, x: Tensor) -> tuple[Tensor, Tensor]:
    return topk_of(dropless_routing(layer, x), layer.config.top_k)
