"""The serving arithmetic as a planner: bytes, FLOPs and communication of one MoE layer per
strategy, the roofline floor they imply on a device, and which strategy to use.

Decode is weight-bound: the bytes of the experts a batch touches over memory bandwidth. Prefill is
FLOP-bound: 6 * rows * D * I for the two expert GEMMs. Tensor parallelism divides both and adds
an all-reduce of the output; expert parallelism divides experts and moves tokens instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import MoEConfig
from .experts.blockwise import num_blocks
from .ops.quantize.formats import FORMATS


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float  # bytes/s of device memory (copy bandwidth, read + write)
    bf16_flops: float  # dense bf16 FLOP/s
    fp8_flops: float  # dense fp8 FLOP/s
    link_bandwidth: float  # bytes/s per GPU for collectives (NVLink)


# Measured on this project's H100 SXM (shared/notes/environment.md): 3.0 TB/s copy, 687-798 TFLOP/s
# bf16 for an 8192^3 GEMM; fp8 is taken as twice bf16; NVLink 4 is 450 GB/s per direction.
H100 = Hardware("H100 SXM", 3.0e12, 700e12, 1400e12, 450e9)
HARDWARE = {"h100": H100, "h200": Hardware("H200 SXM", 4.3e12, 790e12, 1580e12, 450e9)}

STRATEGIES = ("shuffled", "padded", "sliced", "concat", "blockwise", "all_experts", "selective")


def expected_active_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """Distinct experts T tokens touch with uniform top-k routing: E * (1 - (1 - k/E)^T)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def expert_bytes(cfg: MoEConfig) -> int:
    """Bytes of one routed expert's weights: w13 + w2 in the config's format, scales included
    (ops/quantize/formats.py: 2 a weight in bf16, ~1 in fp8, ~0.53 in mxfp4), plus biases."""
    fmt, D, I, act = FORMATS[cfg.quantization], cfg.hidden_size, cfg.intermediate_size, _act_bytes(cfg)
    biases = (2 * I + D) * act if cfg.expert_bias else 0
    return fmt.bytes(2 * I, D, act, split=I) + fmt.bytes(D, I, act) + biases


def _act_bytes(cfg: MoEConfig) -> int:
    return 4 if str(cfg.dtype).endswith("float32") else 2


def fixed_bytes(cfg: MoEConfig) -> int:
    """Bytes every step reads whatever the routing: router and shared expert weights."""
    shared = 3 * cfg.shared_intermediate_size * cfg.hidden_size + (
        cfg.hidden_size if cfg.shared_expert_gate else 0)
    return (cfg.num_experts * cfg.hidden_size + shared) * _act_bytes(cfg)


def must_read_bytes(cfg: MoEConfig, active_experts: float) -> float:
    """The fewest bytes a step can read: active experts + shared expert + router."""
    return active_experts * expert_bytes(cfg) + fixed_bytes(cfg)


@dataclass(frozen=True)
class LayerCost:
    strategy: str
    tokens: int
    rows: float  # expert rows computed (pairs plus padding)
    weight_bytes: float
    activation_bytes: float
    flops: float
    comm_bytes: float  # per rank, for the parallel layout asked
    t_memory: float
    t_compute: float
    t_comm: float
    host_syncs: int

    @property
    def floor(self) -> float:
        """Roofline time: the slowest of memory, compute and communication (seconds)."""
        return max(self.t_memory, self.t_compute, self.t_comm)

    @property
    def bound(self) -> str:
        times = {"memory": self.t_memory, "compute": self.t_compute, "comm": self.t_comm}
        return max(times, key=times.get)


