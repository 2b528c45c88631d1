"""The fused decode kernels (and the grouped GEMM's mxfp4, gather and GLU paths, and the
routing's grouped selection) compile for Hopper (sm_90) on any machine: Triton's bundled ptxas
builds them without a GPU, so an error that only the GPU compiler sees (types, layouts, the fp8,
PDL and PTX-dequantization paths the interpreter never takes) fails CI rather than the one GPU
call. Also checks the decode K loop is software-pipelined (cp.async copies) and multiplies on
wgmma.

The compiles run in a child process (this file as a script): the tests' TRITON_INTERPRET=1
replaces triton.jit, and only real JIT functions compile."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys


# Pointers and the widths of real shapes are multiples of 16, as the JIT would specialize them.
DIV16 = ("D", "I", "k_split", "n_tiles", "K", "N")  # as Triton specializes them at launch


def compile_sm90(fn, sig: dict, consts: dict, **options):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    missing = set(fn.arg_names) - set(sig) - set(consts)
    assert not missing, f"test out of date with the kernel's arguments: {missing}"
    consts = {**consts, **{k: None for k, v in sig.items() if v is None}}
    sig = {k: ("constexpr" if v is None else v) for k, v in sig.items()}
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, v in sig.items()
             if v.startswith("*") or k in DIV16}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "num_stages": 3, **options})


def _split_arg(split: int) -> dict:
    """split is a runtime argument, but the JIT specializes the value 1 into a constant."""
    return {} if split == 1 else {"split": "i32"}


def _split_const(split: int) -> dict:
    return {"split": 1} if split == 1 else {}


# weight format -> (weight pointer, its scales' pointer)
WEIGHTS = {"none": ("*bf16", None), "fp8_rowwise": ("*fp8e4nv", "*fp32"),
           "fp8_w8a16": ("*fp8e4nv", "*fp32"), "fp8_block": ("*fp8e4nv", "*fp32"),
           "mxfp4": ("*u8", "*u8")}


def _block_k(quant: str) -> int:
    return 128 if quant in ("none", "fp8_block") else 256


def _shared_k(quant: str) -> int:
    """kernel._shared_k for bf16 activations: the routed step's bytes in bf16 columns."""
    return {"none": 128, "mxfp4": 64}.get(quant, 128)


def _format(fp8: bool | str) -> tuple[str, bool]:
    """(weight format, whether activations are fp8): True is fp8 rowwise, False bf16."""
    quant = fp8 if isinstance(fp8, str) else ("fp8_rowwise" if fp8 else "none")
    return quant, quant in ("fp8_rowwise", "fp8_block")


def gate_up(fp8: bool | str, split: int, rw: bool, pdl: bool, block_m: int = 16,
            oai: bool = False, shared: bool = False, block_k: int | None = None,
            runs: bool = False, quant_a: bool = True, one_token: bool = False):
    """oai: gpt-oss's expert bias and clamped swiglu_oai GLU; shared: a shared expert's tiles
    first, not waiting for the routing (EARLY); runs: a one-pair tile's per-thread runs;
    quant_a False: w8a8's rows of a left in fp32 (for down to quantize); one_token: T = 1, a
    constant as the JIT specializes it, and x ready before the launch (the layer's early: fp8
    rowwise takes x's amax before the PDL wait)."""
    from shufflemoe.ops.moe_decode import kernel

    quant, fp8 = _format(fp8)
    w, ws = WEIGHTS[quant]
    sig = dict(x_ptr="*bf16", w_ptr=w, w_scale_ptr=ws, bias_ptr="*bf16" if oai else None,
               counts_ptr="*i32", alpha="fp32", limit="fp32",
               ids_ptr="*i32", rw_ptr="*fp32" if rw else None,
               a_ptr="*fp32" if fp8 else "*bf16",
               q_ptr="*fp8e4nv" if fp8 and quant_a else None,
               scale_ptr="*fp32" if fp8 and quant_a else None,
               part_ptr="*fp32" if split > 1 else None,
               words_ptr="*i32" if split > 1 or (fp8 and quant_a) else None, E="i32", D="i32",
               I="i32",
               n_tiles="i32", k_split="i32", A="i32", words_rows="i32",
               sw_ptr="*bf16" if shared else None,
               sa_ptr="*bf16" if shared and fp8 else None,
               flag_ptr="*i32" if shared else None, **_split_arg(split),
               **({} if one_token else {"T": "i32"}))
    consts = dict(**({"T": 1} if one_token else {}), SHARED=shared, EARLY=shared, BLOCK_E=16, BLOCK_M=block_m, BLOCK_N=64,
                  BLOCK_K=block_k or _block_k(quant), SHARED_K=_shared_k(quant),
                  **_split_const(split), QUANT=quant, ACT="swiglu_oai" if oai else "silu",
                  HAS_LIMIT=oai, HAS_BIAS=oai, HAS_RW=rw, UPCAST=False,
                  W_TO_X=quant in ("fp8_w8a16", "mxfp4"), DOT_PRECISION="tf32", INTERPRET=False,
                  PDL=pdl, RUNS=runs, QUANT_BLOCK=1024, QUANT_A=quant_a, ROW_BLOCK=4096,
                  ROW_CHUNKS=2, X_READY=one_token)
    return compile_sm90(kernel._gate_up_kernel, sig, consts,
                        **({"launch_pdl": True} if pdl else {}))


