"""Kernel-global constants survive Inductor's copy: torch.compile pastes each user kernel's source,
with the module constants it reads, into a string literal of its generated code, where an escape
sequence (a newline in a PTX string, say) is decoded once too often and breaks the kernel's source
(H100, fe901e6: every compiled decode test failed on "unterminated string literal")."""

import importlib
import pkgutil

import triton.language as tl

import shufflemoe.ops


def test_kernel_string_constants_have_no_escapes():
    found = []
    for info in pkgutil.walk_packages(shufflemoe.ops.__path__, "shufflemoe.ops."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, tl.constexpr) and isinstance(value.value, str):
                found.append(name)
                assert value.value.isprintable() and "\\" not in value.value, (info.name, name)
    assert "E2M1_BF16_PTX" in found  # the check reaches the PTX constants
