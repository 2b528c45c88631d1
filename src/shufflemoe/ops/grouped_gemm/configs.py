"""Tile configurations for the grouped GEMM kernel: a deterministic heuristic, no autotuning.

The host knows M (rows allocated), N, K, G and the dtype, never the group sizes (they live on the
device), so the key is (M rounded up to a power of two, N, K, G, dtype). From it: the average
rows per group M / G and the groups that can be active, min(G, M). Decode (a few rows per
expert) streams weights and is memory bound; prefill (hundreds of rows per expert) is compute
bound. The choices come from sweeps on an H100 (benchmarks/tune_grouped_gemm.py, numbers in
benchmarks/notes/grouped_gemm.md). Tests and benchmarks replace the choice with ``override``.

Inside ``batch_invariant()`` a row's result must not depend on what else is in the batch. The
kernel has no split-K, and every tile it runs sums an output element the same way: fp32
accumulation of the K dimension in ascending k16 MMA steps (wgmma), whatever the tile's width,
K step, operand roles (swap_ab) or the rows beside it. So up to BATCH_INVARIANT_ROWS rows the
choice is the heuristic's, above them one wide tile per (N, K, dtype) (batch_invariant_config);
mxfp4's tiles all keep K's order in this mode (no run_order, which groups other products into
each k16 step).
Measured on an H100 (benchmarks/results/probe_bi.json): Llama 4 Scout TP8 and Qwen3-30B-A3B
rows are the same bits alone, among 8 and among 96 tokens under 64x128 tiles and under the
decode heuristic, 64x64 and 64x32 tiles, K steps x2 and x4; tests/test_batch_invariant.py
checks rows across the switch on the GPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch


@dataclass(frozen=True)
class TileConfig:
    block_m: int  # rows (tokens) per tile
    block_n: int  # output columns per tile
    block_k: int  # reduction step
    num_warps: int = 4
    num_stages: int = 3  # software-pipeline depth of the K loop
    # Compute (W x^T)^T: the weight tile becomes the MMA's M side (wgmma needs 64 rows per warp
    # group) and a few tokens its N side (8..256), so decode tiles of 16 tokens still use wgmma.
    swap_ab: bool = False
    ctas_per_sm: int = 1  # persistent programs per SM; 2 lets one hide the other's tile start
    flatten: bool = False  # one software-pipelined loop over (tile, k) instead of a loop nest
    # TMA loads where the shapes allow: "host" (descriptors passed as kernel arguments), "device"
    # (made by each program: ~2 us more per launch on an H100, 66.3 vs 63.6 us for a 168 MB
    # decode GEMM) or "none" (masked pointer loads)
    tma: str = "host"
    # mxfp4: the K loop in ops.quantize.kernel.mxfp4_run_order (select() sets it, see there)
    run_order: bool = False
    # The K step's loads and dots in this many parts (block_k / k_parts values each) inside one
    # pipelined loop step: fewer registers for a dequantized weight tile, the same bytes a stage
    k_parts: int = 1
    # A group's last m-tile takes up to tail_m rows past its block_m, multiplied by the same
    # weight tile in a second, swapped dot (its MMAs the rows it has): a group of up to block_m +
    # tail_m rows reads its weights once. 0: none. Not with swap_ab or a GLU.
    tail_m: int = 0

    def with_(self, **changes) -> "TileConfig":
        return replace(self, **changes)


# The SMs of the GPUs the rules below were measured on (H100 SXM; the H200 has as many). Their tile
# counts scale with the caller's SMs (a 114-SM H100 PCIe gets its own waves).
TUNED_SMS = 132
Key = tuple[int, int, int, int, torch.dtype]  # (M bucket, N, K, G, dtype)
_override: contextvars.ContextVar[TileConfig | Callable[[Key], TileConfig] | None] = (
    contextvars.ContextVar("shufflemoe_grouped_gemm_config", default=None))
_invariant: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "shufflemoe_grouped_gemm_batch_invariant", default=False)


@contextlib.contextmanager
def override(config: TileConfig | Callable[[Key], TileConfig]) -> Iterator[None]:
    """Use ``config`` (or ``config(key)``) instead of the heuristic inside the block."""
    token = _override.set(config)
    try:
        yield
    finally:
        _override.reset(token)


def overridden() -> bool:
    """Whether an ``override`` is in force (the layer records launch plans only outside one)."""
    return _override.get() is not None


def invariant() -> bool:
    """Whether select() is in batch-invariant mode (``batch_invariant()``)."""
    return _invariant.get()


@contextlib.contextmanager
def batch_invariant() -> Iterator[None]:
    """Inside the block, select() returns batch_invariant_config(N, K, dtype) above
    BATCH_INVARIANT_ROWS rows whatever G (an ``override`` still wins)."""
    token = _invariant.set(True)
    try:
        yield
    finally:
        _invariant.reset(token)


# Batch-invariant mode: the heuristic's tiles up to this many rows (decode: batch-invariant Scout
# TP8 at T = 1 43.3 us against 67.9 with the wide tiles, the default mode 37.8; Qwen3-30B-A3B
# 62.2 / 70.5 / 43.2, H100, probe_bi), the wide tile above.
BATCH_INVARIANT_ROWS = 64


@functools.lru_cache(maxsize=None)
def batch_invariant_config(N: int, K: int, dtype: torch.dtype) -> TileConfig:
    """The wide tile of batch-invariant mode above BATCH_INVARIANT_ROWS rows, one per (N, K,
    dtype): 64 x 128 (the heuristic's fp8 choice for 17 to 64 rows per group, a middle between
    its decode and prefill tiles). fp32's configuration is already independent of M."""
    if dtype == torch.float32:
        return _heuristic(1, N, K, 1, dtype)
    bk = 128 if dtype == torch.float8_e4m3fn else 64
    return TileConfig(64, 128, bk, num_stages=4, ctas_per_sm=2)


