"""mxfp4's one-pair GEMV with fp16 pair products, counted offline (sm_90 SASS, no GPU).

    PYTHONPATH=src python benchmarks/probe_mxfp4_f16.py

The fused decode's mxfp4 GEMV (moe_decode/kernel.py, _mxfp4_gemv) decodes each e2m1 value to
fp16, converts it to float32 and multiplies it by the input there: 5.6 SASS instructions a value
(notes/layer.md, "The mxfp4 GEMV's SASS"). A product of an e2m1 value and a bf16 input is exact
in fp16 within its range, so a pair (even and odd column) could be summed by one HFMA2 and
converted once. This builds the gate_up kernel with _row_halves returning fp16 (times a constant
power of two: a stand-in for the per-token one that would keep the products in range) and
_mxfp4_gemv multiplying in fp16 (the same source, other globals), compiles both for sm_90 with
Triton's bundled ptxas (gate_up one-pair tile: 32 rows x 512 values, 4 warps) and prints the K
loop's instructions a step and a value, and the most frequent opcodes.
"""

from __future__ import annotations

import collections
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import types

import triton
import triton.language as tl

from shufflemoe.ops.moe_decode import kernel as KM
from shufflemoe.ops.quantize.kernel import e2m1_f16, e8m0_values

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "ops"))
from test_moe_decode_sm90 import WEIGHTS, compile_sm90  # noqa: E402

ROWS, BLOCK_K, WARPS = 32, 512, 4


@triton.jit
def _row_halves_f16(ptr, row, w, ok, k0, k_hi, K, HAS_W: tl.constexpr, INTERPRET: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """kernel._row_halves as fp16, times a constant power of two (the stand-in for the per-token
    one that would keep the products in fp16's range)."""
    even, odd = KM._row_halves(ptr, row, w, ok, k0, k_hi, K, HAS_W, INTERPRET, BLOCK_K)
    return (even * 64.0).to(tl.float16), (odd * 64.0).to(tl.float16)


@triton.jit
def _mxfp4_gemv_f16(acc, w_ptr, ws_ptr, w_rows, col_ok, k0, k_hi, K, even, odd,
                    BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    """kernel._mxfp4_gemv with each (even, odd) pair's products summed in fp16."""
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    g_ok = col_ok[:, None] & (gs < k_hi // 32)[None, :]
    js = (k0 // 32) * 16 + tl.arange(0, BLOCK_K // 2)
    flat = tl.load(w_ptr + w_rows[:, None] * ((K // 32) * 16) + js[None, :],
                   mask=col_ok[:, None] & (js < (k_hi // 32) * 16)[None, :], other=0)
    packed = tl.reshape(flat, [w_rows.shape[0], BLOCK_K // 32, 16])
    p = (e2m1_f16(packed, False, UPCAST) * even[None, :, :]
         + e2m1_f16(packed, True, UPCAST) * odd[None, :, :]).to(tl.float32)
    s = tl.load(ws_ptr + w_rows[:, None] * (K // 32) + gs[None, :], mask=g_ok, other=0)
    return acc + tl.sum(p, 2) * 16384.0 * e8m0_values(s)


def kernel_with_f16():
    """_gate_up_kernel built over globals where _row_halves and _mxfp4_gemv are the fp16 ones."""
    G = dict(KM.__dict__, _row_halves=_row_halves_f16, _mxfp4_gemv=_mxfp4_gemv_f16)
    for name in ("_gate_up_step", "_gate_up_loop", "_gate_up_kernel"):
        fn = getattr(KM, name).fn
        G[name] = triton.jit(types.FunctionType(fn.__code__, G, fn.__name__, fn.__defaults__))
    return G["_gate_up_kernel"]


def loop_body(text: str) -> list[str]:
    """The SASS lines of the longest loop (a branch back to an earlier address)."""
    lines = [line for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", line).group(1), 16) for line in lines]
    best: list[str] = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+0x([0-9a-f]+)", line)
        if m and int(m.group(1), 16) < addr[i]:
            body = [x for x, a in zip(lines, addr) if int(m.group(1), 16) <= a <= addr[i]]
            best = body if len(body) > len(best) else best
    return best


def sass(fn) -> str:
    w, ws = WEIGHTS["mxfp4"]
    sig = dict(x_ptr="*bf16", w_ptr=w, w_scale_ptr=ws, bias_ptr=None, counts_ptr="*i32",
               alpha="fp32", limit="fp32", ids_ptr="*i32", rw_ptr=None, a_ptr="*bf16", q_ptr=None,
               scale_ptr=None, part_ptr="*fp32", words_ptr="*i32", E="i32", D="i32", I="i32",
               n_tiles="i32", k_split="i32", A="i32", words_rows="i32", sw_ptr=None, T="i32",
               sa_ptr=None, flag_ptr=None, split="i32")
    consts = dict(SHARED=False, EARLY=False, BLOCK_E=16, BLOCK_M=1, BLOCK_N=ROWS, BLOCK_K=BLOCK_K,
                  SHARED_K=64, QUANT="mxfp4", ACT="silu", HAS_LIMIT=False, HAS_BIAS=False,
                  HAS_RW=False, UPCAST=False, W_TO_X=True, DOT_PRECISION="tf32",
                  INTERPRET=False, PDL=False, QUANT_BLOCK=1024, ROW_BLOCK=4096, ROW_CHUNKS=2,
                  RUNS=False)
    built = compile_sm90(fn, sig, consts)  # 4 warps (WARPS)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        pathlib.Path(path).write_bytes(built.asm["cubin"])
        tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        return subprocess.run([tool, "-sass", path], capture_output=True, text=True,
                              check=True).stdout


def main() -> None:
    values = ROWS * BLOCK_K * 2 / (32 * WARPS)  # gate and up rows: a thread's values a step
    for label, fn in (("float32 products", KM._gate_up_kernel), ("fp16 pairs", kernel_with_f16())):
        body = loop_body(sass(fn))
        ops = collections.Counter(
            re.sub(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", line).split()[0].split(".")[0]
            for line in body)
        print(f"{label}: {len(body)} a step, {len(body) / values:.2f} a value; "
              f"{dict(ops.most_common(12))}", flush=True)


if __name__ == "__main__":
    main()
