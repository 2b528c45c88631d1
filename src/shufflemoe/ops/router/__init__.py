"""The router's logits at decode sizes: logits [T, E] = x [T, D] @ w [E, D]^T (+ bias [E]) in one
launch (kernel.py), where cuBLAS takes one or two (a split-K GEMM and its reduction)."""

GEMV_MAX_TOKENS = 8  # the kernel up to this many tokens, whatever E
GEMV_MAX_PRODUCTS = 2048  # ... and past it while E x T is at most this (few experts: Llama 4, Mixtral)


def uses_kernel(T: int, E: int) -> bool:
    """Whether router_logits takes the kernel (else F.linear) for T tokens and E experts. Its
    programs multiply on the CUDA cores: past 8 tokens it wins only while E x T is small (H100,
    CUDA graphs, benchmarks/results/probe_router_tokens_9f8fa1e.json, us, kernel / F.linear:
    Llama 4 Scout E = 16 at T = 64 3.7 / 6.1 and T = 128 4.7 / 6.1, Mixtral E = 8 at T = 256
    3.9 / 5.9, Qwen3 E = 128 at T = 16 3.9 / 5.5; lost at E x T = 4096: Scout T = 256 8.3 / 6.5,
    Qwen3 T = 32 5.5 / 5.6, DeepSeek-V3 E = 256 at T = 16 9.7 / 6.6)."""
    return T <= GEMV_MAX_TOKENS or E * T <= GEMV_MAX_PRODUCTS
