"""When the fused decode path runs, and with which tiles: deterministic heuristics, no autotuning.

Two choices, each a frozen dataclass that tests and benchmarks replace with ``override``:

- ``Switch``: the ``shuffled`` strategy takes the fused path while A = T * k <= max_pairs, for
  layers with k <= max_top_k, and for fp8 rowwise (w8a8) layers only if ``fp8`` (fp8_block and
  the weight-only formats, fp8_w8a16 and mxfp4, by their own token limits). Measured on an H100
  (benchmarks/results/probe_combine.json, CUDA-graph replays, fused vs the unfused path with
  its deterministic token-major combine, T = 1..8): bf16 Llama 4 Scout TP8 1.02-1.05x faster,
  Qwen3-30B-A3B (k = 8) 1.01-1.02x, Mixtral TP2 (k = 2) 0.99-1.03x, and the eager call costs the
  host less in 23 of 24 cases; fp8 rowwise 0.85-0.92x (its in-kernel quantization of a's rows costs more
  than the launches it saves). So the default fuses every bf16 layer, and fp8 ones only with many
  experts a token at small A (Switch.fp8_min_top_k, fp8_max_pairs), or on a GPU where top-1
  layers measured faster fused (Switch.fp8_top1_tokens: the H100 and the H200).
- ``DecodeConfig``: tiles and split-K factors of the two fused GEMMs. The host knows A, E, D, I
  and the dtype, never the group sizes, so it plans for min(E, A) active experts: weight tiles =
  active experts x cdiv(N, block_n). The choice comes from the tuning tables (tuned.py, written
  by benchmarks/tune_decode.py from sweeps on GPUs: rows swept on the running GPU itself first,
  then the base table's, swept on a GPU with as many SMs) for a shape they hold, A rounded up
  to a power of two (fp8_w8a16 in rows of its own); else from the heuristic (for
  fp8_w8a16, ``w8a16_rule``): with fewer tiles than SMs, K is split until every SM streams
  weights (Llama 4 Scout TP8 at T = 1: one expert, 16 tiles of 64 gate + 64 up rows for 132
  SMs).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from .._common import device_name as _device_name
from .._common import device_sms as _device_sms
from .tuned import BASE_DEVICE, BY_DEVICE, TABLE


@dataclass(frozen=True)
class Switch:
    max_pairs: int = 64  # fused while A = T * k <= max_pairs
    max_top_k: int = 1 << 30  # ... for layers with k <= max_top_k
    fp8: bool = False  # ... and fp8 rowwise (w8a8) layers when True, else only where
    # k >= fp8_min_top_k and A <= fp8_max_pairs: with many experts a token, the unfused path's
    # gather, SwiGLU and token-sum launches cost more than the fused kernels' in-register
    # quantization. H100, tune_decode's layer phase at 6b70ae2 (CUDA graphs, fused with the
    # table's PDL / unfused, us): Qwen3-30B-A3B (k = 8) T = 1 34.1 / 36.9, T = 2 45.0 / 51.0,
    # T = 4 68.8 / 73.6, T = 8 119.5 / 115.0; Mixtral TP2 (k = 2) T = 1 84.1 / 82.3, T = 2
    # 140.2 / 133.3; Llama 4 Scout TP8 (k = 1) T = 1 34.4 / 35.7, T = 2 39.7 / 39.1, T = 8
    # 68.3 / 64.8 (results/tune_decode.json).
    fp8_min_top_k: int = 4
    fp8_max_pairs: int = 32
    # ... and, on a GPU named in fp8_top1_tokens, top-1 layers of at least fp8_top1_min_experts
    # experts while T <= its entry. H200, CUDA graphs, the four-launch path / Switch(fp8=True), us
    # (benchmarks/results/probe_fused_limit_fp8_2862b2b.json, p20-p80 apart at T = 2..8): Llama 4
    # Scout TP8 T = 2 30.8 / 30.1, T = 4 39.7 / 37.6, T = 8 56.0 / 54.0, T = 16 1.004x; Maverick
    # TP8 T = 2 33.6 / 32.2, T = 4 43.2 / 40.9, T = 8 63.6 / 59.9, T = 16 1.018x. H100, the same
    # probe at 428ae92 (results/probe_fused_limit_fp8_428ae92.json, the shipped path timed before
    # and after, p20-p80 within 0.3 us): Scout TP8 T = 2 35.1 / 35.2, T = 4 46.2 / 44.5, T = 8
    # 68.4 / 65.8, T = 16 0.999x; Maverick TP8 T = 2 38.1 / 38.0, T = 4 50.6 / 48.6, T = 8 75.7 /
    # 74.3, T = 16 0.957x (the numbers above, at 6b70ae2, had the H100's fused path slower).
    fp8_top1_tokens: tuple[tuple[str, int], ...] = (("NVIDIA H100 80GB HBM3", 8),
                                                     ("NVIDIA H200", 8))
    fp8_top1_min_experts: int = 16
    # Weight-only layers (fp8_w8a16, mxfp4) fuse while T <= weight_only_tokens, or while T <= 2 x
    # that with at most one pair per two experts (2A <= E): there one-pair tiles stream each
    # active expert once. Measured on an H100 (benchmarks/results/probe_weight_only.json, CUDA
    # graphs, fused over the four-launch path, T = 1..8 where fused): fp8_w8a16 Llama 4 Scout
    # TP8 1.37-1.59x, Maverick TP8 1.18-1.56x, Qwen3-30B-A3B 1.26-1.48x, Mixtral TP2 (T <= 4)
    # 1.24-1.25x. An exploratory run of earlier code (not committed) had the fused path slower
    # at T = 16 (Scout fp8_w8a16 157 vs 127 us) and at Mixtral T = 8.
    weight_only_tokens: int = 4
    # fp8_block (w8a8 in 128-column groups) fuses while T <= fp8_block_tokens in layers of at
    # least fp8_block_min_experts experts. H100, CUDA graphs, fused (the fp8 rowwise table's
    # tiles, K steps cut to whole 128-column blocks) / the four-launch path, us
    # (results/probe_fp8_block_d249906.json): Llama 4 Scout TP8 T = 1 32.1 / 38.0, T = 2 37.7 /
    # 43.1, T = 4 49.2 / 54.9, T = 8 75.1 / 67.8; Maverick TP8 T = 1 39.9 / 42.5 (its shared
    # expert merged: 30.8), T = 4 56.1 / 58.9, T = 8 90.3 / 78.4; Qwen3-30B-A3B T = 1 33.1 /
    # 34.2, T = 4 67.5 / 71.6, T = 8 123.7 / 112.2; Mixtral TP2 (E = 8: two 88 MB experts a
    # token, which the grouped GEMM streams at 67-89% of the read ceiling) T = 1 108.3 / 87.4,
    # T = 4 232.9 / 195.4.
    fp8_block_tokens: int = 4
    fp8_block_min_experts: int = 16
    # mxfp4 fuses while T <= 2 x weight_only_tokens with k <= mxfp4_max_top_k, or at T = 1 (k
    # distinct experts: one-pair tiles stream each once, and eager calls save launches): once
    # the MMA tiles dequantize in PTX the four-launch path beats one-pair tiles wherever pairs
    # share experts. H100, results/probe_mxfp4_tiles.json (CUDA graphs, at 69aebab; best fused
    # tile, default fused, unfused, us): Llama 4 Scout TP8 T = 1 40.3 / 44.3 / 57.1, T = 8 83.7 /
    # 83.7 / 91.5; Maverick TP8 T = 4 69.7 / 78.7 / 74.2; Qwen3-30B-A3B (k = 8) T = 1 43.1 (MMA
    # tiles) / 47.6 / 44.4, T = 8 151.8 / 163.1 / 139.1; Mixtral TP2 (k = 2) T = 1 112.0 / 114.6
    # / 116.6, T = 4 280.5 / 320.1 / 241.7.
    mxfp4_max_top_k: int = 1
    # A plain shared expert of the routed experts' width (bf16/fp16/fp32 layers, no expert bias)
    # joins their two launches while T <= shared_max_tokens (MoE._merges_shared): one launch
    # streams both experts' weights, and with PDL its shared programs run beside the router
    # and index_shuffle, and down's beside gate_up's routed tail. H100, CUDA graphs, the shared
    # expert in its own launches / in the routed ones, us (results/probe_merged.json, at
    # c37ba67): Llama 4 Scout TP8 T = 1 31.9 / 28.3, T = 2 44.6 / 42.4, T = 4 63.9 / 64.1, T = 8
    # 89.1 / 89.5; Maverick TP8 T = 1 38.1 / 33.6, T = 2 51.6 / 46.4, T = 4 71.7 / 74.6, T = 8
    # 107.8 / 127.5; DeepSeek-V3 TP8 (k = 8) 1.01-1.05x faster merged at T = 1..8. Past T = 2
    # the tiles the table picks for A + T pairs stream the shared weights once per one-pair
    # m-tile.
    shared_max_tokens: int = 2
    # Routed experts stored in these formats merge a shared expert (bf16: it keeps its dtype, a
    # second K loop; fp8 rowwise: its rows of a unquantized, the fused path taken whatever the
    # fp8 rule above) while T <= shared_quantized_max_tokens. Measured on an H200 (not an H100;
    # CUDA graphs, separate / merged us, results/probe_merged_quantized.json, at a62a1a7):
    # Llama 4 Scout TP8 T = 1 fp8 rowwise 27.6 / 24.8, fp8_w8a16 28.5 / 25.3; Maverick TP8 T = 1
    # 34.3 / 28.8, 30.3 / 27.5; at T = 2 merged lost 2-9% (one-pair tiles stream the shared
    # weights, twice the routed bytes, once per token), and mxfp4 lost 6-8% at T = 1. fp8_block
    # (H100, results/probe_fp8_block_d249906.json, separate / merged): Maverick TP8 T = 1 39.9
    # / 30.8, T = 2 43.4 / 39.6; Scout TP8 T = 1 32.1 / 32.9, T = 2 37.7 / 38.7.
    shared_quantized_max_tokens: int = 1
    shared_quantized_formats: tuple[str, ...] = ("fp8_rowwise", "fp8_w8a16", "fp8_block")


ALWAYS = Switch(max_pairs=1 << 30, max_top_k=1 << 30, fp8=True,
                weight_only_tokens=1 << 30, mxfp4_max_top_k=1 << 30,
                fp8_block_tokens=1 << 30, fp8_block_min_experts=0,
                shared_quantized_max_tokens=2,
                shared_quantized_formats=("fp8_rowwise", "fp8_w8a16", "fp8_block",
                                          "mxfp4"))  # tests
NEVER = Switch(max_pairs=0)


@dataclass(frozen=True)
class GemmConfig:
    block_n: int  # output columns of a tile (gate_up: block_n gate rows + block_n up rows)
    block_k: int  # reduction step
    split_k: int = 1  # K is cut into this many ranges, each its own program (capped by K steps)
    num_warps: int = 4
    num_stages: int = 3  # software-pipeline depth of the K loop
    # pairs per m-tile: the MMA's N side (weights are its M side, swap-AB); 1: one pair a tile,
    # multiplied on the CUDA cores (a GEMV: at T = 1 every pair has its own expert)
    block_m: int = 16

    def with_(self, **changes) -> "GemmConfig":
        return replace(self, **changes)


@dataclass(frozen=True)
class DecodeConfig:
    gate_up: GemmConfig  # x [A, D] gathered -> a [A, I]
    down: GemmConfig  # a [A, I] -> out [T, D]
    # Programmatic dependent launch (Hopper): each kernel may start while its predecessor drains
    # and waits (griddepcontrol.wait) before touching memory. Per table row, where the layer
    # measured faster with it (tune_decode's layer phase); never in the interpreter.
    pdl: bool = False

    def with_(self, **changes) -> "DecodeConfig":
        return replace(self, **changes)


Key = tuple[int, int, int, int, torch.dtype, int]  # (A, E, D, I, weight dtype, SMs)
_DEFAULT_SWITCH = Switch()
_switch: contextvars.ContextVar[Switch] = contextvars.ContextVar("shufflemoe_decode_switch",
                                                                 default=_DEFAULT_SWITCH)
_override: contextvars.ContextVar[DecodeConfig | Callable[[Key], DecodeConfig] | None] = (
    contextvars.ContextVar("shufflemoe_decode_config", default=None))


@contextlib.contextmanager
def override(config: DecodeConfig | Switch | Callable[[Key], DecodeConfig]) -> Iterator[None]:
    """Inside the block use ``config``: a Switch (when to fuse), or a DecodeConfig (or a function
    of the key returning one) instead of the tile heuristic."""
    var = _switch if isinstance(config, Switch) else _override
    token = var.set(config)
    try:
        yield
    finally:
        var.reset(token)


def overridden() -> bool:
    """Whether an ``override`` is in force (the layer records launch plans only outside one)."""
    return _switch.get() is not _DEFAULT_SWITCH or _override.get() is not None


# The switch in force, field by field: constants to torch.compile, which cannot trace a ContextVar.
@torch._dynamo.assume_constant_result
def _max_pairs() -> int:
    return _switch.get().max_pairs


@torch._dynamo.assume_constant_result
def _max_top_k() -> int:
    return _switch.get().max_top_k


@torch._dynamo.assume_constant_result
def _fp8() -> bool:
    return _switch.get().fp8


@torch._dynamo.assume_constant_result
def _fp8_min_top_k() -> int:
    return _switch.get().fp8_min_top_k


@torch._dynamo.assume_constant_result
def _fp8_max_pairs() -> int:
    return _switch.get().fp8_max_pairs


@torch._dynamo.assume_constant_result
def _fp8_top1_tokens(device: str) -> int:
    return dict(_switch.get().fp8_top1_tokens).get(device, 0) if device else 0


@torch._dynamo.assume_constant_result
def _fp8_top1_min_experts() -> int:
    return _switch.get().fp8_top1_min_experts


@torch._dynamo.assume_constant_result
def _weight_only_tokens() -> int:
    return _switch.get().weight_only_tokens


@torch._dynamo.assume_constant_result
def _fp8_block_tokens() -> int:
    return _switch.get().fp8_block_tokens


@torch._dynamo.assume_constant_result
def _fp8_block_min_experts() -> int:
    return _switch.get().fp8_block_min_experts


@torch._dynamo.assume_constant_result
def _mxfp4_max_top_k() -> int:
    return _switch.get().mxfp4_max_top_k


@torch._dynamo.assume_constant_result
def shared_max_tokens() -> int:
    """Switch.shared_max_tokens in force."""
    return _switch.get().shared_max_tokens


@torch._dynamo.assume_constant_result
def _shared_quantized_max_tokens() -> int:
    return _switch.get().shared_quantized_max_tokens


@torch._dynamo.assume_constant_result
def _shared_quantized_formats() -> tuple[str, ...]:
    return _switch.get().shared_quantized_formats


def merges_shared(T: int, top_k: int, quant: str, num_experts: int) -> bool:
    """Whether ``shuffled`` runs a plain shared expert in the fused decode launches of a top-k
    layer's routed experts (stored in the weight format ``quant``) at T tokens."""
    if quant == "none":
        most = shared_max_tokens()
    else:
        most = _shared_quantized_max_tokens() if quant in _shared_quantized_formats() else 0
    # fp8 rowwise: fused whenever merged (the fp8 rule weighs the unmerged fused path)
    return T <= most and use_fused(T * top_k, top_k, "none" if quant == "fp8_rowwise" else quant,
                                   num_experts)


