"""What Dynamo's guards cost a compiled decode step, ours against transformers' (one GPU call, ~1 min)

    PYTHONPATH=src python benchmarks/probe_guards.py --out $OUT [--shape qwen3-30b-a3b] [--device cuda]

Every call of a torch.compile'd model first evaluates the guards of its cache entry ("TorchDynamo
Cache Lookup" in a profile): in compiled generate at batch 1 the patched Qwen3-30B-A3B-shaped
model's lookup took 279 us a step against transformers' 129 (probe_generate_host's profile, H200
at dad0153), the difference between the two models' host time per compiled call. This probe
compiles one decode step (static cache, batch 1, fullgraph, backend "eager": Dynamo's guards do
not depend on the backend) of e2e_hf's model with transformers' default experts and of the
patched model, keeps each entry's guard tree, and times its evaluation warm (best of REPS loops
of LOOP checks; both models' trees in turns, --rounds times, once both are built). In the same
turns it times copies of each tree (clone_manager): one keeping everything and one without each
part (PARTS: the MoE blocks, the decoder layers, the module globals, the call's keyword
arguments; with --by-global each module global alone); a part's cost is the first copy's time
less the second's. Copies do not keep Dynamo's tag-safe marks: they run without the recursive
dict-tag fast path (torch 2.11's default; the whole tree's time has it), so a part's cost is
what it costs without that path. Then every leaf guard (child managers and the key
and value managers of dict guards) alone, each on the value its source evaluates to (an upper
bound: a Python call each; the accessors between them are not timed). --dict-tags on / off sets
Dynamo's recursive dict-tag matching (the fast path that skips a module's subtree whose dicts
are unchanged, for subtrees it finds safe). Writes
$OUT/probe_guards.json, the trees ($OUT/guards_<model>.txt) and the slowest leaves
($OUT/leaves_<model>.txt).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import statistics
import time

import torch
import torch._dynamo.guards as dynamo_guards
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from transformers import StaticCache

from shufflemoe.bench.report import metadata
from shufflemoe.bench.suites.e2e_hf import SHAPES
from shufflemoe.integrations.transformers import patch
from shufflemoe.integrations.transformers.models import build_model

LOOP, REPS, ROUNDS = 300, 7, 7
_BLOCKS = ("_modules['mlp']", "_modules['feed_forward']")  # Qwen3's and Llama 4's MoE blocks
# Parts of a tree, by the sources a copy without the part drops (and their subtrees)
PARTS = {
    "whole": None,
    "copy": lambda m: True,  # the baseline of the parts: a copy keeping everything
    "moe_blocks": lambda m: not any(b in m.get_source() for b in _BLOCKS),
    "decoder_layers": lambda m: "_modules['layers']._modules[" not in m.get_source(),
    "globals": lambda m: not m.get_source().startswith("G["),
    "shufflemoe_globals": lambda m: not m.get_source().startswith("G['__import_shufflemoe"),
    "call_kwargs": lambda m: not m.get_source().startswith("L['kwargs']"),  # the static cache
}
_built = []
_profile = dynamo_guards.profile_guard_manager


def _keep(root, scope, n_iters):
    """Dynamo profiles each new entry's guards once at compile time: keep the tree and scope."""
    _built.append((root, scope))
    return _profile(root, scope, n_iters)


def warm_us(root, scope) -> float:
    assert root.check(scope), ("the guards fail on the scope they were built from: "
                               f"{root.check_verbose(scope).verbose_code_parts}")
    best = float("inf")
    for _ in range(REPS):
        t0 = time.perf_counter()
        for _ in range(LOOP):
            root.check(scope)
        best = min(best, (time.perf_counter() - t0) / LOOP * 1e6)
    return best


def walk(wrapper, scope, n=200):
    """(rows of (us, kind, source), failures): every leaf guard of the tree (child managers and
    the key and value managers of dict guards), each timed on the value its source gives; those
    whose source or check raises count as failures."""
    env = dict(wrapper.closure_vars)
    env["G"] = wrapper.global_scope["G"]
    env["L"] = scope
    rows, fails = [], 0
    stack = [wrapper.root]
    while stack:
        m = stack.pop()
        stack.extend(m.get_child_managers())
        if hasattr(m, "get_key_value_managers"):  # a dict guard: its keys' and values' managers
            stack.extend(k for kv in m.get_key_value_managers().values() for k in kv if k)
        leaves = m.get_leaf_guards()
        if not leaves:
            continue
        src = m.get_source()
        try:
            value = eval(src, env) if src else scope
        except Exception:
            fails += len(leaves)
            continue
        for leaf in leaves:
            try:
                leaf(value)
            except Exception:
                fails += 1
                continue
            t0 = time.perf_counter()
            for _ in range(n):
                leaf(value)
            us = (time.perf_counter() - t0) / n * 1e6
            rows.append((us, type(leaf).__name__, src))
    return rows, fails


