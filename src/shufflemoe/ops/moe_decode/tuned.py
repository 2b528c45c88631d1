"""The fused decode kernels' tuning table: written by benchmarks/tune_decode.py, not by hand.

TABLE maps configs.table_key(...) = (SMs, E, D, I, weight dtype, A rounded up to a power of two)
to (gate_up, down) GemmConfig fields (block_n, block_k, split_k, num_warps, num_stages, block_m).
Empty: every shape takes configs' heuristic.
"""

TABLE: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}
