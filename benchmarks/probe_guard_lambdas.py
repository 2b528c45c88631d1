"""Which guards of a compiled layer call Python (one GPU call, ~1 min)

    PYTHONPATH=src python benchmarks/probe_guard_lambdas.py

Compiles (backend "eager") a stack of three layers of each of tests/test_compile.py's configs
(impl "triton", T = 1, 2, 8), and tiny transformers models patched and through the "shufflemoe"
experts implementation (bf16, batch 1, 1 and 3 tokens), and prints every guard manager reached
through a Python accessor (PythonLambdaGuardAccessor: e.g. dataclasses.fields() of a dataclass
whose default a trace read, on torch 2.11), which runs Python at every check of the entry."""

from __future__ import annotations

import sys

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

sys.path.insert(0, "tests")
from factories import make_input, make_layer  # noqa: E402
from test_compile import CONFIGS, KERNEL_CONFIGS  # noqa: E402

from shufflemoe.integrations.transformers import (  # noqa: E402
    patch, register_experts_implementation)
from shufflemoe.integrations.transformers.models import build_model, tiny_config  # noqa: E402
from shufflemoe.ops import use_impl  # noqa: E402


def run(model, x):
    for layer in model:
        x = layer(x)
    return x


def python_accessors(code) -> list[str]:
    tree = str(_debug_get_cache_entry_list(code)[0].guard_manager)
    return [line.split("source=")[1][:160] for line in tree.splitlines()
            if "PythonLambdaGuardAccessor" in line]


def models(dev: str) -> None:
    register_experts_implementation()
    for model_type in ("qwen3_moe", "llama4_text"):
        for how in ("patch", "experts_implementation"):
            if how == "experts_implementation" and model_type == "llama4_text":
                continue  # Llama 4's experts are not transformers' experts interface
            model = build_model(tiny_config(model_type), torch.bfloat16, dev)
            if how == "patch":
                patch(model)
            else:
                model.set_experts_implementation("shufflemoe")
            for S in (1, 3):
                ids = torch.randint(2, 128, (1, S), device=dev)
                torch._dynamo.reset()
                with torch.no_grad():
                    model(ids)
                    torch.compile(model, fullgraph=True, backend="eager")(ids)
                hits = python_accessors(model.forward.__code__)
                print(f"{model_type} {how} S={S}: {len(hits)} python accessors", *hits,
                      sep="\n  ", flush=True)


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    models(dev)
    for name, cfg in {**CONFIGS, **KERNEL_CONFIGS}.items():
        model = torch.nn.ModuleList(make_layer(cfg, device=dev) for _ in range(3))
        for T in (1, 2, 8):
            x = make_input(cfg, T, device=dev)
            torch._dynamo.reset()
            with use_impl("triton"), torch.no_grad():
                run(model, x)
                torch.compile(run, fullgraph=True, backend="eager")(model, x)
            hits = python_accessors(run.__code__)
            print(f"{name} T={T}: {len(hits)} python accessors", *hits, sep="\n  ", flush=True)


if __name__ == "__main__":
    main()