def _rows_and_experts(cfg: MoEConfig, strategy: str, T: int, active: float) -> tuple[float, float]:
    E, A = cfg.num_experts, T * cfg.top_k
    if strategy in ("shuffled", "sliced", "concat"):
        return A, active
    if strategy == "padded":  # every expert padded to the busiest one (~ balanced + 2 sigma)
        busiest = min(T, A / E + 2 * math.sqrt(A / E)) if A else 0
        return E * math.ceil(busiest), E if A else 0
    if strategy == "blockwise":
        per_expert = math.ceil(A / active / cfg.block_size) if A else 0  # blocks of one expert
        blocks = min(round(active) * per_expert, num_blocks(A, E, cfg.block_size))
        return blocks * cfg.block_size, active
    if strategy == "all_experts":
        return E * T, E
    if strategy == "selective":
        return active * T, active
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")


def layer_cost(
    cfg: MoEConfig,
    num_tokens: int,
    strategy: str = "shuffled",
    hw: Hardware = H100,
    *,
    tp: int = 1,
    ep: int = 1,
    ep_mode: str = "alltoall",
    active_experts: float | None = None,
) -> LayerCost:
    """Cost of one layer on one rank. ``cfg`` is the unsharded layer; tp divides I, ep divides E
    (each EP rank then routes its own num_tokens tokens)."""
    if cfg.intermediate_size % tp or cfg.num_experts % ep:
        raise ValueError(f"tp={tp} must divide I and ep={ep} must divide E")
    T, D = num_tokens, cfg.hidden_size
    I = cfg.intermediate_size // tp
    local = cfg.replace(intermediate_size=I, shared_intermediate_size=cfg.shared_intermediate_size // tp)
    active = (expected_active_experts(cfg.num_experts, cfg.top_k, T * ep) / ep
              if active_experts is None else active_experts)
    # with EP, this rank's experts see the pairs of all ep ranks' tokens routed to them
    rows, experts_read = _rows_and_experts(local, strategy, T * ep, active * ep)
    rows, experts_read = rows / ep, experts_read / ep
    act = _act_bytes(cfg)
    weight_bytes = experts_read * expert_bytes(local) + fixed_bytes(local)
    activation_bytes = act * (rows * (3 * D + 4 * I) + 2 * T * D)
    flops = 6 * rows * D * I + 6 * T * D * local.shared_intermediate_size + 2 * T * D * cfg.num_experts
    rate = hw.fp8_flops if FORMATS[cfg.quantization].activation != "none" else hw.bf16_flops
    comm = 0.0
    if tp > 1:  # ring all-reduce of the output
        comm += 2 * (tp - 1) / tp * T * D * act
    if ep > 1:
        A = T * cfg.top_k
        if ep_mode == "alltoall":  # tokens out and results back, (ep-1)/ep of them remote
            comm += 2 * A * D * act * (ep - 1) / ep
        else:  # allgather of sorted pairs, padded all-to-all back
            P = min(cfg.num_experts // ep, cfg.top_k) * T
            comm += (ep - 1) * (A + P) * D * act
    syncs = 1 if strategy in ("padded", "sliced", "concat") else 0
    if ep > 1 and ep_mode == "alltoall":
        syncs += 1
    return LayerCost(strategy, T, rows, weight_bytes, activation_bytes, flops, comm,
                     (weight_bytes + activation_bytes) / hw.bandwidth, flops / rate,
                     comm / hw.link_bandwidth, syncs)


def decode_strategy(cfg: MoEConfig, num_tokens: int) -> str:
    """The Neuron guide's switch: selective loading while T * k <= alpha * E, else all experts."""
    return "selective" if num_tokens * cfg.top_k <= cfg.decode_switch_alpha * cfg.num_experts else "all_experts"


def plan(cfg: MoEConfig, num_tokens: int, hw: Hardware = H100, *, tp: int = 1, ep: int = 1,
         ep_mode: str = "alltoall") -> list[LayerCost]:
    """Every strategy's cost, fastest floor first."""
    costs = [layer_cost(cfg, num_tokens, s, hw, tp=tp, ep=ep, ep_mode=ep_mode) for s in STRATEGIES]
    return sorted(costs, key=lambda c: (c.floor, c.host_syncs))
