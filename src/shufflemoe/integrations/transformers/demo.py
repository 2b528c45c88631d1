"""``shufflemoe demo --hf``: a tiny random transformers model per supported model_type, on the CPU,
unpatched then patched: float32 logits error and whether 16 greedy tokens are identical; and a
gpt-oss MXFP4 checkpoint run as stored against transformers' own dequantized load of it."""

from __future__ import annotations

import tempfile
import time

import torch

from ...testing import compare
from .models import TINY, build_model, tiny_config
from .patch import patch
from .quantized import load_as_stored, save_mxfp4_checkpoint

_GEN = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)


def _parity(name: str, model, ours=None) -> dict:
    """Logits and greedy tokens of ``model`` before and after patching (or of ``ours``, patched,
    against ``model``)."""
    ids = torch.randint(2, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref_logits, ref_tokens = model(ids).logits, model.generate(ids, **_GEN)
        ours = patch(model if ours is None else ours)
        start = time.perf_counter()
        logits, tokens = ours(ids).logits, ours.generate(ids, **_GEN)
        seconds = time.perf_counter() - start
    c = compare(logits, ref_logits, torch.float32)
    return dict(model_type=name, max_err=c.max_err_over_rms, logits_ok=c.ok,
                tokens_same=torch.equal(tokens, ref_tokens), seconds=seconds)


def _mxfp4_parity() -> dict:
    """A gpt-oss MXFP4 checkpoint: transformers' own dequantized load (unpatched) against the
    experts as stored (load_as_stored, patched); the same weight values either way."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its loading report and progress bars
    hf_logging.disable_progress_bar()
    try:
        return _parity("gpt_oss mxfp4", *_mxfp4_models())
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def _mxfp4_models() -> tuple:
    from transformers import AutoModelForCausalLM, Mxfp4Config

    with tempfile.TemporaryDirectory() as path:
        save_mxfp4_checkpoint(build_model(tiny_config("gpt_oss"), torch.bfloat16), path)
        ref = AutoModelForCausalLM.from_pretrained(
            path, quantization_config=Mxfp4Config(dequantize=True)).float().eval()
        with load_as_stored():
            ours = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return ref, ours


def run_demo() -> int:
    """Print the parity table; returns 0 when every model type matches, else 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second OpenMP thread only adds barrier waits
    try:
        rows = [_parity(t, build_model(tiny_config(t), torch.float32)) for t in TINY]
        rows.append(_mxfp4_parity())
    finally:
        torch.set_num_threads(threads)
    print("shufflemoe in HF transformers: tiny random models, float32, CPU, patched vs unpatched")
    width = max(len(r["model_type"]) for r in rows)
    print(f"{'model type':<{width}} {'max logits err / rms':>21} {'greedy tokens identical':>24} "
          f"{'patched time (s)':>17}")
    for r in rows:
        err = f"{r['max_err']:.2e}" + ("" if r["logits_ok"] else " FAIL")
        print(f"{r['model_type']:<{width}} {err:>21} {'yes' if r['tokens_same'] else 'NO':>24} "
              f"{r['seconds']:>17.2f}")
    print("gpt_oss mxfp4: a checkpoint in gpt-oss's MXFP4 layout, run as stored, against "
          "transformers' own dequantized load of it")
    ok = all(r["logits_ok"] and r["tokens_same"] for r in rows)
    print("all model types match" if ok else "MISMATCH: see the rows above")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(run_demo())
