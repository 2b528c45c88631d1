"""When the fused decode path runs, and with which tiles: deterministic heuristics, no autotuning.

Two choices, each a frozen dataclass that tests and benchmarks replace with ``override``:

- ``Switch``: the ``shuffled`` strategy takes the fused path while A = T * k <= max_pairs, for
  layers with k <= max_top_k, and for fp8 layers only if ``fp8``. Measured on an H100
  (benchmarks/results/probe_combine.json, CUDA-graph replays, fused vs the unfused path with
  its deterministic token-major combine, T = 1..8): bf16 Llama 4 Scout TP8 1.02-1.05x faster,
  Qwen3-30B-A3B (k = 8) 1.01-1.02x, Mixtral TP2 (k = 2) 0.99-1.03x, and the eager call costs the
  host less in 23 of 24 cases; fp8 rowwise 0.85-0.92x (its in-kernel quantization of a's rows costs more
  than the launches it saves). So the default fuses every bf16 layer, not fp8 ones.
- ``DecodeConfig``: tiles and split-K factors of the two fused GEMMs. The host knows A, E, D, I
  and the dtype, never the group sizes, so it plans for min(E, A) active experts: weight tiles =
  active experts x cdiv(N, block_n). The choice comes from the tuning table (tuned.py, written by
  benchmarks/tune_decode.py from a sweep on a GPU with that many SMs) for a shape it holds, A
  rounded up to a power of two; else from the heuristic: with fewer tiles than SMs, K is split
  until every SM streams weights (Llama 4 Scout TP8 at T = 1: one expert, 16 tiles of 64 gate +
  64 up rows for 132 SMs).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from .tuned import TABLE


@dataclass(frozen=True)
class Switch:
    max_pairs: int = 64  # fused while A = T * k <= max_pairs
    max_top_k: int = 1 << 30  # ... for layers with k <= max_top_k
    fp8: bool = False  # ... and fp8 layers only when True


ALWAYS = Switch(max_pairs=1 << 30, max_top_k=1 << 30, fp8=True)  # tests and benchmarks
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


def use_fused(num_pairs: int, top_k: int = 1, fp8: bool = False,
              batch_invariant: bool = False) -> bool:
    """Whether ``shuffled`` runs A = num_pairs pairs of a top-``top_k`` layer (fp8 rowwise or
    not) through the fused decode kernels. Never in batch-invariant mode: the split-K factor
    follows A, and with it the sum order."""
    return (not batch_invariant and num_pairs <= _max_pairs() and top_k <= _max_top_k()
            and (_fp8() or not fp8))


def select(A: int, E: int, D: int, I: int, dtype: torch.dtype, sms: int) -> DecodeConfig:
    """Tiles for A pairs over E experts (w13 [E, 2I, D], w2 [E, D, I] in ``dtype``) on ``sms``
    SMs."""
    key = (A, E, D, I, dtype, sms)
    chosen = _override.get()
    if chosen is not None:
        return chosen if isinstance(chosen, DecodeConfig) else chosen(key)
    return _choose(*key)


def table_key(A: int, E: int, D: int, I: int, dtype: torch.dtype, sms: int) -> tuple:
    """The tuning table's key: (SMs, E, D, I, dtype name, A rounded up to a power of two)."""
    return (sms, E, D, I, str(dtype).removeprefix("torch."), 1 << max(A - 1, 0).bit_length())


@functools.lru_cache(maxsize=None)
def _choose(A: int, E: int, D: int, I: int, dtype: torch.dtype, sms: int) -> DecodeConfig:
    row = TABLE.get(table_key(A, E, D, I, dtype, sms))
    if row is None:
        return heuristic((A, E, D, I, dtype, sms))
    return DecodeConfig(GemmConfig(*row[0]), GemmConfig(*row[1]), pdl=row[2])


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
    size = dtype.itemsize
    bk = 256 // size
    active = min(E, A)
    configs = []
    for N, K in ((I, D), (D, I)):
        tiles = active * -(-N // 64)
        configs.append(GemmConfig(64, bk, split_for(tiles, -(-K // bk), sms)))
    return DecodeConfig(*configs)