def down(fp8: bool | str, split: int, k: int, pdl: bool, accumulate: bool = True,
         block_m: int = 16, bias: bool = False, shared: bool = False,
         block_k: int | None = None, runs: bool = False, a_f32: bool = False,
         gate: bool = False):
    """a_f32: fp8 rowwise's rows of a in fp32, quantized in the K loop; gate: a gated shared
    expert's rows (with shared, the shared m-tiles'; else every row) times sigmoid(x . gate)."""
    from shufflemoe.ops.moe_decode import kernel

    quant, fp8 = _format(fp8)
    w, ws = WEIGHTS[quant]
    sig = dict(a_ptr="*fp32" if a_f32 else "*fp8e4nv" if fp8 else "*bf16",
               a_scale_ptr="*fp32" if fp8 and not a_f32 else None,
               w_ptr=w, w_scale_ptr=ws, bias_ptr="*bf16" if bias else None, counts_ptr="*i32",
               ids_ptr="*i32",
               pos_ptr="*i32", rw_ptr="*fp32", out_ptr="*bf16", y_ptr="*fp32" if k > 1 else None,
               part_ptr="*fp32" if split > 1 else None,
               words_ptr="*i32" if split > 1 or k > 1 else None, E="i32", D="i32",
               I="i32", n_tiles="i32", k_split="i32", A="i32", T="i32", words_cols="i32",
               sw_ptr="*bf16" if shared else None, flag_ptr="*i32" if shared else None,
               sa_ptr="*bf16" if shared else None, flag_expected="i32",
               gx_ptr="*bf16" if gate else None, gate_ptr="*bf16" if gate else None,
               **_split_arg(split))
    if shared:  # the combine, as for k > 1
        sig.update(y_ptr="*fp32", words_ptr="*i32")
    consts = dict(SHARED=shared, EARLY=shared, K=k, TOP1=k == 1 and not shared, ACCUMULATE=accumulate, BLOCK_E=128, BLOCK_M=block_m,
                  BLOCK_N=64,
                  BLOCK_K=block_k or _block_k(quant), SHARED_K=_shared_k(quant), BLOCK_T=16,
                  **_split_const(split),
                  QUANT=quant, HAS_BIAS=bias, HAS_RW=True, UPCAST=False,
                  W_TO_X=quant in ("fp8_w8a16", "mxfp4"),
                  DOT_PRECISION="tf32", INTERPRET=False, PDL=pdl, RUNS=runs, A_F32=a_f32,
                  ROW_BLOCK=1024, ROW_CHUNKS=1, GATE=gate, GATE_K=4096 // block_m,
                  PRELOAD=kernel._preload(quant, k))
    return compile_sm90(kernel._down_kernel, sig, consts, **({"launch_pdl": True} if pdl else {}))


