"""The dequantization PTX constants, run by a small emulator of the instructions they use (the
interpreter cannot run inline assembly, so CI checks their bit logic here; the GPU suite runs them
for real): mxfp4's every byte in every position of a word, both nibbles, against the e2m1 table,
through the bf16 pairs with scales over the e8m0 range and the fp16 path (values x 2^-14); e4m3 ->
bf16 for every pair of bytes against torch's e4m3 values, and on a GPU every code through the
kernel helper."""

import random
import struct

import pytest
import torch
import triton
import triton.language as tl

from shufflemoe.ops.quantize import kernel

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1[code & 7]


def bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def bf16_bits(v: float) -> int:
    """float -> bf16 bits; the products here are exact, so no rounding is needed."""
    b = struct.unpack("<I", struct.pack("<f", v))[0]
    assert b & 0xFFFF == 0 and bf16(b >> 16) == v, v
    return b >> 16


def f16(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0]


def run_ptx(ptx: str, regs: dict[str, int]) -> dict[str, int]:
    """Emulates the subset of PTX the constants use, on 32-bit registers."""
    r = dict(regs)
    val = lambda x: r[x] if x in r else int(x, 0)  # noqa: E731
    body = ptx.strip().removeprefix("{").removesuffix("}")
    for ins in filter(None, (i.strip() for i in body.split(";"))):
        op, args = ins.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        if op == ".reg":
            continue
        if op == "mov.b32":
            r[a[0]] = val(a[1])
        elif op == "prmt.b32":
            src = val(a[1]).to_bytes(4, "little") + val(a[2]).to_bytes(4, "little")
            sel = val(a[3])
            r[a[0]] = int.from_bytes(bytes(src[(sel >> 4 * i) & 7] for i in range(4)), "little")
        elif op == "shl.b32":
            r[a[0]] = (val(a[1]) << val(a[2])) & 0xFFFFFFFF
        elif op == "shr.b32":
            r[a[0]] = val(a[1]) >> val(a[2])
        elif op == "cvt.u32.u16":
            r[a[0]] = val(a[1]) & 0xFFFF
        elif op == "and.b32":
            r[a[0]] = val(a[1]) & val(a[2])
        elif op == "or.b32":
            r[a[0]] = val(a[1]) | val(a[2])
        elif op == "mul.rn.bf16x2":
            x, y = val(a[1]), val(a[2])
            lo, hi = bf16(x) * bf16(y), bf16(x >> 16) * bf16(y >> 16)
            r[a[0]] = bf16_bits(lo) | bf16_bits(hi) << 16
        else:
            raise AssertionError(f"the emulator does not know {op}")
    return r


def halves(regs: dict[str, int]) -> list[int]:
    return [regs["$0"] & 0xFFFF, regs["$0"] >> 16, regs["$1"] & 0xFFFF, regs["$1"] >> 16]


@pytest.mark.parametrize("s", [0, 1, 100, 127, 130, 200, 252])  # 2^125 x 6: the largest finite
def test_bf16_ptx_decodes_and_scales_every_byte_in_every_position(s):
    """E2M1_BF16_PTX, elementwise in the four bytes of $4: $i = (byte i's low nibble, its high
    nibble) times byte i's scale ($5 + i), whatever the other bytes and scales hold. The kernel
    passes a scale as mxfp4_values makes it: bf16 bits max(s << 7, 0x40) in both halves."""
    ptx = kernel.E2M1_BF16_PTX.value
    rng = random.Random(s)
    pair = lambda e: max(e << 7, 0x40) * 0x10001  # noqa: E731
    for byte in range(256):
        for pos in range(4):
            words = [rng.randrange(256) for _ in range(4)]
            words[pos] = byte
            scales = [pair(rng.choice([0, 1, 127, 130, 252])) for _ in range(4)]
            scales[pos] = pair(s)
            out = run_ptx(ptx, {"$4": int.from_bytes(bytes(words), "little"),
                                **{f"${5 + i}": scales[i] for i in range(4)}})[f"${pos}"]
            assert bf16(out) == e2m1(byte & 0xF) * 2.0 ** (s - 127), (byte, pos, s)
            assert bf16(out >> 16) == e2m1(byte >> 4) * 2.0 ** (s - 127), (byte, pos, s)


@pytest.mark.parametrize("high", [False, True])
def test_f16_ptx_decodes_every_byte(high):
    ptx = (kernel.E2M1_HIGH_F16_PTX if high else kernel.E2M1_LOW_F16_PTX).value
    for base in range(0, 256, 4):
        out = run_ptx(ptx, {"$2": int.from_bytes(bytes(range(base, base + 4)), "little")})
        for byte, bits in zip(range(base, base + 4), halves(out)):
            code = byte >> 4 if high else byte & 0xF
            assert f16(bits) == e2m1(code) * 2.0 ** -14, byte