def use_fused(num_pairs: int, top_k: int = 1, quant: str = "none", num_experts: int = 0,
              batch_invariant: bool = False, device: str = "") -> bool:
    """Whether ``shuffled`` runs A = num_pairs pairs of a top-``top_k`` layer of ``num_experts``
    experts in the weight format ``quant`` (one the fused kernels read) through the fused
    decode kernels on the GPU named ``device`` ("": none named). Never in batch-invariant mode:
    the split-K factor follows A, and with it the sum order."""
    if batch_invariant or num_pairs > _max_pairs() or top_k > _max_top_k():
        return False
    T = num_pairs // max(top_k, 1)
    if quant == "fp8_rowwise":
        return (_fp8() or (top_k >= _fp8_min_top_k() and num_pairs <= _fp8_max_pairs())
                or (top_k == 1 and num_experts >= _fp8_top1_min_experts()
                    and T <= _fp8_top1_tokens(device)))
    most = _weight_only_tokens()
    if quant == "mxfp4":
        return (top_k <= _mxfp4_max_top_k() or T == 1) and T <= 2 * most
    if quant == "fp8_w8a16":
        return T <= most or (T <= 2 * most and 2 * num_pairs <= num_experts)
    if quant == "fp8_block":
        return T <= _fp8_block_tokens() and num_experts >= _fp8_block_min_experts()
    return True