def grouped(quant: str, tma: str, swap_ab: bool, block_m: int = 64, block_k: int = 128,
            block_n: int = 128, gather: str = "none", glu: str = "none", num_warps: int = 4,
            run_order: bool = False, k_parts: int = 1, tail_m: int = 0, num_stages: int = 3):
    """The grouped GEMM: its mxfp4 path (the interpreter cannot run its PTX dequantization), its
    gathered rows and its GLU epilogue (two weight tiles a K step) under the GPU compiler."""
    from shufflemoe.ops.grouped_gemm import kernel

    wdt = {"mxfp4": "*u8", "none": "*bf16", "fp8_w8a16": "*fp8e4nv"}[quant]
    sig = dict(x_ptr="*bf16", w_ptr=wdt, m_sizes_ptr="*i32", weight_ids_ptr=None,
               x_scale_ptr=None, w_scale_ptr={"mxfp4": "*u8", "fp8_w8a16": "*fp32"}.get(quant),
               bias_ptr=None,
               row_weights_ptr=None, scatter_ids_ptr=None if glu != "none" else "*i32",
               x_ids_ptr=None if gather == "none" else "*i32", out_ptr="*bf16",
               x_host_desc=None, x_tail_host_desc=None, w_host_desc=None, M="i32", N="i32",
               K="i32", G="i32",
               W="i32", NB="i32", KB="i32", SPLIT="i32", alpha="fp32", limit="fp32",
               num_programs="i32")
    consts = dict(BLOCK_G=128, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  TAIL_M=tail_m, TMA=tma,
                  SWAP_AB=swap_ab, FLATTEN=False, QUANT=quant, HAS_BIAS=False,
                  HAS_WEIGHT_IDS=False, HAS_ROW_WEIGHTS=False,
                  SCATTER="none" if glu != "none" else "add", GATHER=gather, GLU=glu,
                  HAS_LIMIT=glu == "swiglu_oai", UPCAST=False, DOT_PRECISION="tf32",
                  INTERPRET=False, RUN_ORDER=run_order, STEP_K=block_k * k_parts)
    return compile_sm90(kernel._grouped_gemm_kernel, sig, consts, num_warps=num_warps,
                        num_stages=num_stages)


def route(E: int, k: int, groups: tuple[int, int], block_tokens: int, single: bool,
          scoring: int = 2, bias: bool = True, pdl: bool = True, group_best: int = 2,
          round_scores: bool = False, grouped: bool = True, num_warps: int | None = None):
    """index_shuffle's route kernel with DeepSeek-V3's grouped selection (its rows whole: the
    [tokens, groups, experts] reshapes and reductions); group_best 1: DeepSeek-V2's;
    round_scores: LFM2-MoE's bf16 scores; grouped False: the plain top-k of E experts (groups
    ignored)."""
    from shufflemoe.ops._common import next_power_of_2
    from shufflemoe.ops.index_shuffle import kernel

    n_group, topk_group = groups
    scratch = None if single else "*i32"
    sig = dict(src_ptr="*bf16", src_stride="i32", win_ptr="*bf16", win_stride="i32",
               bias_ptr="*fp32" if bias else None, counts_ptr="*i32", tok_ptr="*i32",
               exp_ptr="*i32", w_ptr="*fp32", nv_ptr="*i32", pos_ptr="*i32", skey_ptr=scratch,
               sid_ptr=scratch, sw_ptr=None if single else "*fp32", hist_ptr=scratch, T="i32",
               cap="i32", scaling="fp32")
    consts = dict(E=E, K=k, KP=next_power_of_2(k), BT=block_tokens, BEC=16,
                  NB=max(32, next_power_of_2(E)), FROM_SCORES=True, SCORING=scoring, RENORM=True,
                  HAS_W=False, HAS_CAP=False, GROUPED=grouped, G=n_group, EG=E // n_group,
                  GP=next_power_of_2(n_group), EGP=next_power_of_2(E // n_group),
                  TOPG=topk_group, GBEST=group_best, HAS_BIAS=bias, ROUND=round_scores,
                  INTERPRET=False, SINGLE=single, PDL=pdl)
    return compile_sm90(kernel._route_kernel, sig, consts,
                        num_warps=num_warps or (4 if single else 8))


def router(out: str, bias: bool, one_step: bool, block_t: int = 1):
    """The router GEMV: bf16 x and weight, logits in ``out`` (fp32: DeepSeek-V3's float32
    logits of a bf16 model, no cast before it)."""
    from shufflemoe.ops.router import kernel

    sig = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16" if bias else None, out_ptr=out,
               T="i32", D="i32", E="i32", experts="i32", x_stride="i32", w_stride="i32")
    consts = dict(HAS_BIAS=bias, BLOCK_T=block_t, BLOCK_D=2048 if one_step else 4096,
                  ONE_STEP=one_step, INTERPRET=False, PDL=True)
    return compile_sm90(kernel._router_kernel, sig, consts, num_warps=8)


