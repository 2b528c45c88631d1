"""End-to-end transformers inference on the GPU: a patched model against transformers' own, on
every path a user takes, each compared like for like:

| mode | transformers (peer) | shufflemoe (ours) |
| --- | --- | --- |
| eager | its experts implementations (grouped_mm, batched_mm at decode b1) | patch(model, graph_buckets=None); and experts_implementation="shufflemoe" |
| layer_graphs | (none: compared with transformers eager, labelled as each library's default path) | patch(model): per-layer CUDA graphs, the default |
| compile | torch.compile(model), decode b1 | torch.compile(patch(model)), decode b1 |
| compiled_generate | generate() on a static cache (compiles the decode step) | the same on the patched model |
| step_graph | the whole forward / decode step in one CUDA graph | the same on the patched model |

Models (random bf16 weights, created on the GPU by transformers' own init): Llama-4-Scout-shaped
(hidden 5120, 16 experts of 8192, shared expert, top-1) and Qwen3-30B-A3B-shaped (hidden 2048,
128 experts of 768, top-8), at real widths and reduced depth (4 and 8 layers; quick: 2 and 4;
kept low because every compiled path compiles the whole model). The vocabulary is scaled with the
depth (vocab * layers / 48) so the LM head keeps the share of the step it has at full depth. All
layers use full causal attention (for these lengths, < Llama 4's 8192-token chunks, chunked
attention is the same computation). transformers does not compile Llama 4 in generate
(get_compiled_call returns __call__ for llama4), so its compiled_generate rows run uncompiled,
for both sides.

Phases: prefill of 2048 tokens (batch 1, no cache, logits of the last token only); decode at
batch 1 and 64 after a 128-token prompt. Decode times are medians of >= 3 repeats (ms, with
min / max); the decode paths bound by the host (eager and per-layer graphs, launched from
Python; torch.compile at batch 1; compiled generate, which syncs every step) take their
INTERLEAVED_REPEATS samples in turns, ABC ABC ..., within each group of modes
(INTERLEAVED_GROUPS), each path on its own copy of the model, so that a slow spell of the host
falls on all of them; tokens/s = batch / step time. floor_ms
(decode): the bytes a step must read (weights but the embedding table, routed experts in
expected use, the prompt's KV cache) over the read ceiling; x_floor = ms / floor_ms. check: logits of the timed path (prefill; one decode step with
fixed input tokens; generate's second position, over the sequences whose first token matches
the reference's, at least GENERATE_CHECK_SEQUENCES of them: 8 prompts at batch 1) against the
same model in float32 (the same weights upcast, transformers' eager code): a row passes when its relative L2 error is at most ACCURACY_RATIO x transformers' bf16
eager error against that reference, + ACCURACY_FLOOR. logits_rel_l2_vs_hf: against transformers'
bf16 eager logits, for information.
"""

from __future__ import annotations

import gc
import traceback
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig

from ...integrations.transformers import patch, register_experts_implementation, unpatch
from ...integrations.transformers.models import build_model
from ..analysis import failed_check, ratios, select, span, tally, target
from . import Analysis, Context, SuiteResult, e2e_paths, suite

BATCHES = (1, 64)
COMPILE_BATCHES = (1,)
COMPILE_OPTIONS: dict = {}  # torch.compile's defaults (a CPU dry run uses backend="eager")
GENERATE_TOKENS = (8, 40)  # per-step time of compiled generate from these two lengths
# Compiled generate's check covers at least this many sequences (batch 1: that many prompts). One
# sequence's error is a sample of one: at batch 1 on Qwen3-30B-A3B, transformers' own compiled
# generate is 1.32x its eager error on e2e's first prompt, ours 2.2x, and over 8 prompts both are
# within 1% of transformers' eager mean (H100, benchmarks/results/probe_generate_b1.json).
GENERATE_CHECK_SEQUENCES = 8
# Decode bound by the host (launched from Python; compiled generate syncs every step): timed in
# turns, one group of modes at a time (the compiled groups hold two compiled models at once).
INTERLEAVED_GROUPS = (("eager", "layer_graphs"), ("compile",), ("compiled_generate",))
INTERLEAVED_MODES = tuple(m for group in INTERLEAVED_GROUPS for m in group)
INTERLEAVED_REPEATS, INTERLEAVED_REPEATS_QUICK = 7, 3
# A row's logits error against the float32 model may be this many times transformers' bf16 eager
# error, plus the floor: about one bf16 rounding of the logits (2^-8), for paths whose reference
# error is tiny. A wrong model gives ~1.
ACCURACY_RATIO = 1.25
ACCURACY_FLOOR = 2.0 ** -8
KEYS = ["model", "phase", "batch"]
# Decode targets, ours / transformers' fastest of the same mode at b1 and b64 (issue 21): eager vs
# eager and per-layer graphs (our default) vs transformers eager, per model (transformers'
# attention and the rest of the step bound what the MoE blocks can win); torch.compile, compiled
# generate and the whole-step graph vs transformers' own; prefill b1 eager.
DECODE_TARGETS = {"llama4-scout": (1.5, 1.8), "qwen3-30b-a3b": (1.1, 1.2)}
SAME_MODE_TARGET = 1.3
PREFILL_TARGET = 1.2
CROSS = [("layer_graphs", "eager", "default path vs default path (ours: per-layer graphs; transformers: eager)")]
COLUMNS = ["model", "phase", "batch", "impl", "mode", "ms", "tokens_per_s", "floor_ms", "x_floor",
           "logits_rel_l2_vs_fp32", "hf_rel_l2_vs_fp32", "logits_rel_l2_vs_hf", "check", "note"]