INTERPRETER_SMS = 8  # the SM count plans are made for under the interpreter


@torch._dynamo.assume_constant_result
def down_quantizes(rows: int, E: int, D: int, I: int, dtype: torch.dtype, device: torch.device,
                   quant: str) -> bool:
    """Whether the fused decode's down quantizes fp8 rowwise rows of a itself: where its tiles
    for ``rows`` rows of a (pairs, plus a merged shared expert's tokens) over E experts of w2
    [E, D, I] (stored in ``dtype``) on ``device`` hold one pair. There gate_up stores a in
    float32 and no program of it waits for its m-tile's others to quantize their rows (H200,
    CUDA graphs, fp8 rowwise, down's one-pair tiles, us, quantized by gate_up / by down:
    Maverick TP8 T = 1 24.9 / 23.0, Qwen3-30B-A3B T = 2 35.3 / 34.2, T = 4 51.6 / 50.9; equal at
    Maverick T = 4; results/probe_a_in_down.json). MMA tiles keep (q, scale): quantized in
    registers, their a operand lost its pipelined loads (Qwen3 T = 1 27.4 -> 31.3). A constant
    to torch.compile."""
    if quant != "fp8_rowwise":
        return False
    sms = _device_sms(device) if device.type == "cuda" else INTERPRETER_SMS
    return select(rows, E, D, I, dtype, sms, quant, _device_name(device)).down.block_m == 1