ROUTES = {  # no GEMM: no pipelining or wgmma to check
    "router float32 logits of bf16, D in steps, PDL": lambda: router("*fp32", False, False),
    "router bf16 logits with a bias, one step, 8 tokens": lambda: router("*bf16", True, True, 8),
    "route DeepSeek-V3 groups, one program, PDL": lambda: route(256, 8, (8, 4), 2, True),
    "route 8 groups of 20 experts, softmax, blocks, PDL": lambda: route(
        160, 6, (8, 3), 16, False, scoring=1, bias=False),
    "route one group of 384 experts, one program": lambda: route(384, 8, (1, 1), 8, True),
    "route DeepSeek-V2 groups by their best, one program": lambda: route(
        160, 6, (10, 3), 4, True, scoring=1, bias=False, group_best=1),
    "route LFM2-MoE's rounded sigmoid scores, one program": lambda: route(
        32, 4, (1, 1), 8, True, round_scores=True),
    "route Qwen3's top-8 of 128, one program, pairs placed by counting, 2 warps": lambda: route(
        128, 8, (1, 1), 2, True, scoring=1, bias=False, grouped=False, num_warps=2),
}


def chain_kernel(module: str, name: str, sig: dict, consts: dict, num_warps: int = 4):
    """A small kernel of the unfused path's chain, launched with PDL as on a GPU (ops/_pdl.py)."""
    import importlib

    fn = getattr(importlib.import_module(f"shufflemoe.ops.{module}.kernel"), name)
    return compile_sm90(fn, sig, {**consts, "PDL": True}, num_warps=num_warps, launch_pdl=True)


