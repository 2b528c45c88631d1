"""The fused decode kernels' tuning tables: written by benchmarks/tune_decode.py, not by hand.

TABLE maps configs.table_key(...) = (SMs, E, D, I, weight dtype or 'fp8_w8a16', A rounded
up to a power of two) to (gate_up, down) GemmConfig fields (block_n, block_k, split_k,
num_warps, num_stages, block_m) and DecodeConfig.pdl (the layer was faster with
programmatic dependent launch). TABLE was swept on BASE_DEVICE and serves every GPU of its
SM count; BY_DEVICE[name] (the name torch.cuda.get_device_name gives) holds rows swept on that
GPU, read first there (as vLLM keeps fused-MoE configs per device).
Swept on NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0), commit 6b70ae2,
run 20261126T123904Z-6bbe05; results: benchmarks/results/tune_decode.md.
That run reached its time budget before Mixtral TP2 fp8 at A = 32 and 64: those two rows are
the previous sweep's (commit 99385ea, run 20261126T002556Z-2b0c23).
Rows of fp8_w8a16 swept (--dtypes) on NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0),
  commit d66b358, run 20261127T065453Z-e18947: benchmarks/results/tune_decode_w8a16.md.
Rows of fp8_w8a16 judged in the layer (--layer-only) on NVIDIA H100 80GB HBM3 (torch
  2.11.0+cu130, triton 3.6.0), commit 50ae953, run 20261127T085914Z-9be0c9:
  benchmarks/results/tune_decode_pdl_w8a16.md.
BY_DEVICE['NVIDIA H200']: Rows of bf16 (--dtypes bf16,fp8; its deadline came before Qwen3-30B-A3B
  at A = 16..64, Mixtral TP2 and every fp8 case) swept on NVIDIA H200 (torch 2.11.0+cu130,
  triton 3.6.0), commit 514b8d6, run 20261203T075349Z-1ed38e:
  benchmarks/results/h200/tune_decode_bf16_fp8.md.
BY_DEVICE['NVIDIA H200']: Rows of fp8_rowwise for llama4-shared-tp8, scout-tp8, maverick-tp8,
  mixtral-tp2 swept (--dtypes, --presets) on NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0),
  commit c518e79, run 20261203T095638Z-b7f652:
  benchmarks/results/h200/tune_decode_fp8_llama4-shared-tp8_scout-tp8_maverick-tp8_mixtral-
  tp2.md.
BY_DEVICE['NVIDIA H200']: Rows of bf16 for llama4-shared-tp8 swept (--dtypes, --presets) on
  NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0), commit 18b41e6, run 20261203T115335Z-d2fc56:
  benchmarks/results/h200/tune_decode_bf16_llama4-shared-tp8.md.
BY_DEVICE['NVIDIA H200']: Rows of fp8_rowwise for scout-tp8, maverick-tp8, qwen3-30b-a3b swept
  (--dtypes, --presets) on NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0), commit e824170, run
  20261204T211942Z-f88c4d: benchmarks/results/h200/tune_decode_fp8_scout-tp8_maverick-
  tp8_qwen3-30b-a3b.md.
BY_DEVICE['NVIDIA H200']: Rows of fp8_rowwise for scout-tp8, qwen3-30b-a3b swept (--dtypes,
  --presets) on NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0), commit d23a7b2, run
  20261204T213527Z-ea8d9e: benchmarks/results/h200/tune_decode_fp8_scout-tp8_qwen3-30b-a3b.md.
Rows of fp8_rowwise for scout-tp8, maverick-tp8, qwen3-30b-a3b swept (--dtypes, --presets) on
  NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0), commit
  f82ae7d0b3407b696a9d8100d7d0de3fcca2fde3, run 20261206T042950Z-f8b0de:
  benchmarks/results/tune_decode_fp8_scout-tp8_maverick-tp8_qwen3-30b-a3b.md.
  Of its rows, (132, 128, 5120, 1024, 'float8_e4m3fn', 1) is put back by hand to commit
  2ce889f's: in the layer, Maverick TP8 fp8 T = 1, it took 27.5 us to the retuned row's 28.7
  (H100, benchmarks/probe_device_rows.py --against, 5 rounds ABAB, run 20261206T055605Z-a2c59e).
Rows of fp8_rowwise, fp8_w8a16 for qwen3-30b-a3b judged in the layer (--layer-only) on NVIDIA
  H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0), commit 7ea851a9, run
  20261206T104727Z-ec997c: benchmarks/results/tune_decode_pdl_fp8_w8a16_qwen3-30b-a3b.md.
Rows of bf16 for scout-tp8, maverick-tp8, qwen3-30b-a3b judged in the layer (--layer-only) on
  NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0), commit 12ab863, run
  20261207T075816Z-662275: benchmarks/results/tune_decode_pdl_bf16_scout-tp8_maverick-tp8_qwen3-
  30b-a3b.md. Of its changes only (132, 16, 5120, 1024, 'bfloat16', 4)'s PDL bit (off; the
  c79befb row below has since replaced that row) was taken: in the layer, Scout TP8 bf16
  T = 4, 58.6 against 60.1 us, every round (H100,
  benchmarks/probe_device_rows.py --against, 5 rounds ABAB, run 20261207T075941Z-fbf983,
  results/probe_device_rows_12ab863.json). Its other eleven tied (0.998-1.004) or lost (Scout
  T = 16..64 dropped, 1.004-1.013) there, so the rows before it stay.
Of the rows of bf16 for scout-tp8 swept (--dtypes, --presets) on NVIDIA H100 80GB HBM3 (torch
  2.11.0+cu130, triton 3.6.0), commit c79befb, run 20261207T082324Z-2eea23
  (benchmarks/results/tune_decode_bf16_scout-tp8.md), only A = 4's is taken: Scout merges its
  shared expert at T <= 2, so T = 2 and 4 read A = 4 alone, and in the layer they took 37.5
  against 39.1 us and 56.1 against 58.6 (0.958, 0.956, every round; H100, probe_device_rows.py
  --against, 5 rounds ABAB, run 20261207T082656Z-1da17b, results/probe_device_rows_29e5976.json).
  Its A = 2 row lost at T = 1 (1.018), A = 1 and 8 lost (1.019, 1.023), and its drops of
  A = 16..64 lost (1.004-1.014), so those rows stay.
(132, 16, 5120, 1024, 'bfloat16', 2)'s gate_up 8 x 1024 w8 was chosen in the layer, not swept
  (benchmarks/probe_merged_tiles.py: coordinate descent over one GEMM's tile at a time, the
  layer in CUDA graphs over rotated weights; H100, df31456,
  results/probe_merged_tiles_df31456.json), then judged against the row it replaces in the
  suite's cases: Scout TP8 bf16 T = 1, 27.4 against 28.5 us, 1.042-1.044x every round of two
  calls (probe_device_rows.py --against, 3 and 5 rounds, runs 20261207T143107Z-ae0936 and
  20261207T143153Z-9aa807, results/probe_device_rows_240973c_candidates.json). The A = 8 rows
  found the same way lost there (0.962-0.994) and were not taken.
(132, 128, 2048, 768, 'float8_e4m3fn', 8)'s down 32 x 512 (was 64 x 256) was chosen the same way
  (probe_merged_tiles.py --formats fp8_rowwise, H100, 19fd455, Qwen3-30B-A3B T = 1 28.0 -> 25.9
  us) and judged with probe_device_rows.py --against in the suite's cases: Qwen3 fp8 rowwise
  T = 1 27.4 against 25.8 us (3 rounds, results/probe_device_rows_fp8_19fd455.json). Scout's and
  Maverick's A = 2 rows of that run lost there (0.973, 0.945) and were not taken.
(132, 128, 5120, 1024, 'fp8_w8a16', 4), a key the table lacked, was chosen the same way
  (probe_merged_tiles.py, H100, 23f64cf, Maverick TP8 fp8_w8a16 T = 4, 46.7 -> 44.1 us) and
  judged with probe_device_rows.py --against in the suite's cases: Maverick TP8 fp8_w8a16 T = 4
  47.3 against 44.4 us, every one of 3 rounds (results/probe_device_rows_w8a16_23f64cf.json).
  That descent's other keys (Qwen3 fp8 A = 8..32 and fp8_w8a16 A = 8..64, Maverick fp8 A = 2..8
  and fp8_w8a16 A = 2, Scout fp8 and fp8_w8a16 A = 2..8) found nothing better than 1.009
  (results/probe_merged_tiles_fp8_w8a16_23f64cf.json, ..._scout_fp8_w8a16_23f64cf.json).
"""