def select(A: int, E: int, D: int, I: int, dtype: torch.dtype, sms: int,
           quant: str = "none", device: str = "") -> DecodeConfig:
    """Tiles for A pairs over E experts (w13 [E, 2I, D], w2 [E, D, I] stored in ``dtype``, in
    the weight format ``quant``) on ``sms`` SMs of the GPU named ``device`` ("": none named)."""
    key = (A, E, D, I, dtype, sms)
    chosen = _override.get()
    if chosen is not None:
        return chosen if isinstance(chosen, DecodeConfig) else chosen(key)
    return planned(key, quant, device)


def planned(key: Key, quant: str = "none", device: str = "") -> DecodeConfig:
    """What ``select`` returns without an override: the row for the key and format that the
    GPU ``device`` has of its own (BY_DEVICE), else the base table's (TABLE), else ``untuned``."""
    if quant == "fp8_w8a16":
        return _w8a16(*key, device)
    return _choose(*key, device)


def untuned(key: Key, quant: str = "none", device: str = "") -> DecodeConfig:
    """What the GPU ``device`` runs for a key without a row of its own (tune_decode's baseline):
    the base table's row on a GPU other than BASE_DEVICE; else the heuristic, or for fp8_w8a16
    ``w8a16_rule``."""
    if device and device != BASE_DEVICE:
        return planned(key, quant)
    return w8a16_rule(key) if quant == "fp8_w8a16" else heuristic(key)