ROWS = dict(HAS_NV=True, INTERPRET=False)
CHAIN = {  # the unfused path's small kernels: no GEMM; each waits first (checked below)
    "place pairs, PDL": lambda: chain_kernel(
        "index_shuffle", "_place_kernel",
        dict(counts_ptr="*i32", tok_ptr="*i32", exp_ptr="*i32", w_ptr="*fp32", nv_ptr="*i32",
             pos_ptr="*i32", skey_ptr="*i32", sid_ptr="*i32", sw_ptr="*fp32", hist_ptr="*i32",
             nb="i32", per_prog="i32", A="i32", cap="i32"),
        dict(E=128, K=8, KP=8, BT=16, NB=128, RB=64, FROM_SCORES=True, HAS_CAP=False)),
    "gather fp8 token-major, PDL": lambda: chain_kernel(
        "gather_scale", "_gather_tokens_fp8_kernel",
        dict(x_ptr="*bf16", pos_ptr="*i32", w_ptr=None, nv_ptr="*i32", q_ptr="*fp8e4nv",
             scale_ptr="*fp32", A="i32", D="i32"),
        dict(K=8, HAS_W=False, BLOCK_D=2048, **ROWS)),
    "gather bf16 rows, PDL": lambda: chain_kernel(
        "gather_scale", "_gather_scale_kernel",
        dict(x_ptr="*bf16", ids_ptr="*i32", w_ptr="*fp32", nv_ptr="*i32", out_ptr="*bf16",
             D="i32"),
        dict(HAS_W=True, BLOCK_D=1024, **ROWS)),
    "gather fp8_block groups, PDL": lambda: chain_kernel(
        "gather_scale", "_gather_scale_groups_kernel",
        dict(x_ptr="*bf16", ids_ptr="*i32", w_ptr=None, nv_ptr="*i32", q_ptr="*fp8e4nv",
             scale_ptr="*fp32", D="i32", G="i32"),
        dict(HAS_W=False, GROUP=128, **ROWS), num_warps=1),
    "silu_mul fp8 rowwise one pass, PDL": lambda: chain_kernel(
        "silu_mul", "_silu_mul_fp8_kernel",
        dict(h_ptr="*bf16", nv_ptr="*i32", q_ptr="*fp8e4nv", scale_ptr="*fp32", I="i32",
             alpha="fp32", limit="fp32"),
        dict(ONE_PASS=True, BLOCK=512, BLOCK_B=256, CHUNKS=0, ACT="silu", HAS_LIMIT=False,
             **ROWS)),
    "silu_mul bf16, PDL": lambda: chain_kernel(
        "silu_mul", "_silu_mul_kernel",
        dict(h_ptr="*bf16", nv_ptr="*i32", out_ptr="*bf16", scale_ptr=None, I="i32",
             alpha="fp32", limit="fp32"),
        dict(BLOCK=256, GROUPS=False, ACT="silu", HAS_LIMIT=False, **ROWS)),
    "token sum k=8, PDL": lambda: chain_kernel(
        "scatter_add", "_token_sum_kernel",
        dict(out_ptr="*bf16", y_ptr="*bf16", pos_ptr="*i32", w_ptr=None, nv_ptr="*i32",
             rows_ptr=None, P="i32", D="i32"),
        dict(K=8, KP=8, UNROLL=True, HAS_W=False, HAS_ROWS=False, ACCUMULATE=True,
             BLOCK_D=2048, **ROWS), num_warps=8),
    "scatter add, PDL": lambda: chain_kernel(
        "scatter_add", "_scatter_add_kernel",
        dict(out_ptr="*bf16", y_ptr="*bf16", ids_ptr="*i32", w_ptr="*fp32", nv_ptr="*i32",
             rows_ptr=None, D="i32"),
        dict(HAS_W=True, HAS_ROWS=False, BLOCK_D=1024, **ROWS)),
    "quantize fp8 groups, PDL": lambda: chain_kernel(
        "quantize", "_quantize_fp8_groups_kernel",
        dict(x_ptr="*bf16", nv_ptr="*i32", q_ptr="*fp8e4nv", scale_ptr="*fp32", K="i32",
             G="i32"),
        dict(HAS_NV=True, INTERPRET=False, GROUP=128), num_warps=1),
}
BUILDS = {
    "gate_up bf16 split-K input weights": lambda: gate_up(False, 8, True, False),
    "gate_up fp8 PDL": lambda: gate_up(True, 1, False, True),
    "gate_up fp8 PDL one token": lambda: gate_up(True, 1, True, True, one_token=True),
    "gate_up bf16 no split, no arrival words": lambda: gate_up(False, 1, True, False),
    "down fp8 split-K k=8": lambda: down(True, 3, 8, False),
    "down bf16 top-1 PDL": lambda: down(False, 1, 1, True),
    "down bf16 top-1 split-K writing out": lambda: down(False, 2, 1, False, accumulate=False),
    "down bf16 k=4 writing out": lambda: down(False, 1, 4, False, accumulate=False),
    "gate_up fp8_w8a16 split-K": lambda: gate_up("fp8_w8a16", 2, True, False),
    "down fp8_w8a16 k=8": lambda: down("fp8_w8a16", 1, 8, False),
    "gate_up mxfp4 split-K": lambda: gate_up("mxfp4", 2, True, False),
    "down mxfp4 top-1 PDL": lambda: down("mxfp4", 1, 1, True),
    "gate_up bf16 gpt-oss (bias, clamped GLU) split-K": lambda: gate_up(False, 2, False, False,
                                                                       oai=True),
    "down bf16 gpt-oss (bias) k=4": lambda: down(False, 2, 4, False, bias=True),
    "gate_up bf16 shared expert first, early, PDL": lambda: gate_up(False, 1, True, True,
                                                                   shared=True),
    "down bf16 shared expert first, early, k=1 split-K PDL": lambda: down(False, 2, 1, True,
                                                                 accumulate=False, shared=True),
    "gate_up fp8 with a bf16 shared expert (sa), early, PDL": lambda: gate_up(
        True, 1, True, True, shared=True),
    "down fp8 with a bf16 shared expert (sa), early, k=1 split-K PDL": lambda: down(
        True, 2, 1, True, accumulate=False, shared=True),
    "gate_up fp8_w8a16 with a bf16 shared expert, early, PDL": lambda: gate_up(
        "fp8_w8a16", 1, True, True, shared=True),
    "down mxfp4 with a bf16 shared expert, early, k=1 PDL": lambda: down(
        "mxfp4", 1, 1, True, accumulate=False, shared=True),
    "gate_up fp8_block split-K input weights": lambda: gate_up("fp8_block", 2, True, False),
    "down fp8_block k=8 PDL": lambda: down("fp8_block", 1, 8, True),
    "gate_up fp8_block with a bf16 shared expert (sa), early, PDL": lambda: gate_up(
        "fp8_block", 1, True, True, shared=True),
    "down fp8_block with a bf16 shared expert (sa), early, k=1 split-K PDL": lambda: down(
        "fp8_block", 2, 1, True, accumulate=False, shared=True),
    "down bf16 gated shared expert first, early, k=1 split-K PDL": lambda: down(
        False, 2, 1, True, accumulate=False, shared=True, gate=True),
    "down fp8 with a gated bf16 shared expert (sa), early, k=4 PDL": lambda: down(
        True, 1, 4, True, accumulate=False, shared=True, gate=True),
    "grouped GEMM mxfp4": lambda: grouped("mxfp4", "none", False),
    "grouped GEMM mxfp4 device TMA, swapped": lambda: grouped("mxfp4", "device", True),
    "grouped GEMM mxfp4 16 x 128 x 256, swapped, run order": lambda: grouped(
        "mxfp4", "none", True, 16, 256, run_order=True),
    "grouped GEMM mxfp4 16 x 128 x (2 x 128), swapped, run order, device TMA": lambda: grouped(
        "mxfp4", "device", True, 16, 128, run_order=True, k_parts=2),
    "grouped GEMM mxfp4 gathered rows, GLU, swapped 16 x 128 x 128, run order": lambda: grouped(
        "mxfp4", "device", True, 16, 128, 128, "rows", "silu", run_order=True),
    "grouped GEMM bf16 gathered rows, GLU, device TMA, 128 x 128 x 64": lambda: grouped(
        "none", "device", False, 128, 64, 128, "rows", "silu", num_warps=8),
    "grouped GEMM bf16 gathered rows, gpt-oss GLU, swapped 16 x 64 x 128": lambda: grouped(
        "none", "device", True, 16, 128, 64, "rows", "swiglu_oai"),
    "grouped GEMM mxfp4 GLU, swapped": lambda: grouped("mxfp4", "device", True, glu="silu"),
    "grouped GEMM bf16 128 x 256 x 64 with 32 tail rows, 4 stages, device TMA": lambda: grouped(
        "none", "device", False, 128, 64, 256, num_warps=8, tail_m=32, num_stages=4),
    "grouped GEMM mxfp4 128 x 128 x 128 with 16 tail rows": lambda: grouped(
        "mxfp4", "none", False, 128, 128, 128, num_warps=8, tail_m=16),
}
GEMV = {  # one pair a tile: no MMA
    "gate_up fp8 one-pair tiles split-K": lambda: gate_up(True, 4, True, False, block_m=1),
    "down bf16 one-pair tiles k=8": lambda: down(False, 1, 8, False, block_m=1),
    "gate_up bf16 one-pair tiles PDL": lambda: gate_up(False, 1, True, True, block_m=1),
    "down bf16 one-pair tiles top-1 split-K PDL": lambda: down(False, 2, 1, True, block_m=1),
    "gate_up fp8_w8a16 one-pair tiles": lambda: gate_up("fp8_w8a16", 3, True, False, block_m=1),
    "gate_up mxfp4 one-pair tiles split-K": lambda: gate_up("mxfp4", 4, True, False, block_m=1),
    "down mxfp4 one-pair tiles k=8": lambda: down("mxfp4", 1, 8, False, block_m=1),
    "gate_up mxfp4 gpt-oss one-pair tiles": lambda: gate_up("mxfp4", 2, False, False, block_m=1,
                                                            oai=True),
    "down mxfp4 gpt-oss one-pair tiles k=4": lambda: down("mxfp4", 1, 4, False, block_m=1,
                                                          bias=True),
    "gate_up bf16 one-pair tiles shared expert first, early, PDL": lambda: gate_up(
        False, 1, True, True, block_m=1, shared=True),
    "down bf16 one-pair tiles shared expert first, early, k=1 PDL": lambda: down(
        False, 1, 1, True, accumulate=False, block_m=1, shared=True),
    "down bf16 one-pair tiles gated shared expert first, early, k=8 PDL": lambda: down(
        False, 1, 8, True, accumulate=False, block_m=1, shared=True, gate=True),
    "down bf16 one-pair tiles, a gated shared expert alone, top-1 split-K": lambda: down(
        False, 2, 1, False, accumulate=False, block_m=1, gate=True),
    "gate_up fp8 one-pair tiles with a bf16 shared expert (sa), early, PDL": lambda: gate_up(
        True, 1, True, True, block_m=1, shared=True),
    "down fp8_w8a16 one-pair tiles with a bf16 shared expert, k=1 split-K PDL": lambda: down(
        "fp8_w8a16", 2, 1, True, accumulate=False, block_m=1, shared=True),
    "gate_up mxfp4 one-pair tiles with a bf16 shared expert, early, PDL": lambda: gate_up(
        "mxfp4", 1, True, True, block_m=1, shared=True),
    "gate_up fp8_block one-pair tiles, 4 blocks a step, split-K": lambda: gate_up(
        "fp8_block", 4, True, False, block_m=1, block_k=512),
    "down fp8_block one-pair tiles top-1 split-K PDL": lambda: down("fp8_block", 2, 1, True,
                                                                    block_m=1),
    "gate_up fp8 one-pair tiles, runs a thread, PDL": lambda: gate_up(
        True, 1, False, True, block_m=1, block_k=1024, runs=True),
    "gate_up fp8 one-pair tiles with a bf16 shared expert, runs a thread": lambda: gate_up(
        True, 1, True, True, block_m=1, shared=True, block_k=512, runs=True),
    "down bf16 one-pair tiles k=8, runs a thread": lambda: down(False, 1, 8, False, block_m=1,
                                                               block_k=256, runs=True),
    "down fp8_w8a16 one-pair tiles split-K, runs a thread": lambda: down(
        "fp8_w8a16", 2, 2, False, block_m=1, block_k=512, runs=True),
    "gate_up fp8 one-pair tiles leaving a in fp32, with a bf16 shared expert, early, PDL":
        lambda: gate_up(True, 1, True, True, block_m=1, shared=True, quant_a=False),
    "gate_up fp8 one-pair tiles, a bf16 shared expert, one token, a in fp32, PDL":
        lambda: gate_up(True, 1, True, True, block_m=1, shared=True, quant_a=False,
                        one_token=True),
    "down fp8 one-pair tiles quantizing a's fp32 rows, k=8 split-K PDL": lambda: down(
        True, 2, 8, True, block_m=1, a_f32=True),
    "down fp8 one-pair tiles quantizing a's fp32 rows, a bf16 shared expert, runs": lambda: down(
        True, 1, 1, True, accumulate=False, block_m=1, shared=True, block_k=512, runs=True,
        a_f32=True),
    "down fp8 one-pair tiles quantizing a's fp32 rows, a gated bf16 shared expert, k=8": lambda: (
        down(True, 1, 8, True, accumulate=False, block_m=1, shared=True, a_f32=True, gate=True)),
    "down mxfp4 one-pair tiles, a gated bf16 shared expert, k=4": lambda: down(
        "mxfp4", 1, 4, True, accumulate=False, block_m=1, shared=True, gate=True),
}


