"""Greedy generation with a transformers MoE model across processes, checked against one process.

    torchrun --standalone --nproc-per-node 2 examples/distributed_generate.py
    torchrun --standalone --nproc-per-node 2 examples/distributed_generate.py --layout ep_allgather
    torchrun --standalone --nproc-per-node 2 examples/distributed_generate.py --device cuda \
        --model-type qwen3_moe --dtype bfloat16 --json results.json

Every rank builds the same model (a random tiny one of --model-type, seeded, or --model PATH),
generates greedily alone with the unpatched model (the one-process reference), then runs the same
prompts with its MoE blocks parallel (shufflemoe.integrations.transformers.patch_distributed) and
compares the tokens. tp: every rank runs the same prompts; ep_*: each rank its own prompts, as
data-parallel attention does. Prints one line per layout and rank; exits 1 on a mismatch. gloo on
the CPU, NCCL on CUDA (keep NCCL_NVLS_ENABLE=0 on the lent H200 pair).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from shufflemoe.integrations.transformers import patch_distributed, unpatch
from shufflemoe.integrations.transformers.models import build_model, tiny_config
from shufflemoe.parallel import exit_rank

LAYOUTS = ("tp", "ep_alltoall", "ep_allgather")


def prompts(args, rank: int, layout: str) -> torch.Tensor:
    """[batch, prompt_len] token ids: the same on every rank for tp, this rank's own for EP."""
    seed = 1 if layout == "tp" else 1 + rank
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, args.vocab, (args.batch, args.prompt_len), generator=g)


def generate(model, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, float]:
    """(greedy continuation [batch, new_tokens], seconds); every rank runs every step."""
    if ids.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, pad_token_id=0)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return out[:, ids.shape[1]:], time.perf_counter() - t0


def decode_rate(model, ids: torch.Tensor, new_tokens: int) -> float:
    """Decode tokens/s of the batch: (n - 1) steps, the first (prefill) subtracted."""
    _, t1 = generate(model, ids, 1)
    _, tn = generate(model, ids, new_tokens)
    return ids.shape[0] * (new_tokens - 1) / max(tn - t1, 1e-9)


def load_model(args, device: str):
    dtype = getattr(torch, args.dtype)
    if args.model:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    return build_model(tiny_config(args.model_type), dtype=dtype, device=device, seed=0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layout", action="append", choices=LAYOUTS, help="repeatable; default all")
    p.add_argument("--model-type", default="qwen3_moe")
    p.add_argument("--model", help="a pretrained checkpoint instead of a tiny random model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--vocab", type=int, default=128, help="prompt ids are drawn below this")
    p.add_argument("--timing", action="store_true", help="also measure decode tokens/s")
    p.add_argument("--json", help="write every rank's results here (rank 0 writes)")
    args = p.parse_args(argv)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = f"cuda:{torch.cuda.current_device()}"
    torch.set_num_threads(1)
    model = load_model(args, device)
    rows, failures = [], 0
    for layout in args.layout or LAYOUTS:
        ids = prompts(args, rank, layout).to(device)
        unpatch(model)
        want, _ = generate(model, ids, args.new_tokens)
        single = decode_rate(model, ids, args.new_tokens) if args.timing else None
        patch_distributed(model, layout)
        got, _ = generate(model, ids, args.new_tokens)
        rate = decode_rate(model, ids, args.new_tokens) if args.timing else None
        same = torch.equal(got, want)
        failures += not same
        rows.append(dict(layout=layout, rank=rank, world=world, match=same,
                         tokens=got.tolist(), reference=want.tolist(),
                         decode_tokens_per_s=rate, single_decode_tokens_per_s=single))
        print(f"rank {rank}/{world} {layout:13} {'MATCH' if same else 'MISMATCH'} "
              f"{got[0].tolist()}" + (f" decode {rate:.1f} tok/s (one process {single:.1f})"
                                      if rate else ""), flush=True)
    every = [None] * world
    dist.all_gather_object(every, rows)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump([r for part in every for r in part], f, indent=1)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    exit_rank(main())  # not sys.exit: see exit_rank (gloo threads at interpreter shutdown)
