"""The serving arithmetic as a planner: bytes, FLOPs and communication of one MoE layer per
strategy and per parallel layout, the roofline floor they imply, and what to use.

Decode is weight-bound: the bytes of the experts a batch touches over memory bandwidth. Prefill is
FLOP-bound: 6 * rows * D * I for the two expert GEMMs. Tensor parallelism divides both and adds
collectives on the output; expert parallelism divides experts and moves tokens instead.

Layouts: ``layouts(cfg, world)`` lists every layout the library can build on ``world`` GPUs (each
dispatcher's ``layouts``) and nothing else. Their communication is each dispatcher's own
``traffic``: the exact bytes every collective brings to a rank, counts and padding included
(the tests check it against bytes counted on the collectives), priced as latency + bytes /
bandwidth of the group's links (NVLink inside a node, the network across nodes). ``recommend``
ranks them for a batch by compute floor + communication: the Neuron guide's TP-vs-EP framework,
computed. With skewed routing one EP rank receives up to ep * min(El, k) / k times its share of
pairs (every token's pairs on its experts); ``bound=True`` prices that worst case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import MoEConfig
from .dispatch import DISPATCHERS, Collective
from .experts.blockwise import num_blocks
from .ops.quantize.formats import FORMATS


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float  # bytes/s of device memory (copy bandwidth, read + write)
    bf16_flops: float  # dense bf16 FLOP/s
    fp8_flops: float  # dense fp8 FLOP/s
    link_bandwidth: float  # bytes/s per GPU received by a collective inside a node (NVLink)
    node_bandwidth: float = 50e9  # bytes/s per GPU across nodes (400 Gb/s InfiniBand)
    link_latency: float = 10e-6  # seconds per collective (NCCL launch and handshake)
    gpus_per_node: int = 8
    op_bandwidth: tuple = ()  # (op, bytes/s) pairs measured per collective, overriding the link


# Measured on this project's H100 SXM (shared/notes/environment.md): 3.0 TB/s copy, 687-798 TFLOP/s
# bf16 for an 8192^3 GEMM; fp8 is taken as twice bf16; NVLink 4 is 450 GB/s per direction. The
# link figures are nominal: benchmarks/multi_gpu.py measures them and re-prices with the result.
# The H200 as its suites measured it (results/h200: copy 3.96-4.09 TB/s, bf16 721-772 TFLOP/s).
H100 = Hardware("H100 SXM", 3.0e12, 700e12, 1400e12, 450e9)
HARDWARE = {"h100": H100, "h200": Hardware("H200 SXM", 4.0e12, 750e12, 1500e12, 450e9)}

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
    def serial(self) -> float:
        """Compute floor plus communication, nothing overlapped (seconds)."""
        return max(self.t_memory, self.t_compute) + self.t_comm

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
    layout: Layout | None = None,
    active_experts: float | None = None,
    bound: bool = False,
) -> LayerCost:
    """Cost of one layer on one rank of ``layout`` (default: one device). ``cfg`` is the
    unsharded layer; ``num_tokens`` are the tokens of one tp group (each ep rank routes its own;
    under tp_sp they arrive in tp slices). ``bound``: the busiest rank under skewed routing."""
    layout = layout or Layout("local")
    tp, ep = layout.tp, layout.ep
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
    if bound and ep > 1:
        rows *= skew_factor(cfg, ep)
    act = _act_bytes(cfg)
    weight_bytes = experts_read * expert_bytes(local) + fixed_bytes(local)
    activation_bytes = act * (rows * (3 * D + 4 * I) + 2 * T * D)
    flops = 6 * rows * D * I + 6 * T * D * local.shared_intermediate_size + 2 * T * D * cfg.num_experts
    rate = hw.fp8_flops if FORMATS[cfg.quantization].activation != "none" else hw.bf16_flops
    collectives = traffic(cfg, layout, T, bound=bound)
    comm = sum(c.nbytes for c in collectives)
    syncs = (1 if strategy in ("padded", "sliced", "concat") else 0) + (
        0 if DISPATCHERS.get(layout.dispatch).graph_safe else 1)
    return LayerCost(strategy, T, rows, weight_bytes, activation_bytes, flops, comm,
                     (weight_bytes + activation_bytes) / hw.bandwidth, flops / rate,
                     comm_time(collectives, layout, hw), syncs)


def decode_strategy(cfg: MoEConfig, num_tokens: int) -> str:
    """The Neuron guide's switch: selective loading while T * k <= alpha * E, else all experts."""
    return "selective" if num_tokens * cfg.top_k <= cfg.decode_switch_alpha * cfg.num_experts else "all_experts"


def plan(cfg: MoEConfig, num_tokens: int, hw: Hardware = H100, *,
         layout: Layout | None = None) -> list[LayerCost]:
    """Every strategy's cost on ``layout``, fastest floor first."""
    costs = [layer_cost(cfg, num_tokens, s, hw, layout=layout) for s in STRATEGIES]
    return sorted(costs, key=lambda c: (c.floor, c.host_syncs))