@dataclass(frozen=True)
class Shape:
    name: str
    model_type: str
    fields: dict  # HF config fields at real width
    layers: int  # depth benchmarked (quick: quick_layers)
    quick_layers: int
    full_layers: int  # depth of the real model, to scale the vocabulary
    full_vocab: int

    def config(self, quick: bool):
        layers = self.quick_layers if quick else self.layers
        vocab = max(64, round(self.full_vocab * layers / self.full_layers / 64) * 64)
        # Llama 4: every layer full attention (its chunked layers keep their length in a Python
        # int, which a captured graph would freeze); other models have only full attention and
        # must not get layer_types (generate would then build one mask per layer type).
        extra = dict(layer_types=["full_attention"] * layers) if self.model_type == "llama4_text" else {}
        return AutoConfig.for_model(self.model_type, **self.fields, num_hidden_layers=layers,
                                    vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=None,
                                    **extra)


SHAPES = [
    Shape("llama4-scout", "llama4_text", dict(
        hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=16,
        num_experts_per_tok=1, interleave_moe_layer_step=1, num_attention_heads=40,
        num_key_value_heads=8, head_dim=128), layers=4, quick_layers=2, full_layers=48,
        full_vocab=202048),
    Shape("qwen3-30b-a3b", "qwen3_moe", dict(
        hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128), layers=8, quick_layers=4, full_layers=48, full_vocab=151936),
]


@dataclass(frozen=True)
class Path:
    impl: str  # row label
    side: str  # "ours" | "peer"
    mode: str  # analysis.MODES
    setup: str  # "hf" (transformers, experts = its implementation) | "patch_eager" | "patch"
    experts: str | None = None  # transformers experts_implementation to select ("hf")
    phases: tuple[str, ...] = ("prefill", "decode")
    batches: tuple[int, ...] | None = None  # decode batches (None: BATCHES)


def paths(model_type: str) -> list[Path]:
    """The rows of one model, transformers' first (its eager default is the check's reference)."""
    if model_type == "llama4_text":  # Llama4TextExperts has no experts_implementation registry
        default, label = None, "transformers (default)"
        hf = [Path(label, "peer", "eager", "hf")]
    else:
        default, label = "grouped_mm", "transformers grouped_mm (default)"
        hf = [Path(label, "peer", "eager", "hf", default),
              # batched_mm gathers one weight matrix per token-expert pair: decode batch 1 only
              # (at batch 64 it asked for 384 GiB on 8aca447). transformers' "eager" experts (a
              # per-expert loop) are left out: 0.06-0.41x grouped_mm there.
              Path("transformers batched_mm", "peer", "eager", "hf", "batched_mm", ("decode",), (1,)),
              Path("transformers batched_mm + step graph", "peer", "step_graph", "hf", "batched_mm",
                   ("decode",), (1,)),
              Path("transformers + shufflemoe experts", "ours", "eager", "hf", "shufflemoe")]
    return hf + [
        Path(f"{label} + step graph", "peer", "step_graph", "hf", default),
        Path(f"{label} + torch.compile", "peer", "compile", "hf", default, ("decode",), COMPILE_BATCHES),
        Path(f"{label} + compiled generate", "peer", "compiled_generate", "hf", default, ("decode",)),
        Path("shufflemoe (graph_buckets=None)", "ours", "eager", "patch_eager"),
        Path("shufflemoe (default: per-layer graphs)", "ours", "layer_graphs", "patch", phases=("decode",)),
        Path("shufflemoe + step graph", "ours", "step_graph", "patch_eager"),
        Path("shufflemoe + torch.compile", "ours", "compile", "patch", phases=("decode",), batches=COMPILE_BATCHES),
        Path("shufflemoe + compiled generate", "ours", "compiled_generate", "patch", phases=("decode",)),
    ]