def table_key(A: int, E: int, D: int, I: int, dtype: torch.dtype, sms: int,
              quant: str = "none") -> tuple:
    """The tuning table's key: (SMs, E, D, I, weight dtype name, A rounded up to a power of
    two); fp8_w8a16 rows, whose weights are e4m3 like fp8 rowwise's but whose activations stay
    bf16, name the format in the dtype's place."""
    name = quant if quant == "fp8_w8a16" else str(dtype).removeprefix("torch.")
    return (sms, E, D, I, name, 1 << max(A - 1, 0).bit_length())


def table_changed() -> None:
    """Forget the rows already read (after a change to TABLE: tests, tune_decode)."""
    _choose.cache_clear()
    _w8a16.cache_clear()


def _row(key: tuple, device: str) -> DecodeConfig | None:
    row = BY_DEVICE.get(device, {}).get(key) or TABLE.get(key)
    if row is None:
        return None
    return DecodeConfig(GemmConfig(*row[0]), GemmConfig(*row[1]), pdl=row[2])


@functools.lru_cache(maxsize=None)
def _choose(A: int, E: int, D: int, I: int, dtype: torch.dtype, sms: int,
            device: str = "") -> DecodeConfig:
    key = (A, E, D, I, dtype, sms)
    return _row(table_key(*key), device) or heuristic(key)


