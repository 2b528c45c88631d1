"""End-to-end transformers generation on the GPU: a patched model against transformers' own.

Models (random bf16 weights, created on the GPU by transformers' own init, no CPU pass):
Llama-4-Scout-shaped (hidden 5120, 16 experts of 8192, shared expert, top-1) and
Qwen3-30B-A3B-shaped (hidden 2048, 128 experts of 768, top-8), at real widths and reduced depth
(8 and 16 layers: 35 GB and 20 GB of weights). The vocabulary is scaled with the depth
(vocab * layers / 48) so the LM head keeps the share of the step it has in the full-depth model.
All layers use full causal attention: for these lengths (< Llama 4's 8192-token chunks) chunked
attention is the same computation, and transformers' static chunked-cache layer tracks its length
in a Python int, which a captured graph would freeze.

Phases: prefill of 2048 tokens (batch 1, no cache, logits of the last token only); decode at
batch 1 and 64 with a StaticCache after a 128-token prompt, tokens/s = batch / step time.
Implementations: transformers' experts implementations (Llama 4 has only its own dense "eager"
one; Qwen3: eager, grouped_mm = the 5.17 default, batched_mm, and "shufflemoe" registered as an
experts implementation), transformers' default with the whole forward (prefill) or step (decode)
in one CUDA graph, the patched model as patch() leaves it (eager calls replay per-layer CUDA graphs
for up to 256 tokens on CUDA), the same with graph_buckets=None (plain eager), and the patched
model in one CUDA graph the same way; and decode steps under torch.compile(mode="reduce-overhead",
fullgraph=True) for transformers' default and the patched model, which is what transformers'
compiled generate (cache_implementation="static") runs per step.
Without graphs a 2048-token prefill of these models is bound by the host on the H100 machine
(transformers' Python issues each decoder layer slower than the GPU runs it; see
benchmarks/notes/e2e_hf.md), so the graph rows are the comparison of GPU work.

CUDA graphs: transformers 5.17's StaticCache keeps its length in a device tensor that each
update advances in place, and its mask code never skips the mask while a stream is capturing, so
one manual capture of ``model(token, past_key_values=cache)`` replays correctly step after step
(torch.compile's reduce-overhead mode would also trace shufflemoe's Python, which it does not
need). If that capture fails, the patched model falls back to CUDA graphs per MoE layer
(patch(..., graph_buckets=...)) and the row says so.

Ratios are transformers' best experts implementation without graphs (the fastest "transformers"
row of the same phase and batch, this run) over the row's time. Targets: decode >= 2x with graphs;
prefill no slower, without graphs against that best and with graphs against transformers' default
with graphs (ratio_vs_hf_graph).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch
from transformers import AutoConfig, StaticCache

from ...integrations.transformers import patch, register_experts_implementation, unpatch
from ...integrations.transformers.models import build_model
from ...testing import compare
from . import SUITES, Context, SuiteResult

DEVICE = "cuda"  # a CPU dry run of the logic (tests/integrations) patches this
PREFILL_TOKENS = 2048
PROMPT_TOKENS = 128
BATCHES = (1, 64)
COMPILE = dict(mode="reduce-overhead", fullgraph=True)  # the compiled rows (CPU dry run: aot_eager)
NOTES = ("Random bf16 weights at real widths, reduced depth (Scout 8 layers, Qwen3 16; quick: 2 and 4), "
         "vocabulary scaled with depth. Prefill: 2048 tokens, batch 1. Decode: static KV cache "
         "after a 128-token prompt. ratio = fastest transformers experts implementation without "
         "graphs (same phase and batch) / this row. 'hf default + CUDA graph' is transformers' "
         "default with the same whole-step graph as ours, for reference. floor_ms (decode): the bytes a "
         "step must read (weights but the embedding table, routed experts in expected use, the "
         "prompt's KV cache) over the copy bandwidth measured in this run; x_floor = ms / floor_ms.")
COLUMNS = ["model", "phase", "batch", "implementation", "ms", "tokens_per_s", "floor_ms", "x_floor",
           "ratio_vs_hf_best", "ratio_vs_hf_graph", "logits_rel_l2_vs_hf", "note"]


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
        return AutoConfig.for_model(self.model_type, **self.fields, num_hidden_layers=layers,
                                    vocab_size=vocab, layer_types=["full_attention"] * layers,
                                    bos_token_id=0, eos_token_id=1, pad_token_id=None)


SHAPES = [
    Shape("llama4-scout", "llama4_text", dict(
        hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=16,
        num_experts_per_tok=1, interleave_moe_layer_step=1, num_attention_heads=40,
        num_key_value_heads=8, head_dim=128), layers=8, quick_layers=2, full_layers=48,
        full_vocab=202048),
    Shape("qwen3-30b-a3b", "qwen3_moe", dict(
        hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128), layers=16, quick_layers=4, full_layers=48, full_vocab=151936),
]


@dataclass(frozen=True)
class Impl:
    name: str
    family: str  # "transformers" (defines HF best), "transformers+graph", "shufflemoe"
    experts: str | None = None  # transformers experts_implementation to select
    patched: bool = False
    graph: bool = False  # prefill forward / decode step captured in one CUDA graph
    graph_buckets: object = "auto"  # patch()'s per-layer CUDA graphs (None: plain eager)
    compiled: bool = False  # decode steps under torch.compile(**COMPILE)
    phases: tuple[str, ...] = ("prefill", "decode")


def _impls(model_type: str) -> list[Impl]:
    if model_type == "llama4_text":  # Llama4TextExperts has no experts_implementation registry
        hf = [Impl("hf eager (default)", "transformers")]
        default = None
    else:
        default = "grouped_mm"
        hf = [Impl("hf eager", "transformers", "eager"),
              Impl("hf grouped_mm (default)", "transformers", "grouped_mm"),
              # batched_mm gathers one weight matrix per token-expert pair: decode only
              Impl("hf batched_mm", "transformers", "batched_mm", phases=("decode",)),
              Impl("hf + shufflemoe experts", "shufflemoe", "shufflemoe")]
    return hf + [
        Impl("hf default + CUDA graph", "transformers+graph", default, graph=True),
        Impl("hf default + torch.compile", "transformers+compile", default, compiled=True,
             phases=("decode",)),
        Impl("shufflemoe", "shufflemoe", patched=True),  # the default: per-layer graphs on CUDA
        Impl("shufflemoe, graph_buckets=None", "shufflemoe", patched=True, graph_buckets=None),
        Impl("shufflemoe + CUDA graph", "shufflemoe", patched=True, graph=True, graph_buckets=None),
        Impl("shufflemoe + torch.compile", "shufflemoe", patched=True, compiled=True,
             phases=("decode",)),
    ]


def _ms(fn, reps: int, warmup: int) -> float:
    """Median wall time of fn() in ms, synchronised around each call (CUDA events on the GPU)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _tokens(vocab: int, *shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randint(2, vocab, shape, device=DEVICE, generator=g)


def _prefill(model, reps: int, graph: bool = False) -> tuple[float, torch.Tensor]:
    """(ms, last-token logits [1, V]) of one 2048-token forward (one CUDA-graph replay when
    ``graph``)."""
    ids = _tokens(model.config.vocab_size, 1, PREFILL_TOKENS, seed=0)
    run = lambda: model(ids, use_cache=False, logits_to_keep=1).logits  # noqa: E731
    if graph:
        run = _captured(run)
    ms = _ms(run, reps, warmup=2)
    return ms, run()[:, -1].float()


def _captured(fn: Callable[[], torch.Tensor | None]) -> Callable[[], torch.Tensor | None]:
    """fn captured in one CUDA graph after a warm-up off the capture stream (compiles,
    workspaces); the returned replay gives fn's output buffer."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()

    def replay() -> torch.Tensor | None:
        g.replay()
        return out

    return replay


def decoder(model, batch: int, max_steps: int, graph: bool,
            compiled: bool = False) -> tuple[Callable[[], None], torch.Tensor]:
    """Greedy decode at ``batch`` on a StaticCache after a prompt: (advance, token), where
    advance() runs one step (one CUDA-graph replay when ``graph``; the step compiled with
    COMPILE when ``compiled``, the prompt eager) and token [B, 1] holds the last token. Room for
    max_steps calls of advance()."""
    cache = StaticCache(config=model.config, max_cache_len=PROMPT_TOKENS + max_steps + 8)
    prompt = _tokens(model.config.vocab_size, batch, PROMPT_TOKENS, seed=batch)
    token = torch.empty(batch, 1, dtype=torch.long, device=DEVICE)  # [B, 1], stays on the device

    def prefill() -> None:  # the prompt into the (empty) cache, its next token into `token`
        logits = model(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        token.copy_(logits[:, -1:].argmax(-1))

    if compiled:
        torch._dynamo.reset()  # a fresh compile per row: no recompilation limit across rows
    forward = torch.compile(model, **COMPILE) if compiled else model

    def step() -> None:  # one token in, the next one out, the cache advanced by one
        out = forward(token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        token.copy_(out[:, -1:].argmax(-1))

    prefill()
    if not graph:
        return step, token
    replay = _captured(step)
    cache.reset()  # warm-up advanced the cache: start again from the prompt, same buffers
    prefill()
    return replay, token


def _decode(model, batch: int, steps: int, graph: bool, compiled: bool = False) -> float:
    """ms per decode step at ``batch``, averaged over ``steps`` after 3 warm-up steps."""
    advance, _ = decoder(model, batch, steps + 6, graph, compiled)
    for _ in range(3):
        advance()
    return _ms(lambda: [advance() for _ in range(steps)], reps=1, warmup=0) / steps


@dataclass
class _Run:
    shape: Shape
    quick: bool
    rows: list[dict] = field(default_factory=list)
    hf_logits: torch.Tensor | None = None

    def add(self, impl: Impl, phase: str, batch: int, ms: float | None, tokens: int,
            note: str = "", logits: torch.Tensor | None = None) -> None:
        err = None
        if logits is not None and impl.family != "transformers" and self.hf_logits is not None:
            err = compare(logits, self.hf_logits, torch.bfloat16).rel_l2
        if logits is not None and impl.family == "transformers" and self.hf_logits is None:
            self.hf_logits = logits
        self.rows.append(dict(model=self.shape.name, phase=phase, batch=batch,
                              implementation=impl.name, family=impl.family, ms=ms,
                              tokens_per_s=None if not ms else tokens / ms * 1e3,
                              logits_rel_l2_vs_hf=err, note=note))


def _measure(run: _Run, model, impl: Impl) -> None:
    reps, steps = (2, 8) if run.quick else (5, 32)
    if "prefill" in impl.phases:
        if impl.graph and DEVICE != "cuda":
            run.add(impl, "prefill", 1, None, PREFILL_TOKENS, note="skipped: CUDA graphs need a GPU")
        else:
            _guarded(run, impl, "prefill", 1, PREFILL_TOKENS,
                     lambda: _prefill(model, reps, impl.graph))
    if "decode" in impl.phases:
        for b in BATCHES:
            if impl.graph and DEVICE != "cuda":
                run.add(impl, "decode", b, None, b, note="skipped: CUDA graphs need a GPU")
                continue
            ok = _guarded(run, impl, "decode", b, b,
                          lambda: (_decode(model, b, steps, impl.graph, impl.compiled), None))
            if not ok and impl.graph and impl.patched:  # fall back to graphs per MoE layer
                patch(model, graph_buckets=BATCHES)
                layered = replace(impl, name="shufflemoe + CUDA graphs per MoE layer", graph=False)
                _guarded(run, layered, "decode", b, b, lambda: (_decode(model, b, steps, False), None))
                patch(model, graph_buckets=impl.graph_buckets)


def _guarded(run: _Run, impl: Impl, phase: str, batch: int, tokens: int, measure) -> bool:
    """Run one measurement; an error (OOM, a failed capture) becomes a row note, not a crash."""
    try:
        with torch.no_grad():
            ms, logits = measure()
    except (RuntimeError, NotImplementedError, ValueError) as e:  # torch.OutOfMemoryError included
        run.add(impl, phase, batch, None, tokens, note=f"failed: {type(e).__name__}: {str(e)[:160]}")
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        return False
    run.add(impl, phase, batch, ms, tokens, logits=logits)
    return True


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
    kv = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * cfg.head_dim * PROMPT_TOKENS
    return dense + experts * active / E + kv * itemsize


def _bench_shape(shape: Shape, quick: bool, copy_gbps: float) -> list[dict]:
    run = _Run(shape, quick)
    model = build_model(shape.config(quick), torch.bfloat16, DEVICE)
    floors = {b: decode_bytes(model, b) / (copy_gbps * 1e6) if copy_gbps else None for b in BATCHES}
    # transformers' rows first, on its own weight layout (patching converts Llama 4's in place)
    for impl in _impls(shape.model_type):
        if impl.patched:
            patch(model, graph_buckets=impl.graph_buckets)
        elif impl.experts is not None:
            model.set_experts_implementation(impl.experts)
        _measure(run, model, impl)
    unpatch(model)
    for r in run.rows:  # decode steps are memory bound: their floor is bytes / copy bandwidth
        floor = floors.get(r["batch"]) if r["phase"] == "decode" else None
        r["floor_ms"] = floor
        r["x_floor"] = r["ms"] / floor if floor and r["ms"] else None
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return run.rows


def _fastest(rows: list[dict], family: str) -> dict[tuple, float]:
    """(model, phase, batch) -> the least ms among ``family``'s rows."""
    best: dict[tuple, float] = {}
    for r in rows:
        if r["family"] == family and r["ms"]:
            key = (r["model"], r["phase"], r["batch"])
            best[key] = min(best.get(key, float("inf")), r["ms"])
    return best


def _with_ratios(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    best, graphed_hf = _fastest(rows, "transformers"), _fastest(rows, "transformers+graph")
    targets = []

    def target(r: dict, ratio: float | None, need: float, against: str, bound: str = "") -> None:
        targets.append(dict(target=f"{r['model']} {r['phase']} b{r['batch']}: "
                                   f"{r['implementation']} >= {need:g}x {against}{bound}",
                            measured=None if ratio is None else round(ratio, 2),
                            met=ratio is not None and ratio >= need))

    for r in rows:
        key = (r["model"], r["phase"], r["batch"])
        hf, hf_graph = best.get(key), graphed_hf.get(key)
        r["ratio_vs_hf_best"] = hf / r["ms"] if hf and r["ms"] else None
        ours_graph = r["implementation"].startswith("shufflemoe + CUDA graph")
        r["ratio_vs_hf_graph"] = hf_graph / r["ms"] if ours_graph and hf_graph and r["ms"] else None
        if r["phase"] == "decode" and ours_graph:
            # no step can beat its bytes floor, so HF best / floor bounds any implementation's ratio
            bound = f" (attainable: {hf / r['floor_ms']:.2f}x at the floor)" if hf and r.get("floor_ms") else ""
            target(r, r["ratio_vs_hf_best"], 2.0, "HF best", bound)
        elif r["phase"] == "prefill" and r["implementation"] == "shufflemoe":
            target(r, r["ratio_vs_hf_best"], 1.0, "HF best")
        elif r["phase"] == "prefill" and ours_graph and r["ms"]:
            target(r, r["ratio_vs_hf_graph"], 1.0, "HF default + CUDA graph")
    return rows, targets


@SUITES.register("e2e_hf")
def run(ctx: Context) -> SuiteResult:
    register_experts_implementation()
    rows = []
    for shape in SHAPES:
        rows += _bench_shape(shape, ctx.quick, ctx.ceilings.copy_gbps)
    rows, targets = _with_ratios(rows)
    return SuiteResult(rows=rows, targets=targets, columns=COLUMNS, notes=NOTES)