@dataclass(frozen=True)
class Layout:
    """A parallel layout: a dispatcher on an (ep, tp) mesh with its options."""

    dispatch: str
    ep: int = 1
    tp: int = 1
    options: tuple = ()  # sorted (name, value) pairs: dedup, redundant, max_tokens

    @property
    def world(self) -> int:
        return self.ep * self.tp

    @property
    def kind(self) -> str:
        """TP, EP or hybrid (the Neuron guide's three choices), or local."""
        if self.ep > 1:
            return "hybrid" if self.tp > 1 else "EP"
        return "TP" if self.tp > 1 else "local"

    def describe(self) -> str:
        opts = " ".join(k if v is True else f"{k}={v}" for k, v in self.options if v is not False)
        return f"{self.dispatch} ep={self.ep} tp={self.tp}" + (f" {opts}" if opts else "")


def layouts(cfg: MoEConfig, world: int) -> list[Layout]:
    """Every layout the library builds for ``cfg`` on ``world`` ranks, and nothing else."""
    found = []
    for ep in (d for d in range(1, world + 1) if world % d == 0):
        for name in DISPATCHERS.names():
            for options in DISPATCHERS.get(name).layouts(cfg, ep, world // ep):
                found.append(Layout(name, ep, world // ep, tuple(sorted(options.items()))))
    return found


def skew_factor(cfg: MoEConfig, ep: int) -> float:
    """Worst case / uniform pairs one EP rank receives: every token sends min(El, k) of its k pairs
    there (a token's experts are distinct)."""
    return ep * min(cfg.num_experts // ep, cfg.top_k) / cfg.top_k


def source_counts(cfg: MoEConfig, layout: Layout, tokens: int, bound: bool = False
                  ) -> list[list[float]]:
    """Expected pairs per (source, physical expert) for ``tokens`` per tp group, uniform routing;
    ``bound``: every source sends rank 0's experts as many pairs as a token can."""
    opts = dict(layout.options)
    slices = layout.tp if opts.get("dedup") and layout.tp > 1 else 1
    E = cfg.num_experts + opts.get("redundant", 0)
    El, k = E // layout.ep, cfg.top_k
    per_source = tokens / slices
    rows = []
    for _ in range(layout.ep * slices):
        if not bound:
            rows.append([per_source * k / E] * E)
            continue
        hot = min(El, k) * per_source  # onto rank 0's El experts
        rest = (k * per_source - hot) / max(E - El, 1)
        rows.append([hot / El] * El + [rest] * (E - El))
    return rows


def traffic(cfg: MoEConfig, layout: Layout, tokens: int | list[int],
            counts: list[list[float]] | None = None, rank: int = 0, bound: bool = False
            ) -> list[Collective]:
    """The collectives of one forward on mesh rank ``rank``: ``tokens`` per tp group (per rank's
    slice under tp_sp: tokens / tp), or the list of every mesh rank's input rows; ``counts``
    [source][E] (default: expected, uniform or bound)."""
    if layout.dispatch == "local":
        return []
    opts = dict(layout.options)
    if isinstance(tokens, list):
        per_rank = tokens
    else:
        per_rank = [tokens // layout.tp if layout.dispatch == "tp_sp" else tokens] * layout.world
    redundant = opts.pop("redundant", 0)
    if redundant:
        from .dispatch.eplb import balanced

        opts["placement"] = balanced(None, cfg.num_experts, layout.ep, redundant)
    if counts is None:
        counts = source_counts(cfg, layout, per_rank[rank] * (
            layout.tp if layout.dispatch == "tp_sp" else 1), bound)
    return DISPATCHERS.get(layout.dispatch).traffic(
        cfg, layout.ep, layout.tp, per_rank, counts, rank, **opts)


def comm_time(collectives: list[Collective], layout: Layout, hw: Hardware) -> float:
    """Seconds: latency + received bytes / bandwidth per collective; a group crosses nodes when
    its ranks span more than one node (tp groups are consecutive ranks, ep groups tp apart)."""
    span = {"tp": layout.tp, "ep": layout.ep * layout.tp}
    measured = dict(hw.op_bandwidth)

    def bandwidth(c: Collective) -> float:
        if span[c.dim] > hw.gpus_per_node:
            return hw.node_bandwidth
        return measured.get(c.op, hw.link_bandwidth)

    return sum(hw.link_latency + c.nbytes / bandwidth(c) for c in collectives)


def recommend(cfg: MoEConfig, batch: int, world: int, hw: Hardware = H100,
              strategy: str = "shuffled", bound: bool = False) -> list[tuple[Layout, LayerCost]]:
    """Every buildable layout on ``world`` GPUs for a batch of ``batch`` tokens (split over the ep
    ranks, as data-parallel attention does), fastest (compute floor + communication) first."""
    ranked = []
    for layout in layouts(cfg, world):
        T = math.ceil(batch / layout.ep)
        if layout.dispatch == "tp_sp" and T % layout.tp:
            continue
        ranked.append((layout, layer_cost(cfg, T, strategy, hw, layout=layout, bound=bound)))
    return sorted(ranked, key=lambda lc: (lc[1].serial, lc[1].host_syncs, lc[0].describe()))
