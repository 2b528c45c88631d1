"""The ops of one MoE layer. Each op has a torch reference (runs anywhere, never copies a size to
the host) and a Triton kernel (CUDA, or the CPU under TRITON_INTERPRET=1), both registered as
torch custom ops; the public function validates its arguments and picks one (see _impl)."""

from . import _impl
from ._impl import Ops, backend_for, interpreting, ops_for, triton_available, use_impl
from .gather_scale import gather_scale
from .grouped_gemm import grouped_gemm
from .index_shuffle import index_shuffle, sort_by_expert
from .moe_decode import decode_down, decode_gate_up
from .quantize import FP8_DTYPE, FP8_MAX, dequantize_fp8_rowwise, quantize_fp8_rowwise
from .scatter_add import scatter_add
from .shuffling import combine_shuffling, split_shuffling
from .silu_mul import silu_mul

_impl.load_ops()

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "Ops",
    "backend_for",
    "combine_shuffling",
    "decode_down",
    "decode_gate_up",
    "dequantize_fp8_rowwise",
    "gather_scale",
    "grouped_gemm",
    "index_shuffle",
    "interpreting",
    "ops_for",
    "quantize_fp8_rowwise",
    "scatter_add",
    "silu_mul",
    "sort_by_expert",
    "split_shuffling",
    "triton_available",
    "use_impl",
]