# Measured first (transformers' eager default is the reference of every check), then the paths
# issue 16's targets judge, then the rest: a run short of time loses the least useful rows.
PRIORITY = {"eager": 0, "layer_graphs": 0, "step_graph": 1, "compiled_generate": 2, "compile": 3}


def _prepare(model, path: Path) -> None:
    if path.setup == "hf":
        unpatch(model)
        if path.experts is not None:
            model.set_experts_implementation(path.experts)
    else:
        patch(model, graph_buckets=None) if path.setup == "patch_eager" else patch(model)


def layer_graphs_in_use(model) -> bool | None:
    """Whether patched blocks replay per-layer CUDA graphs (None: cannot tell)."""
    from ...graph import GraphedMoE

    states = [m.__dict__["_shufflemoe"] for m in model.modules() if "_shufflemoe" in m.__dict__]
    runs = [getattr(s, "run", None) for s in states]
    if not states or any(r is None for r in runs):
        return None
    return any(isinstance(r, GraphedMoE) for r in runs)


def decode_bytes(model, batch: int) -> float:
    """Bytes one decode step at ``batch`` must read at least: every weight but the embedding table
    (only ``batch`` rows of it are read), routed experts counted by the expected number in use
    (E * (1 - (1 - k/E)^batch) for uniform routing), and the prompt's keys and values in the cache."""
    cfg = model.config
    E = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    k = cfg.num_experts_per_tok
    active = E * (1 - (1 - k / E) ** batch)
    dense = experts = 0
    itemsize = next(model.parameters()).element_size()
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            continue
        if ".experts." in name:
            experts += p.numel() * p.element_size()
        else:
            dense += p.numel() * p.element_size()
    kv = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * cfg.head_dim * e2e_paths.PROMPT_TOKENS
    return dense + experts * active / E + kv * itemsize