def test_e4m3_bf16_ptx_converts_every_pair_of_bytes():
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    codes = [b for b in range(256) if b & 0x7F != 0x7F]  # 0x7F, 0xFF: NaN (documented: 480)
    ptx = kernel.E4M3_BF16_PTX.value
    for lo in codes:
        for hi in codes:
            out = run_ptx(ptx, {"$1": lo | hi << 8})["$0"]
            assert (bf16(out), bf16(out >> 16)) == (values[lo], values[hi]), (lo, hi)


@triton.jit
def _e4m3_to_bf16_kernel(src, dst, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(dst + i, kernel.e4m3_to(tl.load(src + i, mask=i < n), tl.bfloat16), mask=i < n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (inline PTX)")
def test_e4m3_to_bf16_on_the_gpu_every_code():
    codes = torch.arange(256, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    out = torch.full((256,), float("nan"), dtype=torch.bfloat16, device="cuda")
    _e4m3_to_bf16_kernel[(1,)](codes, out, 256, BLOCK=256)
    want = codes.to(torch.bfloat16)
    finite = ~torch.isnan(want)
    assert finite.sum() == 254
    assert torch.equal(out[finite].view(torch.int16), want[finite].view(torch.int16))


@triton.jit
def _mxfp4_values_kernel(packed_ptr, scale_ptr, dst, N: tl.constexpr, K: tl.constexpr,
                         FP32: tl.constexpr, RUN_ORDER: tl.constexpr):
    """mxfp4_values of an N x K tile: FP32 the float32 path (the interpreter's), else the PTX."""
    rows = tl.arange(0, N)[:, None]
    packed = tl.load(packed_ptr + rows * (K // 2) + tl.arange(0, K // 2)[None, :])
    s = tl.load(scale_ptr + rows * (K // 32) + tl.arange(0, K // 32)[None, :])
    tl.store(dst + rows * K + tl.arange(0, K)[None, :],
             kernel.mxfp4_values(packed, s, N, K, FP32, RUN_ORDER))


def run_order(K: int) -> torch.Tensor:
    """mxfp4_run_order's columns, written out: position 32g + 8i + 2j + h holds 32g + 8j + 2i + h."""
    g, i, j, h = torch.meshgrid(*(torch.arange(n) for n in (K // 32, 4, 4, 2)), indexing="ij")
    return (32 * g + 8 * j + 2 * i + h).reshape(K)


@triton.jit
def _run_order_kernel(src, dst, M: tl.constexpr, K: tl.constexpr):
    at = tl.arange(0, M)[:, None] * K + tl.arange(0, K)[None, :]
    tl.store(dst + at, kernel.mxfp4_run_order(tl.load(src + at)))


def test_mxfp4_run_order_is_the_documented_permutation(device):
    M, K = 16, 128
    src = torch.randn(M, K, device=device)
    dst = torch.full_like(src, float("nan"))
    _run_order_kernel[(1,)](src, dst, M=M, K=K)
    assert torch.equal(dst.cpu(), src.cpu()[:, run_order(K)])


@pytest.mark.parametrize("order", [False, True], ids=["k", "run order"])
def test_mxfp4_values_float32_path(order, device):
    """The float32 path (the interpreter's) in both orders: the same values as the reference, in
    the same places as the GPU path puts them."""
    from shufflemoe.ops.quantize.reference import dequantize_mxfp4

    N, K = 16, 128
    gen = torch.Generator().manual_seed(1)
    packed = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    scales = torch.randint(100, 140, (N, K // 32), generator=gen, dtype=torch.uint8)
    out = torch.full((N, K), float("nan"), device=device)
    _mxfp4_values_kernel[(1,)](packed.to(device), scales.to(device), out, N=N, K=K, FP32=True,
                               RUN_ORDER=order)
    want = dequantize_mxfp4(packed, scales).float()
    assert torch.equal(out.cpu(), want[:, run_order(K)] if order else want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (inline PTX)")
@pytest.mark.parametrize("order", [False, True], ids=["k", "run order"])
def test_mxfp4_values_on_the_gpu_every_byte(order):
    """mxfp4_values' GPU path (the PTX in a real register layout) against the reference's
    dequantization: every byte value in every position of a 16-byte run, scales over the e8m0
    range (0 and 252 included); in K's order and in mxfp4_run_order's."""
    from shufflemoe.ops.quantize.reference import dequantize_mxfp4

    N, K = 32, 256
    gen = torch.Generator().manual_seed(0)
    packed = torch.stack([torch.randperm(256, generator=gen) for _ in range(N * K // 512)])
    packed = packed.to(torch.uint8).reshape(N, K // 2)
    scales = torch.randint(0, 253, (N, K // 32), generator=gen, dtype=torch.uint8)
    scales[0, 0], scales[0, 1] = 0, 252
    out = torch.full((N, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    _mxfp4_values_kernel[(1,)](packed.cuda(), scales.cuda(), out, N=N, K=K, FP32=False,
                               RUN_ORDER=order)
    want = dequantize_mxfp4(packed, scales).to(torch.bfloat16)
    if order:
        want = want[:, run_order(K)]
    assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))