def m_bucket(M: int) -> int:
    """M rounded up to a power of two (at least 1): one compiled choice per bucket."""
    return 1 << max(M - 1, 0).bit_length()


def select(M: int, N: int, K: int, G: int, dtype: torch.dtype, quant: str = "none",
           sms: int = TUNED_SMS) -> TileConfig:
    """The tile configuration for x [M, K] in ``dtype`` against G groups of [N, K] weights in
    the weight format ``quant``, on a GPU of ``sms`` SMs."""
    key = (m_bucket(M), N, K, G, dtype)
    chosen = _override.get()
    if chosen is not None:
        return chosen if isinstance(chosen, TileConfig) else chosen(key)
    invariant = _invariant.get()
    if invariant and M > BATCH_INVARIANT_ROWS:
        return batch_invariant_config(N, K, dtype)
    cfg = _for_format(*key, quant, sms, invariant)
    G = max(G, 1)
    if (quant == "none" and not cfg.swap_ab and cfg.block_m == 128 and -(-M // G) <= MID_SWAP_ROWS
            < -(-key[0] // G) <= 64):
        return _heuristic(32 * G, N, K, G, dtype, sms)  # the swapped tile of 32 rows a group
    return cfg


# The lower half of the 64-row bucket: groups averaging 33-48 rows take the swapped 64-row tile
# of 32 rows a group, not the 128 x 128 one the bucket's 64 rows give (its x box loads 128 rows
# whatever a group holds, and each of a wide GEMM's column tiles loads them again). H200, the
# layer in CUDA graphs (benchmarks/probe_decode_glue.py --set tiles, results/
# probe_decode_glue_tiles_c1bb07b.json; 128 x 128 / swapped 64-row, us): Mixtral TP2 bf16 T = 160
# (40 rows) 428.5 / 360.3, T = 192 (48) 423.5 / 365.0, T = 224 (56) 420.8 / 396.5, T = 256 (64)
# 413.0 / 430.2; Mixtral TP1 T = 160 835.9 / 698.0, T = 256 807.1 / 847.6; gpt-oss-120b bf16 T =
# 1280 (40) 1966.6 / 1760.4, T = 1536 (48) 1985.3 / 1834.4, T = 2048 (64) 2022.7 / 2139.0.
MID_SWAP_ROWS = 48


@functools.lru_cache(maxsize=None)
def _for_format(M: int, N: int, K: int, G: int, dtype: torch.dtype, quant: str, sms: int,
                invariant: bool) -> TileConfig:
    """The heuristic's tile for the key, changed for the weight format by the rules below; once
    a key (each change copies the frozen config: ~4 us of host time a call uncached)."""
    cfg = _heuristic(M, N, K, G, dtype, sms)
    rows = -(-M // max(G, 1))  # average rows per group, an upper bound
    if quant in FORMAT_PREFILL_TILES and rows > 64:
        cfg = FORMAT_PREFILL_TILES[quant]
    if quant == "mxfp4" and cfg.swap_ab and cfg.block_n == 128 and K >= MXFP4_DEEP_K:
        if cfg.block_m == 16:
            cfg = cfg.with_(block_k=MXFP4_DEEP_BLOCK_K)
        else:
            cfg = cfg.with_(num_stages=5)
    if (quant in WEIGHT_ONLY_MID_FORMATS and 32 < rows <= 64 and G > 1
            and (quant != "mxfp4" or min(G, M) * -(-N // WEIGHT_ONLY_MID_TILE.block_n) > 2 * sms)):
        cfg = WEIGHT_ONLY_MID_TILE
    if quant == "mxfp4" and cfg.swap_ab and cfg.block_m == 16 and rows > 8 and G > 1:
        cfg = MXFP4_MID_TILE
    if quant == "mxfp4" and cfg.swap_ab and cfg.block_m == 16 and not invariant:
        cfg = cfg.with_(run_order=True)
    if quant == "fp8_w8a16" and cfg.swap_ab and cfg.block_n == 128 and cfg.block_m == 16:
        cfg = cfg.with_(block_k=W8A16_BLOCK_K, block_m=32 if rows > 8 else 16)
    return _three_an_sm(cfg, M, N, K, G, quant, sms)


# mxfp4 weights (half a byte a value) on the memory-bound swapped 16 x 128 tiles: where K is deep,
# 256 values a K step (128 bytes of each weight row) instead of bf16's 128. H100, the layer in
# CUDA graphs, routed GEMMs only (results/probe_mxfp4_df01fac.json, "gemm" rows, both GEMMs on
# 256 values): Mixtral TP2 (K = 4096 / 7168) T = 16 / 64 1.05 / 1.07x, Llama 4 Scout TP8 (5120 /
# 1024) 1.03 / 1.04x, Maverick 0.99 / 1.00x, Qwen3-30B-A3B (2048 / 768, 3 to 8 steps of 256)
# 0.94 / 0.96x: so only K >= 4096. Swapped 64-row tiles (17 to 64 rows a group) keep the 128-value
# step, 5 stages deep: their x tile is four times larger, and 256-value steps left fewer stages in
# flight (H200, Mixtral TP2 T = 128, 401.2 -> 332.2 us; results/probe_mxfp4_dot_db73eed.json
# against _aea5878.json, the other rows within 1%).
MXFP4_DEEP_K = 4096
MXFP4_DEEP_BLOCK_K = 256


# ... and the swapped 16-row tiles read each 16-byte run of bytes in mxfp4_run_order (one matrix
# load a thread where four single bytes were; x's tile permuted alike in registers). H200, the
# layer in CUDA graphs (results/probe_mxfp4_dot_586f581.json against _b03ef05.json, us): Qwen3-
# 30B-A3B T = 8 / 64 117.0 -> 110.4 / 245.6 -> 238.7, gpt-oss-120b 310.8 -> 284.9 / 1040.1 ->
# 958.4, Mixtral TP2 T = 64 396.1 -> 373.9, Scout TP8 T = 64 118.4 -> 115.2. Not on wider tiles:
# there x's tile is 64 rows or more, and its permutation through registers cost more than the
# bytes' loads saved (Mixtral TP2 T = 128, swapped 64-row tiles, 403.0 -> 550.4 us; gpt-oss-120b
# T = 4096, 128 x 128 tiles, 3757 -> 3913; _f46091c.json). Never in batch-invariant mode: the
# k16 steps would group other products than the wide tile's (whose sums must match).


# ... but where the average group holds 9 to 16 rows, one 32-row tile of 256-value steps in K's
# order: a 16-row tile converts a group's weights again for each 16 rows it holds past the first,
# and routing leaves many groups above the average. H200, the layer in CUDA graphs, the routed
# GEMMs changed (results/probe_weight_only_mxfp4_30283d8.json; as shipped / this, us): Mixtral TP2
# T = 64 332.3 / 285.6, Qwen3-30B-A3B T = 256 314.6 / 258.7, Llama 4 Scout TP8 T = 256 156.1 /
# 133.5; in run order 1.02-1.10x slower, 128-value steps within 3%, 8 warps 1.08-1.23x slower; at
# 4 rows a group (Scout and Qwen3 T = 64) the 16-row tiles win by 1.08-1.16x, at 8 rows by 1.09-
# 1.13x, and at 32 rows the swapped 64-row tile wins by 1.27-1.30x
# (results/probe_weight_only_mxfp4_edges_dbe9239.json). One group (a shared expert) fits 16 rows
# in its one tile.
MXFP4_MID_TILE = TileConfig(32, 128, MXFP4_DEEP_BLOCK_K, num_warps=4, num_stages=3, swap_ab=True,
                            ctas_per_sm=2)


# fp8_w8a16 weights (a byte a value, x in bf16) on the memory-bound swapped 16 x 128 tiles: a K
# step of 256 values (256 bytes of each weight row, as fp8's), and 32-row tiles where the average
# group holds more than 8 rows (a 16-row tile streams such a group's weights twice). H100, the
# layer in CUDA graphs, 16 x 128 x 128 / 16 x 128 x 256 / 32 x 128 x 256, us
# (results/probe_weight_only_118acea.json): Llama 4 Scout TP8 T = 16 110.2 / 90.9 / 95.9, T = 64
# 136.6 / 125.2 / 127.5; Maverick TP8 T = 64 341.6 / 321.0 / 321.2; Qwen3-30B-A3B T = 64 277.1 /
# 271.5 / 273.6; Mixtral TP2 (16 rows a group) T = 64 336.3 / 306.7 / 283.8. From 17 rows the
# heuristic's swapped 64 x 128 x 128 tile: H200, the layer in CUDA graphs, routed GEMMs changed
# (results/probe_weight_only_fp8_w8a16_rows_98f68a4.json and _mid_98f68a4.json; 32 x 128 x 256
# / 64 x 128 x 128, us): at 16 rows a group Scout TP8 and Qwen3-30B-A3B T = 256 112.1 / 130.8 and
# 219.4 / 254.4; at 32 rows Mixtral TP2 T = 128 299.8 / 288.0, Qwen3 T = 512 285.0 / 273.3, Scout
# T = 512 158.1 / 145.1.
W8A16_BLOCK_K = 256


# The converted-weight formats (x in bf16) keep that swapped 64 x 128 x 128 tile to 64 rows a
# group, where the heuristic's bf16 choice (128 x 128 with 8 warps, or 64 x 128 unswapped) would
# store each converted weight tile to shared memory for the dot. H200, as above (_mid_98f68a4;
# the heuristic's / this, us): 64 rows a group, fp8_w8a16 Mixtral TP2 T = 256 600.9 / 398.4,
# Qwen3-30B-A3B T = 1024 587.3 / 386.3, Llama 4 Scout TP8 T = 1024 288.5 / 227.9; mxfp4 510.7 /
# 488.3, 507.0 / 422.5, 254.9 / 256.9. mxfp4 keeps 3 stages here at deep K: with the 5 of its
# 32-row rule the layer at baa04c7 gave Mixtral 489.4 and Scout 266.4 (0.96x;
# results/probe_weight_only_mid_baa04c7.json). Routed GEMMs only (G > 1), as measured. mxfp4
# only where its weight tiles (groups x column tiles) outnumber two programs an SM: with 256 (Scout
# TP8's gate_up, Mixtral TP2's down) groups past 64 rows take a second row tile that the 128-row
# one does not, a part-filled second wave. H200, the layer in CUDA graphs, one GEMM's tile taken
# back to the heuristic's (results/probe_ctas_mid_mxfp4_61add82.json, _wide_f910872.json; the
# layer's speed-up): Scout T = 1024 gate_up 1.055x, Mixtral T = 256 down 1.049x; with more tiles
# the heuristic's lost: Qwen3-30B-A3B T = 1024 0.86 / 0.96x (gate_up / down), Mixtral's gate_up
# 0.93x, Scout's down 0.99x, Maverick TP8 T = 8192 0.93 / 0.98x, DeepSeek-V3 TP8 T = 2048 0.91 /
# 0.98x, gpt-oss-120b T = 2048 0.88 / 0.96x; and fp8_w8a16's everywhere (0.72-0.93x).
WEIGHT_ONLY_MID_FORMATS = ("fp8_w8a16", "mxfp4")
WEIGHT_ONLY_MID_TILE = TileConfig(64, 128, 128, num_stages=3, swap_ab=True, ctas_per_sm=2)


# Three programs an SM for the weight-only formats' swapped 16 x 128 tiles where they outnumber
# two programs an SM (expected_tiles: the third program of an SM gets a tile only then), in a K
# range a format. The third program hides the dequantizing loads' latency where registers allow
# it (offline, sm_90: up to 170 a thread fit three programs of 128 threads): mxfp4's 16 x 128 x
# 128 tiles 139 (162 without run order), its deep-K 256-value step in two parts of 128 (k_parts =
# 2) 168 instead of 255 and a spill; fp8_w8a16's 16 x 128 x 128 142 (its 256-value step 198).
# H200, the layer in CUDA graphs with one GEMM changed (results/probe_ctas.json), the layer's
# speed-up: mxfp4 gpt-oss-120b gate_up (K = 2880) 1.05 / 1.07x at T = 8 / 64, its down 1.02 /
# 1.04x, Scout's and Maverick's down (K = 1024) 1.03x, Qwen3-30B-A3B gate_up (2048) 1.00 / 1.06x,
# Mixtral TP2 down in two parts (7168; 366 tiles expected at T = 64) 1.01 / 1.06-1.11x; but
# Qwen3's down (K = 768: six steps) 0.95 / 0.93x; in 256-value steps of two parts (three steps)
# 1.02-1.03 / 1.03-1.04x against two programs before and after (results/probe_ctas_steps_256.json
# at f9c3abf: 112.2 / 111.7 -> 109.3 us at T = 8, 225.9 / 224.8 -> 217.9 at T = 64), hence mxfp4
# below MXFP4_SHORT_K takes those; at K = 1024 and deeper they lost (Scout's and Maverick's down
# 0.97-0.98x, gpt-oss-120b's two GEMMs 0.92-0.97x). fp8_w8a16 at 128-value steps: Qwen3 T = 64
# (K = 2048 / 768) 1.02 / 1.03x, Maverick's down 1.03x, Scout's 1.01x; at deep K its 256-value
# step wins (Maverick's and Mixtral's deep GEMMs 0.97-0.99x), hence K < 4096.
# Where the tiles fill two programs an SM or fewer: mxfp4 Scout TP8's gate_up (256 tiles) 0.88 /
# 0.95x, fp8_w8a16's 0.79 / 0.88x. The rule, the whole layer (results/probe_mxfp4_dot_d156875.json
# against _912b6b0.json; probe_fp8_w8a16_dot_ likewise; a rerun of the parent 0.997-1.011x): mxfp4
# gpt-oss-120b T = 8 / 64 1.12 / 1.12x, Scout TP8 T = 16-128 1.03-1.04x and T = 256 1.22x,
# Maverick TP8 T = 64 / 128 1.04 / 1.05x, Qwen3 T = 64 1.06x, Mixtral TP2 T = 64 1.07x, T = 8
# rows 0.99-1.01x; fp8_w8a16 Scout T = 16-256 1.02-1.05x, Maverick 1.02-1.03x, Qwen3 T = 64 1.06x,
# the rest 0.99-1.01x.
# fp8_block's 16 x 128 tiles (128-value steps, a scale block each: 18 KB a stage, 55.8 KB a
# program of three stages offline, three in 167 KB) at every K: its per-step scale loads are
# latency a third program hides. H200, one GEMM changed (results/probe_ctas_fp8_block.json):
# Qwen3-30B-A3B T = 8 / 64 gate_up 1.05 / 1.03x, down 1.03 / 1.02x; Scout TP8 down 1.05 /
# 1.03x (its gate_up 1.00x at T = 64); Maverick TP8 down T = 8 1.05-1.09x; Mixtral TP2 T = 64
# 1.07 / 1.05x (T = 8 1.00x).
# Maverick TP8 at T >= 16 is even (results/probe_ctas_fp8_block_maverick.json: T = 16 1.02 /
# 0.98x, T = 64 1.03 / 1.04x then 0.95 / 0.96x, T = 128 1.02 / 1.00x), timed before a new
# graph settled (bench.timing._settle): its first replays ran 8-12% slow, more than the rule moves.
THREE_AN_SM_K = {"mxfp4": (768, 1 << 31), "fp8_w8a16": (768, MXFP4_DEEP_K),
                 "fp8_block": (0, 1 << 31)}  # [from, below)
MXFP4_SHORT_K = 1024


# Groups of more than 64 rows (compute bound) in the formats bf16's and fp8 rowwise's 128-row
# tiles serve badly. fp8_block scales each K step's product before adding it, so a tile holds
# that product in a second fp32 accumulator: 128 x 256 (and 128 x 128) with 8 warps spill
# (ptxas, sm_90), and fp8's mid-size tile (64 x 128, 4 warps, two programs an SM) runs fastest.
# fp8_w8a16 and mxfp4 convert the weight tile in registers: swapped, it is the wgmma's register
# operand instead of a tile stored back to shared memory for the dot. H200, the layer in CUDA
# graphs, checked against float64 (benchmarks/probe_prefill_formats.py at dab6d54,
# results/probe_prefill_formats_dab6d54.json; the heuristic's tiles -> these, us): fp8_block
# Mixtral TP2 T = 2048 3447 -> 1255, Qwen3-30B-A3B T = 2048 910 -> 581, Llama 4 Scout TP8 T =
# 16384 3350 -> 2004; fp8_w8a16 2554 -> 1578, 717 -> 583, 2554 -> 2042; mxfp4 2497 -> 1943, 738 ->
# 626, 2536 -> 2221 (bf16 1362, 477, 1848; fp8 rowwise 806, 331, 1469). Swapped 256 x 128 tiles
# were faster still where groups pass 256 rows (fp8_w8a16 Mixtral 1504, Scout 1929) but wrong
# on Qwen3's down GEMM (garbage tiles in every run; the kernel refuses them, kernel.SWAP_MAX_ROWS).
FORMAT_PREFILL_TILES = {
    "fp8_block": TileConfig(64, 128, 128, num_stages=4, ctas_per_sm=2),
    "fp8_w8a16": TileConfig(128, 256, 64, num_warps=8, num_stages=3, swap_ab=True),
    "mxfp4": TileConfig(128, 256, 64, num_warps=8, num_stages=3, swap_ab=True),
}


@functools.lru_cache(maxsize=None)
def expected_tiles(M: int, G: int, block_m: int) -> float:
    """Row tiles expected over G groups when M rows route uniformly (a group's rows Poisson with
    mean M / G): G x E[ceil(rows / block_m)]."""
    lam = M / max(G, 1)
    return G * sum(math.exp(i * math.log(lam) - lam - math.lgamma(i + 1)) * -(-i // block_m)
                   for i in range(1, M + 1))


def _three_an_sm(cfg: TileConfig, M: int, N: int, K: int, G: int, quant: str,
                 sms: int) -> TileConfig:
    """cfg with three programs an SM where the rule above takes them (cfg itself elsewhere)."""
    low, high = THREE_AN_SM_K.get(quant, (0, 0))
    if not (cfg.swap_ab and cfg.block_m == 16 and cfg.block_n == 128 and low <= K < high):
        return cfg
    if expected_tiles(M, G, cfg.block_m) * -(-N // cfg.block_n) <= 2 * sms:
        return cfg
    if quant == "mxfp4":
        block_k = MXFP4_DEEP_BLOCK_K if K < MXFP4_SHORT_K else cfg.block_k
        return cfg.with_(block_k=block_k, k_parts=block_k // 128, ctas_per_sm=3)
    return cfg.with_(block_k=128, ctas_per_sm=3)


# The rows a group's last 128 x 256 prefill tile takes past its 128 (TileConfig.tail_m).
TAIL_ROWS = 32

# Decode: spread the active groups' weights over at least this many tiles on TUNED_SMS SMs (about
# 2 programs on each); with fewer 64-column tiles than SMs, each program goes deep instead.
_DECODE_TILES = 256


@functools.lru_cache(maxsize=None)
def _heuristic(M: int, N: int, K: int, G: int, dtype: torch.dtype,
               sms: int = TUNED_SMS) -> TileConfig:
    """Measured on an H100 (benchmarks/notes/grouped_gemm.md has the numbers behind each rule)."""
    if dtype == torch.float32:
        # fp32 runs as IEEE fp32 FMAs (tf32 would lose 13 bits); 8 warps keep it out of spills.
        return TileConfig(64, 64, 32, num_warps=8, num_stages=3)
    fp8 = dtype == torch.float8_e4m3fn
    bk = 128 if fp8 else 64  # 128 bytes of K per row: one TMA swizzle line
    rows = -(-M // max(G, 1))  # average rows per group, an upper bound
    active = min(G, M)  # groups that can be non-empty
    if rows <= 16:
        # Memory bound: 16-token tiles, weights as the wgmma M side (swap_ab), two programs per
        # SM; all such choices land within 2% of each other on the spec's decode shapes.
        if active * -(-N // 128) >= _DECODE_TILES * sms // TUNED_SMS:
            return TileConfig(16, 128, 2 * bk, num_stages=3, swap_ab=True, ctas_per_sm=2)
        if active * -(-N // 64) < sms:
            # Fewer weight tiles than SMs (one token on one of Scout's 16 experts): a program is
            # bound by the bytes it has in flight, so 4 stages of 256-byte K steps keep 128 KB of
            # its tile coming (fp8's 512-element steps exceed a TMA box: pointer loads). Scout
            # T=1 GEMM13 bf16 17.0 -> 13.1 us, fp8 11.9 -> 8.8; GEMM2 bf16 7.9 -> 6.9 (H100).
            return TileConfig(16, 64, 4 * bk, num_stages=4, swap_ab=True,
                              tma="none" if fp8 else "host")
        return TileConfig(16, 64, 2 * bk, num_stages=3, swap_ab=True, ctas_per_sm=2)
    if rows <= 64:
        # With real (uneven) routing 64-row tiles beat 32-row swapped ones by 0-20% (Qwen2 GEMM2
        # at batch 512: 128 us vs 152); on equal groups they lose 2-5%. For 16-bit x, 256-byte
        # K steps do better still: swapped 64-row tiles to 32 rows a group, 128 x 128 ones
        # past it where K is long. H100, the whole layer in CUDA graphs (probe_mid_tiles at
        # 184cbb5 / 4b685a3), these / the 64 x 128 x bk tiles, us: Mixtral TP2 T = 128 (32
        # rows) 505.0 / 531.4, T = 256 (64) 559.8 / 586.8; Qwen3-30B-A3B T = 512 (32) 484.6 /
        # 494.6; Llama 4 Scout TP8 T = 512 (32) 233.0 / 238.6, T = 1024 (64) 274.2 / 281.9. At K
        # = 640 the 128 x 128 tiles lost (grouped_gemm_sweep at c66528c, Qwen2-57B TP4 GEMM2 at
        # batch 512: 136.8 us against 127.1). fp8 keeps the 64 x 128 x bk tiles: the swapped
        # ones lost there (Qwen3 T = 512 298.7 / 279.4), 128 x 128 gained 0.2-2%.
        if not fp8 and rows <= 32:
            return TileConfig(64, 128, 2 * bk, num_stages=3, swap_ab=True, ctas_per_sm=2)
        if not fp8 and K >= 2048:
            return TileConfig(128, 128, 2 * bk, num_warps=8, num_stages=3)
        return TileConfig(64, 128, bk, num_stages=4, ctas_per_sm=2)
    if rows <= 128:
        if active * -(-N // 256) >= 4 * sms:
            # Many weight tiles and uneven groups (Llama 4 Maverick TP8 prefill: 128 experts,
            # 16384 tokens): 128x256 tiles beat the 128x128 ones below, a group's second, nearly
            # empty m-tile costing half as much (H100, results/probe_prefill.json: GEMM2 bf16
            # 638 -> 576 us, fp8 414 -> 334; GEMM13 1107 -> 1084, fp8 596 -> 571). On the
            # grouped_gemm suite's equal groups of exactly 128 rows they lose 4% (bf16 1014 ->
            # 1057 us, 0.99x torch._grouped_mm); routed groups are uneven. With few weight tiles
            # (Scout at T = 2048: 16 experts) they leave SMs idle (GEMM13 bf16 125 -> 141 us).
            # A group's last tile takes up to TAIL_ROWS rows more in a second, swapped dot
            # against the same weight tile, on the tiles whose group has them (no flattened
            # loop: its two accumulators serialize the flattened loop's wgmma), so most groups
            # of 128 +- 11 rows read their weights once. H200, the routed GEMMs alone
            # (probe_tail_tiles at d365642; flattened without tail rows / with them, us): on
            # uniform routing Maverick TP8 T = 16384 GEMM13 bf16 953 / 917, fp8 511 / 488;
            # GEMM2 bf16 514 / 481, fp8 310 / 293; Qwen3-30B-A3B T = 2048 GEMM13 bf16 304 /
            # 292, fp8 176 / 167, GEMM2 bf16 168 / 161, fp8 105 / 103. On equal groups of
            # exactly 128 rows (no tile has tail rows) they lose 1-21% (Maverick GEMM2 fp8 257
            # / 310), but stay 1.06-1.10x torch._grouped_mm (grouped_gemm suite at d365642).
            # In the layer suite at db405ba (tail dots on every last tile): Qwen3 T = 2048
            # fp8_w8a16 834 -> 686 us, mxfp4 761 -> 720, Maverick prefill bf16 1.02x, fp8 1.01x;
            # but fp8_block 918 -> 1604 (each K step's product scaled before it is added,
            # twice). The three formats now take FORMAT_PREFILL_TILES here instead.
            # Four stages, not three: more weight bytes in flight (H200, probe_tail_tiles at
            # fb637d6, three / four stages, us: routed Maverick GEMM13 bf16 900 / 872, GEMM2 512
            # / 459, fp8 287 / 281; Qwen3 GEMM2 bf16 158 / 153; equal groups 0-5% faster).
            return TileConfig(128, 256, bk, num_warps=8, num_stages=4, tail_m=TAIL_ROWS)
        if (fp8 and K <= 2048) or active * -(-N // 128) >= 4 * sms:
            # Two programs an SM where 128-column tiles are many (uneven groups leave a nearly
            # empty second m-tile in about half of them). H100, tune_grouped_gemm's sweep points
            # (the batch sweep's random top-k routing, 40 reps; 128x128 with 2 x bk, 8 warps / this,
            # us): Qwen2-57B TP4 GEMM13 at batch 1024 (64 experts, N 1280) bf16 276.0 / 265.6,
            # fp8 176.0 / 139.2 (torch._scaled_grouped_mm 148.2); Llama 4 Scout TP8 GEMM2 at 2048
            # (16 experts, N 5120) bf16 86.7 / 81.3. Scout's GEMM13 there (256 tiles) keeps the
            # 8-warp tiles: 143.2 against 153.2.
            return TileConfig(128, 128, bk, num_stages=3, ctas_per_sm=2)
        return TileConfig(128, 128, 2 * bk, num_warps=8, num_stages=3)
    # Compute bound: 128x256 tiles, two consumer warp groups; the flattened loop overlaps a tile's
    # epilogue with the next tile's first loads (K=1024 bf16: 268 us instead of 281), and a
    # fourth stage feeds them a little better (Scout TP8 prefill, probe_prefill.json: GEMM13 bf16
    # 507 / 509 us, fp8 286 -> 278; GEMM2 storing into out 275 -> 269, fp8 197 -> 190).
    return TileConfig(128, 256, bk, num_warps=8, num_stages=4, flatten=True)


# Prefill tile schedules to measure before any becomes a rule: benchmarks/decode_check.py times
# each (as configs.override(...) on the whole layer) at T = 16384 against dense cuBLAS; the
# heuristic above does not use them. Maverick's 128 rows per expert make its GEMMs memory bound
# at 128-row tiles (128 FLOP per weight byte, under an H100's ~260), Scout's 1024 compute bound.
# block_k is for 2-byte types; prefill_candidate() doubles it for fp8 (the same bytes per row).
PREFILL_CANDIDATES: dict[str, TileConfig] = {
    "128x256x64 w8 s3 flat": TileConfig(128, 256, 64, num_warps=8, num_stages=3, flatten=True),
    "128x256x64 w8 s4 flat": TileConfig(128, 256, 64, num_warps=8, num_stages=4, flatten=True),
    "256x128x64 w8 s3 flat": TileConfig(256, 128, 64, num_warps=8, num_stages=3, flatten=True),
    "128x128x64 w8 s4 flat": TileConfig(128, 128, 64, num_warps=8, num_stages=4, flatten=True),
    "128x128x64 w4 s4 cta2": TileConfig(128, 128, 64, num_warps=4, num_stages=4, ctas_per_sm=2),
    "128x128x128 w8 s3": TileConfig(128, 128, 128, num_warps=8, num_stages=3),
}


def prefill_candidate(name: str, dtype: torch.dtype) -> TileConfig:
    """PREFILL_CANDIDATES[name] for ``dtype`` (fp8: twice the block_k)."""
    cfg = PREFILL_CANDIDATES[name]
    return cfg.with_(block_k=2 * cfg.block_k) if dtype == torch.float8_e4m3fn else cfg