BASE_DEVICE = 'NVIDIA H100 80GB HBM3'

TABLE: dict[tuple, tuple[tuple[int, ...], tuple[int, ...], bool]] = {
    (132, 1, 5120, 1024, 'bfloat16', 1): ((4, 2048, 1, 4, 2, 1), (16, 512, 1, 4, 2, 1), False),
    (132, 1, 5120, 1024, 'bfloat16', 16): ((32, 256, 4, 4, 3, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 1, 5120, 1024, 'bfloat16', 2): ((4, 2048, 1, 8, 2, 1), (64, 128, 1, 4, 4, 16), False),
    (132, 1, 5120, 1024, 'bfloat16', 32): ((32, 256, 4, 4, 3, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 1, 5120, 1024, 'bfloat16', 4): ((64, 128, 9, 4, 3, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 1, 5120, 1024, 'bfloat16', 64): ((64, 64, 4, 4, 4, 16), (64, 64, 1, 4, 4, 16), False),
    (132, 1, 5120, 1024, 'bfloat16', 8): ((64, 128, 9, 4, 3, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 128, 2048, 768, 'bfloat16', 16): ((4, 1024, 1, 4, 2, 1), (64, 128, 1, 4, 2, 1), True),
    (132, 128, 2048, 768, 'bfloat16', 32): ((16, 512, 1, 4, 2, 1), (32, 256, 1, 4, 2, 1), True),
    (132, 128, 2048, 768, 'bfloat16', 64): ((64, 128, 1, 4, 3, 16), (32, 128, 1, 4, 4, 16), False),
    (132, 128, 2048, 768, 'bfloat16', 8): ((4, 2048, 1, 4, 2, 1), (64, 256, 1, 8, 2, 1), True),
    (132, 128, 2048, 768, 'float8_e4m3fn', 16): ((32, 512, 1, 4, 2, 1), (64, 256, 1, 4, 2, 1), True),
    (132, 128, 2048, 768, 'float8_e4m3fn', 32): ((64, 256, 1, 4, 2, 1), (64, 256, 1, 4, 2, 1), True),
    (132, 128, 2048, 768, 'float8_e4m3fn', 64): ((128, 256, 1, 8, 3, 16), (64, 128, 1, 4, 4, 16), True),
    (132, 128, 2048, 768, 'float8_e4m3fn', 8): ((32, 512, 1, 4, 2, 1), (32, 512, 1, 4, 2, 1), True),
    (132, 128, 5120, 1024, 'bfloat16', 1): ((4, 2048, 1, 8, 2, 1), (64, 128, 1, 4, 4, 16), True),
    (132, 128, 5120, 1024, 'bfloat16', 16): ((4, 2048, 1, 4, 2, 1), (64, 128, 1, 4, 3, 16), False),
    (132, 128, 5120, 1024, 'bfloat16', 2): ((8, 1024, 1, 8, 2, 1), (32, 256, 1, 4, 2, 1), True),
    (132, 128, 5120, 1024, 'bfloat16', 32): ((4, 1024, 1, 4, 2, 1), (64, 128, 1, 4, 2, 1), False),
    (132, 128, 5120, 1024, 'bfloat16', 4): ((4, 1024, 1, 4, 2, 1), (32, 256, 1, 4, 2, 1), True),
    (132, 128, 5120, 1024, 'bfloat16', 64): ((64, 128, 1, 4, 3, 16), (64, 128, 1, 4, 3, 16), False),
    (132, 128, 5120, 1024, 'bfloat16', 8): ((4, 2048, 1, 4, 2, 1), (64, 128, 1, 4, 2, 1), False),
    (132, 128, 5120, 1024, 'float8_e4m3fn', 1): ((4, 2048, 1, 4, 2, 1), (64, 256, 1, 4, 4, 16), True),
    (132, 128, 5120, 1024, 'float8_e4m3fn', 2): ((8, 2048, 1, 8, 2, 1), (32, 512, 1, 4, 2, 1), False),
    (132, 128, 5120, 1024, 'float8_e4m3fn', 32): ((32, 512, 1, 4, 2, 1), (64, 128, 1, 4, 4, 16), True),
    (132, 128, 5120, 1024, 'float8_e4m3fn', 4): ((32, 1024, 1, 8, 2, 1), (64, 256, 1, 4, 2, 1), True),
    (132, 128, 5120, 1024, 'float8_e4m3fn', 64): ((64, 256, 1, 4, 4, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 128, 5120, 1024, 'float8_e4m3fn', 8): ((64, 512, 1, 8, 2, 1), (64, 128, 1, 4, 4, 16), False),
    (132, 128, 5120, 1024, 'fp8_w8a16', 1): ((4, 4096, 1, 4, 2, 1), (16, 1024, 1, 4, 2, 1), False),
    (132, 128, 5120, 1024, 'fp8_w8a16', 4): ((4, 2048, 1, 4, 2, 1), (64, 256, 1, 4, 2, 1), True),
    (132, 128, 5120, 1024, 'fp8_w8a16', 8): ((32, 512, 1, 4, 2, 1), (64, 256, 1, 4, 2, 1), False),
    (132, 16, 5120, 1024, 'bfloat16', 1): ((4, 2048, 1, 4, 2, 1), (4, 1024, 1, 4, 2, 1), True),
    (132, 16, 5120, 1024, 'bfloat16', 16): ((128, 128, 1, 8, 3, 16), (128, 128, 1, 8, 3, 16), True),
    (132, 16, 5120, 1024, 'bfloat16', 2): ((8, 1024, 1, 8, 2, 1), (16, 512, 1, 4, 2, 1), True),
    (132, 16, 5120, 1024, 'bfloat16', 32): ((64, 128, 1, 4, 4, 16), (64, 128, 1, 4, 3, 16), True),
    (132, 16, 5120, 1024, 'bfloat16', 4): ((4, 1024, 1, 4, 2, 1), (32, 256, 1, 4, 2, 1), True),
    (132, 16, 5120, 1024, 'bfloat16', 64): ((64, 128, 1, 4, 3, 16), (128, 128, 1, 4, 2, 16), False),
    (132, 16, 5120, 1024, 'bfloat16', 8): ((64, 128, 1, 4, 4, 16), (64, 128, 1, 4, 2, 1), True),
    (132, 16, 5120, 1024, 'float8_e4m3fn', 1): ((4, 4096, 1, 8, 2, 1), (64, 256, 1, 4, 4, 16), False),
    (132, 16, 5120, 1024, 'float8_e4m3fn', 16): ((64, 256, 1, 4, 2, 1), (128, 128, 1, 4, 3, 16), False),
    (132, 16, 5120, 1024, 'float8_e4m3fn', 2): ((4, 2048, 1, 4, 2, 1), (32, 512, 1, 4, 2, 1), False),
    (132, 16, 5120, 1024, 'float8_e4m3fn', 32): ((128, 256, 1, 8, 3, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 16, 5120, 1024, 'float8_e4m3fn', 4): ((16, 1024, 1, 4, 2, 1), (64, 128, 1, 4, 4, 16), True),
    (132, 16, 5120, 1024, 'float8_e4m3fn', 64): ((64, 128, 1, 4, 4, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 16, 5120, 1024, 'float8_e4m3fn', 8): ((32, 512, 1, 4, 2, 1), (64, 128, 1, 4, 4, 16), True),
    (132, 16, 5120, 1024, 'fp8_w8a16', 1): ((4, 4096, 1, 8, 2, 1), (16, 1024, 1, 4, 2, 1), False),
    (132, 16, 5120, 1024, 'fp8_w8a16', 2): ((4, 2048, 1, 4, 2, 1), (32, 512, 1, 4, 2, 1), True),
    (132, 16, 5120, 1024, 'fp8_w8a16', 8): ((32, 512, 1, 4, 2, 1), (64, 256, 1, 4, 2, 1), True),
    (132, 8, 4096, 7168, 'bfloat16', 16): ((64, 128, 1, 4, 4, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 8, 4096, 7168, 'bfloat16', 2): ((4, 2048, 1, 4, 2, 1), (64, 256, 1, 4, 3, 16), False),
    (132, 8, 4096, 7168, 'bfloat16', 32): ((64, 128, 1, 4, 4, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 8, 4096, 7168, 'bfloat16', 4): ((64, 128, 1, 4, 4, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 8, 4096, 7168, 'bfloat16', 64): ((64, 128, 1, 4, 4, 16), (64, 128, 1, 4, 4, 16), False),
    (132, 8, 4096, 7168, 'bfloat16', 8): ((64, 128, 1, 4, 3, 16), (64, 128, 1, 4, 3, 16), False),
    (132, 8, 4096, 7168, 'float8_e4m3fn', 16): ((128, 256, 1, 8, 3, 16), (64, 256, 1, 4, 4, 16), False),
    (132, 8, 4096, 7168, 'float8_e4m3fn', 2): ((64, 256, 1, 4, 2, 1), (64, 256, 1, 4, 4, 16), False),
    (132, 8, 4096, 7168, 'float8_e4m3fn', 32): ((128, 256, 1, 8, 3, 16), (64, 256, 1, 4, 4, 16), False),
    (132, 8, 4096, 7168, 'float8_e4m3fn', 4): ((128, 256, 1, 8, 3, 16), (64, 256, 1, 4, 4, 16), True),
    (132, 8, 4096, 7168, 'float8_e4m3fn', 64): ((128, 256, 1, 8, 3, 16), (64, 256, 1, 4, 4, 16), False),
    (132, 8, 4096, 7168, 'float8_e4m3fn', 8): ((128, 256, 1, 8, 3, 16), (64, 256, 1, 4, 3, 16), False),
    (132, 8, 4096, 7168, 'fp8_w8a16', 2): ((4, 4096, 1, 4, 2, 1), (16, 1024, 1, 4, 2, 1), False),
    (132, 8, 4096, 7168, 'fp8_w8a16', 4): ((32, 256, 1, 4, 2, 1), (64, 512, 1, 8, 2, 1), True),
}

BY_DEVICE: dict[str, dict[tuple, tuple[tuple[int, ...], tuple[int, ...], bool]]] = {
    'NVIDIA H200': {
        (132, 1, 5120, 1024, 'bfloat16', 1): ((8, 1024, 1, 8, 2, 1), (16, 512, 1, 4, 2, 1), False),
        (132, 1, 5120, 1024, 'bfloat16', 2): ((8, 1024, 1, 8, 2, 1), (64, 128, 1, 4, 4, 16), False),
        (132, 1, 5120, 1024, 'bfloat16', 8): ((64, 128, 8, 4, 3, 16), (64, 128, 1, 4, 4, 16), True),
        (132, 128, 2048, 768, 'bfloat16', 8): ((16, 512, 1, 4, 2, 1), (64, 256, 1, 8, 2, 1), True),
        (132, 128, 2048, 768, 'float8_e4m3fn', 64): ((128, 256, 1, 8, 3, 16), (64, 128, 1, 4, 4, 16), True),
        (132, 128, 2048, 768, 'float8_e4m3fn', 8): ((16, 1024, 1, 4, 2, 1), (32, 512, 1, 4, 2, 1), True),
        (132, 128, 5120, 1024, 'bfloat16', 1): ((8, 1024, 1, 8, 2, 1), (64, 128, 1, 4, 4, 16), False),
        (132, 128, 5120, 1024, 'bfloat16', 16): ((64, 128, 1, 4, 3, 16), (64, 128, 1, 4, 2, 1), False),
        (132, 128, 5120, 1024, 'float8_e4m3fn', 1): ((4, 4096, 1, 8, 2, 1), (64, 256, 1, 4, 4, 16), False),
        (132, 128, 5120, 1024, 'float8_e4m3fn', 16): ((128, 128, 1, 8, 4, 16), (64, 128, 1, 4, 4, 16), True),
        (132, 128, 5120, 1024, 'float8_e4m3fn', 32): ((128, 256, 1, 8, 3, 16), (64, 128, 1, 4, 4, 16), False),
        (132, 128, 5120, 1024, 'float8_e4m3fn', 4): ((32, 1024, 1, 8, 2, 1), (64, 128, 1, 4, 4, 16), True),
        (132, 128, 5120, 1024, 'float8_e4m3fn', 64): ((128, 128, 1, 4, 3, 16), (64, 128, 1, 4, 4, 16), False),
        (132, 16, 5120, 1024, 'bfloat16', 1): ((8, 1024, 1, 8, 2, 1), (64, 128, 1, 4, 4, 16), False),
        (132, 16, 5120, 1024, 'bfloat16', 4): ((4, 1024, 1, 4, 2, 1), (64, 64, 1, 4, 4, 16), True),
        (132, 16, 5120, 1024, 'float8_e4m3fn', 1): ((4, 2048, 1, 4, 2, 1), (64, 256, 1, 4, 4, 16), False),
        (132, 16, 5120, 1024, 'float8_e4m3fn', 2): ((4, 2048, 1, 4, 2, 1), (32, 512, 1, 4, 2, 1), True),
        (132, 16, 5120, 1024, 'float8_e4m3fn', 64): ((128, 256, 1, 8, 3, 16), (64, 128, 1, 4, 4, 16), True),
        (132, 16, 5120, 1024, 'float8_e4m3fn', 8): ((32, 512, 1, 4, 2, 1), (64, 128, 1, 4, 4, 16), True),
        (132, 8, 4096, 7168, 'float8_e4m3fn', 32): ((128, 256, 1, 8, 3, 16), (128, 256, 1, 8, 3, 16), True),
        (132, 8, 4096, 7168, 'float8_e4m3fn', 4): ((64, 256, 1, 4, 2, 1), (64, 256, 1, 4, 4, 16), False),
    },
}