def check_prompts(batch: int) -> int:
    """Prompts compiled generate's check runs at ``batch``."""
    return -(-GENERATE_CHECK_SEQUENCES // batch)


def _rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def accuracy_check(err: float | None, hf_err: float | None) -> str:
    """'ok' when a row's error against the float32 model is within ACCURACY_RATIO x transformers'
    bf16 error (+ ACCURACY_FLOOR), else why not."""
    if err is None or hf_err is None:
        return "no sequences to check (no first token agrees with the float32 model's)"
    limit = ACCURACY_RATIO * hf_err + ACCURACY_FLOOR
    return "ok" if err <= limit else f"logits rel L2 vs fp32 {err:.4g} > {limit:.4g} ({ACCURACY_RATIO} x transformers' {hf_err:.4g} + floor)"


def fp32_references(model, batches) -> dict:
    """The float32 model's logits for every check (keys as _Run.refs): its parameters upcast in
    place, run through transformers' eager code, then cast back (bf16 -> fp32 -> bf16 is exact)."""
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    for p in model.parameters():
        p.data = p.data.float()
    try:
        refs = {("prefill", 1): e2e_paths.prefill_logits(model)}
        for batch in batches:
            refs[("decode", batch)] = e2e_paths.Decoder(model, batch, 2, graph=False).checked_logits()
            refs[("first token", batch)], refs[("generate", batch)] = e2e_paths.greedy_step(
                model, batch, check_prompts(batch))
    finally:
        for name, p in model.named_parameters():
            p.data = p.data.to(dtypes[name])
    return refs


@dataclass
class _Run:
    shape: Shape
    ctx: Context
    fp32: dict  # (phase, batch) -> the float32 model's logits (and ("first token", batch))
    rows: list[dict] = field(default_factory=list)
    refs: dict = field(default_factory=dict)  # the same keys -> transformers' bf16 eager logits

    def add(self, path: Path, phase: str, batch: int, timing: dict | None, note: str = "",
            logits: torch.Tensor | None = None, ref_key: tuple | None = None, first=None) -> None:
        row = dict(model=self.shape.name, phase=phase, batch=batch, impl=path.impl, side=path.side,
                   mode=path.mode, **(timing or {}), note=note)
        ref_key = ref_key or (phase, batch)
        if logits is not None:
            reference = ref_key not in self.refs  # the first row is transformers' eager
            if reference:
                self.refs[ref_key] = logits
            fp32, hf = self.fp32[ref_key], self.refs[ref_key]
            if first is not None:  # generate: sequences whose first tokens agree with the fp32 model's
                fp32_first = self.fp32[("first token", batch)]
                hf_first = self.refs.get(("first token", batch), fp32_first)
                mask = (first == fp32_first) & (hf_first == fp32_first)
                logits, fp32, hf = logits[mask], fp32[mask], hf[mask]
                row["note"] = (note + f" check over {int(mask.sum())} of {mask.numel()} sequences (same first token)").strip()
            err, hf_err = ((_rel_l2(logits, fp32), _rel_l2(hf, fp32)) if logits.numel() else (None, None))
            row.update(logits_rel_l2_vs_fp32=err, hf_rel_l2_vs_fp32=hf_err,
                       logits_rel_l2_vs_hf=_rel_l2(logits, hf) if logits.numel() else None,
                       check="ok (reference)" if reference else accuracy_check(err, hf_err))
        if row.get("ms"):
            row["tokens_per_s"] = (e2e_paths.PREFILL_TOKENS if phase == "prefill" else batch) / row["ms"] * 1e3
        self.rows.append(row)


def _measure_one(run: _Run, model, path: Path, phase: str, batch: int) -> None:
    reps, steps, repeats = (2, 8, 3) if run.ctx.quick else (5, 16, 3)
    graph = path.mode == "step_graph"
    if graph and e2e_paths.DEVICE != "cuda":
        run.add(path, phase, batch, None, note="skipped: CUDA graphs need a GPU")
        return
    if phase == "prefill":
        timing, logits = e2e_paths.time_prefill(model, reps, graph)
    else:
        timing, logits = e2e_paths.time_decode(model, batch, steps, repeats, graph)
    run.add(path, phase, batch, timing, logits=logits)


def _measure(run: _Run, model, path: Path, phases: tuple[str, ...] | None = None) -> None:
    for phase in path.phases if phases is None else phases:
        for batch in ((1,) if phase == "prefill" else path.batches or BATCHES):
            if run.ctx.seconds_left() < 90:
                run.add(path, phase, batch, None, note="skipped: time budget")
                continue
            try:
                with torch.no_grad():
                    _measure_one(run, model, path, phase, batch)
            except Exception as e:  # noqa: BLE001 - an OOM or a failed capture/compile is a result
                traceback.print_exc()
                run.add(path, phase, batch, None, note=f"failed: {type(e).__name__}: {str(e)[:160]}")
                if e2e_paths.DEVICE == "cuda":
                    torch.cuda.empty_cache()


def interleaved(path: Path) -> bool:
    """Decode paths bound by the host: timed in turns with the others of their group."""
    return path.mode in INTERLEAVED_MODES and "decode" in path.phases


def _twin(model, graph_buckets):
    """A patched copy of ``model`` with the same weights."""
    twin = build_model(model.config, torch.bfloat16, e2e_paths.DEVICE)
    twin.load_state_dict(model.state_dict())
    return patch(twin, graph_buckets=graph_buckets)


def _timer(path: Path, model, batch: int, steps: int, repeats: int):
    """(sample: ms per decode step, check: run.add's logits arguments) of one path on ``model``,
    warmed up (per-layer graphs captured, compiled code compiled)."""
    if path.mode == "compiled_generate":
        gen = e2e_paths.Generator(model, batch, *GENERATE_TOKENS)

        def check() -> dict:
            logits, first = gen.check(check_prompts(batch))
            return dict(logits=logits, ref_key=("generate", batch), first=first)
        return gen.sample, check
    call = torch.compile(model, **COMPILE_OPTIONS) if path.mode == "compile" else None
    dec = e2e_paths.Decoder(model, batch, steps * repeats + 6, graph=False, step_call=call)
    for _ in range(3):
        dec.advance()
    return (lambda: e2e_paths.elapsed_ms(lambda: [dec.advance() for _ in range(steps)]) / steps,
            lambda: dict(logits=dec.checked_logits()))


def _interleaved(run: _Run, model, paths: list[Path], references: bool) -> None:
    """Host-bound decode rows of one group of modes, ABAB...: per batch one timer per path
    (transformers' paths on ``model``, switching its experts implementation before each of their
    samples; ours on patched copies with the same weights: eager, per-layer graphs), then
    ``repeats`` rounds in which every path takes one sample, so that a slow spell of the host
    falls on all of them. Rows are added in ``paths`` order. ``references``: the group holds
    transformers' eager default (first), whose greedy step is then the reference of compiled
    generate's check."""
    ctx = run.ctx
    steps, repeats = (8, INTERLEAVED_REPEATS_QUICK) if ctx.quick else (16, INTERLEAVED_REPEATS)
    unpatch(model)
    ours = {setup: _twin(model, buckets) for setup, buckets in (("patch_eager", None), ("patch", "auto"))
            if any(p.setup == setup for p in paths)}

    def prepare(path: Path):
        if path.setup == "hf" and path.experts not in (None, model.config._experts_implementation):
            model.set_experts_implementation(path.experts)
        return model if path.setup == "hf" else ours[path.setup]

    for batch in BATCHES:
        todo = [p for p in paths if batch in (p.batches or BATCHES)]
        if not todo:
            continue
        if ctx.seconds_left() < 90:
            for p in todo:
                run.add(p, "decode", batch, None, note="skipped: time budget")
            continue
        timers, samples = {}, {p.impl: [] for p in todo}
        try:
            with torch.no_grad():
                for p in todo:
                    timers[p.impl] = _timer(p, prepare(p), batch, steps, repeats)
                for _ in range(repeats):
                    for p in todo:
                        prepare(p)
                        samples[p.impl].append(timers[p.impl][0]())
                for p in todo:
                    note = f"interleaved with {len(todo) - 1} other paths"
                    if p.mode == "layer_graphs" and layer_graphs_in_use(prepare(p)) is False:
                        note += "; per-layer graphs NOT in use"
                    prepare(p)
                    run.add(p, "decode", batch, e2e_paths.stats(samples[p.impl]), note=note,
                            **timers[p.impl][1]())
                if references:
                    prepare(paths[0])  # the reference of compiled generate's check, eager
                    first, step_logits = e2e_paths.greedy_step(model, batch, check_prompts(batch))
                    run.refs[("first token", batch)], run.refs[("generate", batch)] = first, step_logits
        except Exception as e:  # noqa: BLE001 - an OOM or a failed capture or compile is a result
            traceback.print_exc()
            for p in todo:
                run.add(p, "decode", batch, None, note=f"failed: {type(e).__name__}: {str(e)[:160]}")
        del timers
    for m in (model, *ours.values()):  # drop compiled code and graph pools
        m.__dict__.pop("_compiled_call", None)
        if m is not model:
            unpatch(m)
    ours.clear()
    torch._dynamo.reset()
    gc.collect()
    if e2e_paths.DEVICE == "cuda":
        torch.cuda.empty_cache()


def _bench_shape(shape: Shape, ctx: Context) -> list[dict]:
    model = build_model(shape.config(ctx.quick), torch.bfloat16, e2e_paths.DEVICE)
    with torch.no_grad():
        run = _Run(shape, ctx, fp32_references(model, BATCHES))
    if e2e_paths.DEVICE == "cuda":
        torch.cuda.empty_cache()
    floors = {b: decode_bytes(model, b) for b in BATCHES}
    reference, *rest = paths(shape.model_type)
    order = [reference] + sorted(rest, key=lambda p: PRIORITY[p.mode])
    for modes in INTERLEAVED_GROUPS:
        turns = [p for p in order if interleaved(p) and p.mode in modes]
        ctx.progress(0, len(order) + 1, f"{shape.name}: decode, interleaved: {', '.join(p.impl for p in turns)}")
        _interleaved(run, model, turns, references=modes == INTERLEAVED_GROUPS[0])
    for n, path in enumerate(order):
        phases = tuple(ph for ph in path.phases if not (ph == "decode" and interleaved(path)))
        if not phases:
            continue
        ctx.progress(n + 1, len(order) + 1, f"{shape.name}: {path.impl} ({path.mode})")
        _prepare(model, path)
        _measure(run, model, path, phases)
    unpatch(model)
    for r in run.rows:  # decode steps are bound by reads: their floor is bytes / read ceiling
        if r["phase"] == "decode":
            r.update(read_bytes=floors[r["batch"]], bound="read")
    del model
    if e2e_paths.DEVICE == "cuda":
        torch.cuda.empty_cache()
    return run.rows


def _ours_ok(rows: list[dict], ratio: dict) -> bool:
    row = select(rows, model=ratio["model"], phase=ratio["phase"], batch=ratio["batch"], impl=ratio["ours"])
    return bool(row) and str(row[0].get("check", "ok")).startswith("ok")


def analyse(rows: list[dict]) -> Analysis:
    rs = ratios(rows, KEYS, CROSS)
    best = [r for r in rs if r["best_peer"]]
    # targets also name the cases whose row failed its check (as not measured)
    best_all = [r for r in ratios(rows, KEYS, CROSS, keep_failed=True) if r["best_peer"]]
    ours_main = ("shufflemoe (graph_buckets=None)", "shufflemoe (default: per-layer graphs)",
                 "shufflemoe + compiled generate")
    same_mode = ("shufflemoe + torch.compile", "shufflemoe + compiled generate", "shufflemoe + step graph")
    targets = []
    for r in best_all:
        measured = r["ratio"] if _ours_ok(rows, r) else None
        case = f"{r['model']} {r['phase']} b{r['batch']}"
        eager, default = DECODE_TARGETS.get(r["model"], (None, None))
        if r["phase"] == "prefill":
            if r["ours"] == ours_main[0] and r["modes"] == "eager vs eager":
                targets.append(target(f"{case} eager vs transformers eager (best)", measured,
                                      at_least=PREFILL_TARGET, unit="x"))
        elif r["ours"] == ours_main[0] and r["modes"] == "eager vs eager" and eager:
            targets.append(target(f"{case} eager vs transformers eager (best)", measured, at_least=eager, unit="x"))
        elif r["ours"] == ours_main[1] and not r["like_for_like"] and default:
            targets.append(target(f"{case} per-layer graphs vs transformers eager (best)", measured,
                                  at_least=default, unit="x"))
        elif r["ours"] in same_mode and r["like_for_like"]:
            mode = r["ours"].removeprefix("shufflemoe + ")
            targets.append(target(f"{case} {mode} vs transformers' {mode} (best)", measured,
                                  at_least=SAME_MODE_TARGET, unit="x"))
    for r in select(rows, impl="shufflemoe + step graph", phase="decode", batch=max(BATCHES)):
        ok = str(r.get("check", "")).startswith("ok")
        targets.append(target(f"{r['model']} decode b{r['batch']} step graph time / bytes floor",
                              r.get("x_floor") if ok else None, at_most=1.15, unit="x"))
    headlines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for phase, batch in [("prefill", 1)] + [("decode", b) for b in BATCHES]:
            sel = select(best, model=model, phase=phase, batch=batch)
            parts = [f"{r['modes'].split(' (')[0]} {r['ratio']:.2f}x" for r in sel
                     if r["ours"] in ours_main or r["ours"] == "shufflemoe + step graph"
                     or r["ours"] == "shufflemoe + torch.compile"]
            if parts:
                headlines.append(dict(what=f"{model} {phase} batch {batch}: ours vs transformers' fastest, per mode",
                                      result="; ".join(parts)))
    headlines += [
        dict(what="decode b64, whole-step graph / bytes floor (read ceiling)",
             result=f"{span((r.get('x_floor') for r in select(rows, impl='shufflemoe + step graph', phase='decode', batch=max(BATCHES)) if not failed_check(r)), unit='x')}"),
        dict(what="e2e targets (decode b1 and b64: eager and per-layer graphs per DECODE_TARGETS, torch.compile, "
                  f"compiled generate and step graph >= {SAME_MODE_TARGET}x; prefill eager >= {PREFILL_TARGET}x; "
                  "step graph b64 <= 1.15x floor)", result=tally(targets)),
    ]
    return Analysis(rs, targets, headlines)


@suite("e2e_hf", "transformers Scout- and Qwen3-shaped models: eager, per-layer graphs, torch.compile, "
       "compiled generate, whole-step graph; ours vs transformers like for like", est_s=240, part=2)
def run(ctx: Context) -> SuiteResult:
    register_experts_implementation()
    rows = []
    for shape in SHAPES:
        rows += _bench_shape(shape, ctx)
    return SuiteResult(rows, analyse, COLUMNS, __doc__.split("\n\n", 1)[1].strip())