@functools.lru_cache(maxsize=None)
def _w8a16(A: int, E: int, D: int, I: int, dtype: torch.dtype, sms: int,
           device: str = "") -> DecodeConfig:
    key = (A, E, D, I, dtype, sms)
    return _row(table_key(*key, quant="fp8_w8a16"), device) or w8a16_rule(key, device)


# fp8_w8a16 without a one-pair row in the fp8 table: one pair a tile, 256 bytes of K a step.
W8A16_GEMV = GemmConfig(32, 256, 1, 4, 2, block_m=1)


def w8a16_rule(key: Key, device: str = "") -> DecodeConfig:
    """fp8_w8a16 shapes without a row of their own: fp8_w8a16 streams the bytes fp8 rowwise
    streams, and its one-pair tiles (block_m = 1) multiply the same way on the CUDA cores (e4m3
    to fp32), so it takes the fp8 table's one-pair tiles; in place of that table's 16-pair MMA
    tiles, tuned for fp8 dots, it takes W8A16_GEMV, split to fill the SMs (the rule before the
    format's own rows: results/probe_weight_only.json)."""
    A, E, D, I, dtype, sms = key
    row = _choose(*key, device)
    gemms = []
    for g, (N, K) in ((row.gate_up, (I, D)), (row.down, (D, I))):
        if g.block_m != 1:
            tiles, steps = min(E, A) * -(-N // W8A16_GEMV.block_n), -(-K // W8A16_GEMV.block_k)
            g = W8A16_GEMV.with_(split_k=split_for(tiles, steps, sms))
        gemms.append(g)
    return DecodeConfig(*gemms, pdl=row.pdl)


def heuristic(key: Key) -> DecodeConfig:
    """The rule for shapes the table does not hold (a function of the key, as ``override``
    takes: benchmarks compare it with the table)."""
    return _heuristic(*key)


MIN_STEPS_PER_SPLIT = 2  # a split shorter than this spends more on its fixup than it streams


def split_for(tiles: int, k_steps: int, sms: int) -> int:
    """The smallest split that gives every SM a program (tiles * split >= sms), at least
    MIN_STEPS_PER_SPLIT K steps per split."""
    want = -(-sms // max(tiles, 1))
    return max(1, min(want, k_steps // MIN_STEPS_PER_SPLIT))


@functools.lru_cache(maxsize=None)
def _heuristic(A: int, E: int, D: int, I: int, dtype: torch.dtype, sms: int) -> DecodeConfig:
    # 256 bytes of K per weight row and step; 3 stages keep 96 KB (gate_up: 2 x 64 rows) of one
    # program's weights in flight and leave room for two programs per SM.
    rows, bk, bm, stages = (64, 64), 256 // dtype.itemsize, 16, 3
    if dtype == torch.uint8:  # mxfp4: see MXFP4_GEMV
        rows, bk, bm, stages = MXFP4_GEMV, 512, 1, 2
    active = min(E, A)
    configs = []
    for (N, K), bn in zip(((I, D), (D, I)), rows):
        tiles = active * -(-N // bn)
        configs.append(GemmConfig(bn, bk, split_for(tiles, -(-K // bk), sms), 4, stages, bm))
    return DecodeConfig(*configs)


# mxfp4 (uint8, two values a byte): one pair a tile (_mxfp4_gemv), 256 bytes of K a step, rows a
# tile (gate_up's, down's) = (32, 16) at every size, K split to fill the SMs. H100, the layer in
# CUDA graphs (results/probe_mxfp4_gemv_df7fc0e.json: coordinate descent over 10 tiles a GEMM,
# Scout and Maverick TP8 at T = 1, 4, 8, Qwen3-30B-A3B, Mixtral TP2 and gpt-oss-120b at T = 1):
# no one tile wins every row and neighbours lie within the run's noise (~5%), but against each
# row's best, gate_up's 32 rows average 1.05x and down's 16 rows 1.03x, where the rule before
# (32 rows, 16 once gate_up's tiles outnumber the SMs, for both) lost up to 1.35x (gpt-oss
# 67.3 us against 49.3, Mixtral 84.3 against 66.8).
MXFP4_GEMV = (32, 16)
