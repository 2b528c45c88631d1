"""Which guards of a compiled layer call Python (one GPU call, ~1 min)

    PYTHONPATH=src python benchmarks/probe_guard_lambdas.py

Compiles a stack of three layers of each of tests/test_compile.py's configs (backend "eager",
impl "triton", T = 1, 2, 8) and prints every guard manager reached through a Python accessor
(PythonLambdaGuardAccessor: e.g. dataclasses.fields() of a dataclass whose default a trace
read, on torch 2.11), which runs Python at every check of the cache entry."""

from __future__ import annotations

import sys

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

sys.path.insert(0, "tests")
from factories import make_input, make_layer  # noqa: E402
from test_compile import CONFIGS, KERNEL_CONFIGS  # noqa: E402

from shufflemoe.ops import use_impl  # noqa: E402


def run(model, x):
    for layer in model:
        x = layer(x)
    return x


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for name, cfg in {**CONFIGS, **KERNEL_CONFIGS}.items():
        model = torch.nn.ModuleList(make_layer(cfg, device=dev) for _ in range(3))
        for T in (1, 2, 8):
            x = make_input(cfg, T, device=dev)
            torch._dynamo.reset()
            with use_impl("triton"), torch.no_grad():
                run(model, x)
                torch.compile(run, fullgraph=True, backend="eager")(model, x)
            tree = str(_debug_get_cache_entry_list(run.__code__)[0].guard_manager)
            hits = [line.split("source=")[1][:160] for line in tree.splitlines()
                    if "PythonLambdaGuardAccessor" in line]
            print(f"{name} T={T}: {len(hits)} python accessors", *hits, sep="\n  ", flush=True)


if __name__ == "__main__":
    main()