def test_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(pathlib.Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in {**BUILDS, **GEMV, **ROUTES, **CHAIN}:
        assert f"ok {name}" in done.stdout, done.stdout


if __name__ == "__main__":
    failed = False
    for name, build in {**BUILDS, **GEMV, **ROUTES, **CHAIN}.items():
        try:
            compiled = build()
            ttgir = compiled.asm["ttgir"]
            if "mxfp4" in name:  # PTX dequantization: MMA tiles' bf16 pairs, one-pair tiles' fp16
                ptx = compiled.asm["ptx"]
                assert ("0x3F3F3F00" in ptx) == (name in BUILDS), "no PTX dequantization (bf16)"
                assert ("mul.rn.bf16x2" in ptx) == (name in BUILDS)
                assert ("0x4140" in ptx) == (name not in BUILDS), "no PTX dequantization (fp16)"
                # tiles in mxfp4_run_order read a thread's bytes of a run as one matrix load
                if "run order" in name or not name.startswith("grouped"):
                    assert ("ldmatrix" in ptx) == (name in BUILDS), "single-byte loads"
            if "one token" in name:  # fp8 rowwise at T = 1: x's row (past L1) before the wait
                ptx = compiled.asm["ptx"]
                assert "ld.global.cg" in ptx[:ptx.index("griddepcontrol.wait")], "x's amax late"
            if name in CHAIN or (name.startswith("route ") and "PDL" in name):
                ptx = compiled.asm["ptx"]  # the chain's order: nothing read before the wait
                assert "ld.global" not in ptx[:ptx.index("griddepcontrol.wait")], "read early"
                assert "griddepcontrol.launch_dependents" in ptx, "no launch of the next"
            if name in BUILDS and not name.startswith("grouped"):
                assert "async_copy_global_to_local" in ttgir, "the K loop is not pipelined"
                assert "warp_group_dot" in ttgir, "no wgmma"
            print(f"ok {name}", flush=True)
        except Exception as e:  # report every variant, then fail
            failed = True
            print(f"FAILED {name}: {type(e).__name__}: {e}", flush=True)
    sys.exit(1 if failed else 0)
