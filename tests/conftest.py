"""Test setup. Without a GPU, Triton kernels run in the interpreter on CPU tensors: the variable
must be set before triton.jit decorates any kernel, so it is set here, before shufflemoe imports."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests run many small ops: one thread avoids OpenMP spin-waiting, which made them 10-50x
# slower whenever the two CI cores had any other load.
torch.set_num_threads(1)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("gpu", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gpu" if torch.cuda.is_available() else "ci"))

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


def kernel_impls() -> list:
    """Implementations to test an op with: the torch reference, and the Triton kernel (on the GPU,
    or in the interpreter on the CPU)."""
    return ["torch", "triton"]