def report(rows, fails, top=25):
    rows.sort(reverse=True)
    tot = collections.defaultdict(float)
    cnt = collections.Counter()
    for us, kind, _ in rows:
        tot[kind] += us
        cnt[kind] += 1
    out = [f"leaves timed {len(rows)}, not evaluable {fails}, sum {sum(r[0] for r in rows):.1f} us"]
    out += [f"  {k}: {cnt[k]} leaves, {v:.1f} us" for k, v in sorted(tot.items(), key=lambda kv: -kv[1])]
    out += [f"  {us:7.2f} us {kind} {src[:200]}" for us, kind, src in rows[:top]]
    return "\n".join(out)


def module_globals(root) -> list[str]:
    """The sources G['<module>'] of the module globals a tree reads."""
    found, stack = set(), [root]
    while stack:
        m = stack.pop()
        src = m.get_source()
        hit = re.match(r"G\['__import_[^']*'\]", src)
        if hit:
            found.add(hit.group(0))
            continue
        stack.extend(m.get_child_managers())
    return sorted(found)


def kinds(tree: str) -> dict:
    return dict(collections.Counter(re.sub(r"^[ |+-]*", "", line).split(":")[0].split(" ")[0]
                                    for line in tree.splitlines()).most_common(12))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--shape", default="qwen3-30b-a3b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=0, help="depth (0: e2e_hf's)")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="warm timings of each, in turns")
    p.add_argument("--dict-tags", choices=("default", "on", "off"), default="default",
                   help="torch._dynamo.config.use_recursive_dict_tags_for_guards")
    p.add_argument("--by-global", action="store_true",
                   help="also time a copy without each module global the trees read (fair with "
                        "--dict-tags off)")
    args = p.parse_args()
    if args.dict_tags != "default":
        torch._dynamo.config.use_recursive_dict_tags_for_guards = args.dict_tags == "on"
    args.out.mkdir(parents=True, exist_ok=True)
    dynamo_guards.profile_guard_manager = _keep
    shape = next(s for s in SHAPES if s.name == args.shape)
    config = shape.config(False)
    if args.layers:
        config.num_hidden_layers = args.layers
    rows, kept = {}, {}
    with torch.no_grad():
        for name in ("transformers", "shufflemoe"):
            model = build_model(config, torch.bfloat16, args.device)
            if name == "shufflemoe":
                patch(model)
            cache = StaticCache(config=model.config, max_cache_len=160)
            ids = torch.randint(2, config.vocab_size, (1, 128), device=args.device)
            model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            step = torch.compile(model, fullgraph=True, backend="eager")
            built = len(_built)
            tok = ids[:, -1:]
            for i in range(2):
                step(tok, past_key_values=cache, use_cache=True, logits_to_keep=1,
                     cache_position=torch.tensor([128 + i], device=args.device))
            root, scope = _built[-1]
            wrapper = _debug_get_cache_entry_list(model.forward.__code__)[0].guard_manager
            tree = str(wrapper)
            leaves = report(*walk(wrapper, scope))
            (args.out / f"leaves_{name}.txt").write_text(leaves + "\n")
            print(leaves, flush=True)
            (args.out / f"guards_{name}.txt").write_text(tree)
            rows[name] = dict(entries=len(_built) - built, lines=len(tree.splitlines()),
                              kinds=kinds(tree))
            # The scope holds the model: both stay alive, and Dynamo is not reset between them
            # (a reset takes the names its guards read out of the model's module globals)
            kept[name] = (root, scope)
            _built.clear()
        # the whole tree, then each copy without one part, in turns (a slow spell of the
        # host falls on every variant): a part's cost = whole - without it
        parts = {name: dict(PARTS) for name in kept}
        if args.by_global:
            for name, (root, _) in kept.items():
                for g in module_globals(root):
                    parts[name]["G:" + g] = (lambda g: lambda m: not m.get_source().startswith(g))(g)
        trees = {(name, part): root if keep is None else root.clone_manager(keep)
                 for name, (root, _) in kept.items() for part, keep in parts[name].items()}
        times = {key: [] for key in trees}
        for _ in range(args.rounds):
            for (name, part), tree in trees.items():
                times[name, part].append(round(warm_us(tree, kept[name][1]), 2))
        for name, row in rows.items():
            row["warm_us"] = times[name, "whole"]
            row["warm_us_median"] = statistics.median(row["warm_us"])
            copy = statistics.median(times[name, "copy"])
            row["copy_us_median"] = copy
            row["part_us"] = {part: round(copy - statistics.median(times[name, part]), 2)
                              for part in parts[name] if part not in ("whole", "copy")}
            print(name, row, flush=True)
    (args.out / "probe_guards.json").write_text(json.dumps(
        dict(meta=metadata(), shape=args.shape, layers=config.num_hidden_layers,
             dict_tags=torch._dynamo.config.use_recursive_dict_tags_for_guards, rows=rows), indent=1))


if __name__ == "__main__":
    main()
