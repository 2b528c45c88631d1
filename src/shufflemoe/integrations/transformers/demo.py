"""``shufflemoe demo --hf``: a tiny random transformers model per supported model_type, on the CPU,
unpatched then patched: float32 logits error and whether 16 greedy tokens are identical."""

from __future__ import annotations

import time

import torch

from ...testing import compare
from .models import TINY, build_model, tiny_config
from .patch import patch

_GEN = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)


def _parity(model_type: str) -> dict:
    model = build_model(tiny_config(model_type), torch.float32)
    ids = torch.randint(2, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref_logits, ref_tokens = model(ids).logits, model.generate(ids, **_GEN)
        patch(model)
        start = time.perf_counter()
        logits, tokens = model(ids).logits, model.generate(ids, **_GEN)
        seconds = time.perf_counter() - start
    c = compare(logits, ref_logits, torch.float32)
    return dict(model_type=model_type, max_err=c.max_err_over_rms, logits_ok=c.ok,
                tokens_same=torch.equal(tokens, ref_tokens), seconds=seconds)


def run_demo() -> int:
    """Print the parity table; returns 0 when every model type matches, else 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second OpenMP thread only adds barrier waits
    try:
        rows = [_parity(t) for t in TINY]
    finally:
        torch.set_num_threads(threads)
    print("shufflemoe in HF transformers: tiny random models, float32, CPU, patched vs unpatched")
    print(f"{'model type':<13} {'max logits err / rms':>21} {'greedy tokens identical':>24} "
          f"{'patched time (s)':>17}")
    for r in rows:
        err = f"{r['max_err']:.2e}" + ("" if r["logits_ok"] else " FAIL")
        print(f"{r['model_type']:<13} {err:>21} {'yes' if r['tokens_same'] else 'NO':>24} "
              f"{r['seconds']:>17.2f}")
    ok = all(r["logits_ok"] and r["tokens_same"] for r in rows)
    print("all model types match" if ok else "MISMATCH: see the rows above")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(run_demo())
