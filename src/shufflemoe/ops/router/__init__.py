"""The router's logits at decode sizes: logits [T, E] = x [T, D] @ w [E, D]^T (+ bias [E]) in one
launch (kernel.py), where cuBLAS takes one or two (a split-K GEMM and its reduction)."""

GEMV_MAX_TOKENS = 8  # one launch up to this many tokens (kernel.py), F.linear above
