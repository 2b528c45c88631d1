"""The running GPU's own decode rows (tuned.BY_DEVICE) against the base table's, in the layer
(one GPU call): every preset that has such rows, at every decode T its fused path takes, the
layer in CUDA-graph replays over rotated weights, the two plans timed in turns (ABAB...) for
--rounds rounds. The plan of each launch is the table's for that GPU (``configs.planned`` with
its name) or the base table's (the same, with ""); everything else as the layer ships.
With --against FILE (a tuned.py from another commit: `git show <commit>:src/shufflemoe/ops/
moe_decode/tuned.py > FILE`, in the working tree so that it travels to the device) "base" is
that file's tables as this GPU reads them instead, and the cases are the keys whose rows differ
between the two: a retune judged against the rows it replaced, in turns in one process (a
layer suite run after it compares across calls, where the machine alone moves times 1-5%).

    PYTHONPATH=src python benchmarks/probe_device_rows.py --out $OUT [--against FILE]
    PYTHONPATH=src python benchmarks/probe_device_rows.py --dry-run --out /tmp/x   (CPU)

Writes $OUT/probe_device_rows.json: per (preset, dtype, T) the median us of each plan over the
rounds, every round's times, and own / base.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pathlib
import statistics
import sys

if "--dry-run" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton decorates any kernel

import torch  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from decode_check import inputs, layers_for, tiny, weight_sets  # noqa: E402
from tune_decode import DTYPES, PRESETS, N_INPUTS, quant_at, time_us  # noqa: E402

from shufflemoe.ops import use_impl  # noqa: E402
from shufflemoe.ops.moe_decode import configs  # noqa: E402


def plan(cfg, gpu: str, tables=None):
    """configs.select for every launch of a layer of ``cfg``: the tables (configs' own, or those
    of the module ``tables``) as ``gpu`` reads them."""
    def chosen(k):
        with swapped(tables):
            return configs.planned(k, quant_at(k, cfg), gpu)
    return chosen


@contextlib.contextmanager
def swapped(tables):
    """configs reads the tables of the module ``tables`` (None: its own) inside the block."""
    if tables is None:
        yield
        return
    own = configs.TABLE, configs.BY_DEVICE
    configs.TABLE, configs.BY_DEVICE = tables.TABLE, tables.BY_DEVICE
    configs.table_changed()
    try:
        yield
    finally:
        configs.TABLE, configs.BY_DEVICE = own
        configs.table_changed()


def load_tables(path: pathlib.Path):
    """The module a tuned.py at ``path`` defines (TABLE, BY_DEVICE)."""
    spec = importlib.util.spec_from_file_location("tuned_against", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def differing(tables, gpu: str) -> dict:
    """The keys whose rows ``gpu`` reads differently from configs' tables and from ``tables``'."""
    def rows(t):
        return {**t.TABLE, **t.BY_DEVICE.get(gpu, {})}
    own, other = rows(configs), rows(tables)
    return {k: own.get(k) for k in own.keys() | other.keys() if own.get(k) != other.get(k)}


def cases(rows: dict, presets: list[str], dtypes: list[str]) -> list[tuple[str, str, int]]:
    """(preset, dtype, T): the decode T (powers of two, A = T k <= Switch.max_pairs) of presets
    whose routed experts' shape has a row of the GPU's own in that dtype."""
    out = []
    for name in presets:
        cfg = PRESETS[name]
        shape = (cfg.num_experts, cfg.hidden_size, cfg.intermediate_size)
        for dtype in dtypes:
            weight = "float8_e4m3fn" if dtype == "fp8" else "bfloat16"
            if not any(k[1:4] == shape and k[4] in (weight, DTYPES[dtype]) for k in rows):
                continue
            T = 1
            while T * cfg.top_k <= configs.Switch().max_pairs:
                out.append((name, dtype, T))
                T *= 2
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--presets", default="scout-tp8,maverick-tp8,qwen3-30b-a3b,mixtral-tp2")
    p.add_argument("--dtypes", default="bf16,fp8")
    p.add_argument("--as-device", default=None, help="whose rows (default: this GPU's name)")
    p.add_argument("--against", type=pathlib.Path, default=None,
                   help="a tuned.py whose tables are the base (default: the base table)")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    gpu = args.as_device or ("" if dry else torch.cuda.get_device_name())
    from shufflemoe.bench.report import metadata

    against = load_tables(args.against) if args.against else None
    own_rows = differing(against, gpu) if against else configs.BY_DEVICE.get(gpu, {})
    result = dict(meta=dict(metadata(), device=gpu or "cpu (dry run)"), rows=[],
                  own_rows=len(own_rows), against=str(args.against or "the base table"))
    todo = cases(own_rows, args.presets.split(","), args.dtypes.split(","))
    if dry:
        todo = todo[:1]
    with use_impl("triton"):
        for name, dtype, T in todo:
            cfg = PRESETS[name].replace(quantization=DTYPES[dtype])
            if dry:
                cfg = tiny(cfg)
            layers = layers_for(cfg, 1 if dry else weight_sets(cfg, T), device)
            xs = inputs(cfg, T, device, 2 if dry else N_INPUTS)
            run = lambda i: layers[i % len(layers)](xs[i])  # noqa: E731
            times: dict = {"own": [], "base": []}
            for _ in range(1 if dry else args.rounds):
                for lab, who, tables in (("own", gpu, None),
                                         ("base", gpu if against else "", against)):
                    with configs.override(plan(cfg, who, tables)):
                        if dry:
                            run(0)
                            us = float("nan")
                        else:
                            us = time_us(run, len(xs), 30)
                    times[lab].append(us)
            own, base = (statistics.median(times[k]) for k in ("own", "base"))
            result["rows"].append(dict(preset=name, dtype=dtype, T=T, own_us=own, base_us=base,
                                       own_over_base=own / base, rounds=times))
            print(f"{name} {dtype} T={T}: own {own:.1f} us, base {base:.1f} us, "
                  f"own/base {own / base:.3f}", flush=True)
            del layers
            if not dry:
                torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_device_rows.json").write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
