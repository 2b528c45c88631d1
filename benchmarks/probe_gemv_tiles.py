"""One-pair (GEMV) decode tiles without split-K (narrow tiles, deep K steps) against the tuning
table's, per GEMM, and a plain read of the same bytes (what a launch of that size can stream).
Results: benchmarks/results/probe_gemv_tiles.json (H100); the narrow tiles are now tune_decode
candidates. PYTHONPATH=src python benchmarks/probe_gemv_tiles.py   (writes $OUT/probe_gemv_tiles.json)"""
import json, os, sys, time
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from tune_decode import PRESETS, DTYPES, Case, label  # noqa: E402
from decode_check import layers_for, weight_sets  # noqa: E402
from shufflemoe.ops import use_impl  # noqa: E402
from shufflemoe.ops.moe_decode import configs, kernel  # noqa: E402
from shufflemoe.bench.timing import time_fn  # noqa: E402


@triton.jit
def _read(ptr, out, n_per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * n_per_prog
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n_per_prog, BLOCK):
        acc += tl.load(ptr + base + i + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out + pid, tl.sum(acc, 0))


def us(fn, n, reps):
    return time_fn(fn, n, graph=True, reps=reps, warmup=1).median_us


def read_rows(nbytes, n):
    bufs = [torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
    out = torch.empty(132 * 16, device="cuda")
    res = {}
    for progs in (132, 264, 528, 1056):
        for block in (2048, 8192):
            per = nbytes // 2 // progs
            per -= per % block
            if per == 0:
                continue
            t = us(lambda i: _read[(progs,)](bufs[i], out, per, BLOCK=block, num_warps=4), n, 20)
            res[f"read p{progs} b{block}"] = (round(t, 2), round(per * progs * 2 / t / 1e3, 1))
    return res


CASES = [("llama4-shared-tp8", "bf16", 1), ("scout-tp8", "bf16", 1), ("qwen3-30b-a3b", "bf16", 8),
         ("scout-tp8", "fp8", 1), ("qwen3-30b-a3b", "fp8", 8), ("mixtral-tp2", "bf16", 2)]
out = dict(gpu=torch.cuda.get_device_name(), rows=[])
with use_impl("triton"):
    for name, dtype, A in CASES:
        cfg = PRESETS[name].replace(quantization=DTYPES[dtype])
        layers = layers_for(cfg, weight_sets(cfg, 1), "cuda")
        case = Case(name, dtype, A, layers, "cuda", 8)
        E, D, I = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
        w = layers[0].expert_weights.w13
        base = configs.select(A, E, D, I, w.dtype, kernel.sm_count(w.device), cfg.quantization)
        for gemm in ("gate_up", "down"):
            N, K = (I, D) if gemm == "gate_up" else (D, I)
            size = w.dtype.itemsize
            cands = {"table " + label(getattr(base, gemm)): base}
            for bn in (4, 8, 16, 32):
                for kb in (2048, 4096):
                    bk = min(kb // size, triton.next_power_of_2(K))
                    if bn * bk > 16384:
                        continue
                    tiles, steps = min(E, A) * -(-N // bn), -(-K // bk)
                    for split in sorted({1, 2, max(1, -(-132 // tiles))}):
                        if split > steps:
                            continue
                        for warps in (4, 8):
                            g = configs.GemmConfig(bn, bk, split, warps, 2, block_m=1)
                            cands[label(g)] = base.with_(**{gemm: g})
            fn = case.fn(gemm)
            timed = {}
            t0 = time.time()
            for lab, c in cands.items():
                try:
                    case.check(gemm, c)
                    with configs.override(c):
                        timed[lab] = us(fn, case.n, 10)
                except Exception as e:  # noqa: BLE001
                    timed[lab] = f"{type(e).__name__}: {str(e)[:80]}"
            ok = sorted((v, k) for k, v in timed.items() if isinstance(v, float))
            final = {}
            for v, lab in ok[:4] + [(timed[next(iter(cands))], next(iter(cands)))]:
                with configs.override(cands[lab]):
                    final[lab] = round(us(fn, case.n, 40), 2)
            mb = case.nbytes(gemm) / 1e6
            row = dict(case=[name, dtype, A, gemm], mb=mb, final=final,
                       gbps={k: round(mb / v * 1e3, 0) for k, v in final.items()},
                       first={k: (round(v, 2) if isinstance(v, float) else v) for k, v in timed.items()},
                       secs=round(time.time() - t0, 1))
            if A == 1:
                row["read"] = read_rows(int(case.nbytes(gemm)), 8)
            out["rows"].append(row)
            print(json.dumps(row)[:1500], flush=True)
        del case, layers
        torch.cuda.empty_cache()
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_gemv_tiles.json"), "w"), indent=1)
