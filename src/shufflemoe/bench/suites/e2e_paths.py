"""How the e2e_hf suite runs a transformers model on each path a user takes, and times it:

- prefill: one forward of the prompt (no cache, logits of the last token), eager, under
  torch.compile, or replayed from one captured CUDA graph;
- decode: greedy steps on a StaticCache after a prompt, ``repeats`` samples of ``steps`` steps
  each (ms per step), the step called eagerly, torch.compile'd, or replayed from one graph;
- compiled generate: transformers' own ``generate`` on a static cache (it compiles the decode
  step, mode reduce-overhead), per-step time from two lengths on the same cache.

Each path's correctness is checked on the path itself: the logits of the prefill, of one decode
step with fixed input tokens, or of generate's second position, against transformers' own.

CUDA graphs: transformers 5.17's StaticCache keeps its length in a device tensor that each update
advances in place, and its mask code never skips the mask while a stream is capturing, so one
manual capture of ``model(token, past_key_values=cache)`` replays correctly step after step.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from transformers import StaticCache

DEVICE = "cuda"  # a CPU dry run of the logic (tests/integrations) patches this
PREFILL_TOKENS = 2048
PROMPT_TOKENS = 128
PROMPT_STRIDE = 7919  # prompt i of a batch draws its tokens with seed batch + PROMPT_STRIDE * i
COMPILE_CONFIG = None  # transformers' default CompileConfig (a CPU dry run sets one for all devices)


def tokens(vocab: int, *shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randint(2, vocab, shape, device=DEVICE, generator=g)


def elapsed_ms(fn: Callable[[], object]) -> float:
    """Wall time of fn() in ms, synchronised (CUDA events on the GPU)."""
    if DEVICE != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def stats(samples_ms: list[float]) -> dict:
    """ms = median, ms_lo / ms_hi = min / max over the repeats."""
    return dict(ms=statistics.median(samples_ms), ms_lo=min(samples_ms), ms_hi=max(samples_ms),
                repeats=len(samples_ms))


def captured(fn: Callable[[], torch.Tensor | None]) -> Callable[[], torch.Tensor | None]:
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


def time_prefill(model, reps: int, graph: bool) -> tuple[dict, torch.Tensor]:
    """(stats, last-token logits [1, V] float) of one PREFILL_TOKENS forward through ``model``
    (replayed from one CUDA graph when ``graph``)."""
    ids = prefill_ids(model)
    run = lambda: model(ids, use_cache=False, logits_to_keep=1).logits  # noqa: E731
    if graph:
        run = captured(run)
    for _ in range(2):
        run()
    samples = [elapsed_ms(run) for _ in range(reps)]
    return stats(samples), run()[:, -1].float()


def prefill_ids(model) -> torch.Tensor:
    return tokens(model.config.vocab_size, 1, PREFILL_TOKENS, seed=0)


def prefill_logits(model) -> torch.Tensor:
    """Last-token logits [1, V] float of the prefill that time_prefill times, eager."""
    return model(prefill_ids(model), use_cache=False, logits_to_keep=1).logits[:, -1].float()


class Decoder:
    """Greedy decode at ``batch`` on a StaticCache after a PROMPT_TOKENS prompt. The prompt runs
    through ``model`` (eager); steps through ``step_call`` (the model, or its torch.compile'd
    wrapper), replayed from one CUDA graph when ``graph``. token [B, 1] and logits [B, V] are
    the step's static input and output."""

    def __init__(self, model, batch: int, max_steps: int, graph: bool, step_call=None,
                 prompt: int = 0):
        self.model, self.call = model, model if step_call is None else step_call
        self.cache = StaticCache(config=model.config, max_cache_len=PROMPT_TOKENS + max_steps + 8)
        self.prompt = prompt_tokens(model, batch, prompt)
        self.fixed = tokens(model.config.vocab_size, batch, 1, seed=1000 + batch)
        self.token = torch.empty(batch, 1, dtype=torch.long, device=DEVICE)
        self.logits = None
        self.prefill()
        self.advance = self._step
        if graph:
            self.advance = captured(self._step)
            self.cache.reset()  # warm-up advanced the cache: start again from the prompt
            self.prefill()

    def prefill(self) -> None:
        logits = self.model(self.prompt, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits
        self.token.copy_(logits[:, -1:].argmax(-1))

    def _step(self) -> torch.Tensor:
        out = self.call(self.token, past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits
        self.logits = out[:, -1]
        self.token.copy_(self.logits[:, None].argmax(-1))
        return self.logits

    def checked_logits(self) -> torch.Tensor:
        """Logits [B, V] of one step of the timed path from the prompt with fixed input tokens
        (the same for every implementation, so greedy choices cannot diverge first)."""
        self.cache.reset()
        self.prefill()
        self.token.copy_(self.fixed)
        return self.advance().float().clone()


def time_decode(model, batch: int, steps: int, repeats: int, graph: bool = False,
                step_call=None) -> tuple[dict, torch.Tensor]:
    """(stats of ms per step over ``repeats`` samples of ``steps`` steps, checked logits)."""
    dec = Decoder(model, batch, steps * repeats + 6, graph, step_call)
    for _ in range(3):  # warm-up (and compiles)
        dec.advance()
    samples = [elapsed_ms(lambda: [dec.advance() for _ in range(steps)]) / steps for _ in range(repeats)]
    return stats(samples), dec.checked_logits()


def prompt_tokens(model, batch: int, prompt: int = 0) -> torch.Tensor:
    """Prompt number ``prompt`` of a batch: [batch, PROMPT_TOKENS] token ids."""
    return tokens(model.config.vocab_size, batch, PROMPT_TOKENS, seed=batch + PROMPT_STRIDE * prompt)


class Generator:
    """transformers' compiled generate on a static cache (given as past_key_values so that every
    call reuses one shape) at ``batch``; built with a warm-up that compiles the decode step."""

    def __init__(self, model, batch: int, short: int, long: int):
        self.model, self.batch, self.short, self.long = model, batch, short, long
        self.cache = StaticCache(config=model.config, max_cache_len=PROMPT_TOKENS + long + 8)
        self.run(long)

    def run(self, n: int, prompt: int = 0, **extra):
        self.cache.reset()
        ids = prompt_tokens(self.model, self.batch, prompt)
        return self.model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=self.cache,
                                   max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
                                   compile_config=COMPILE_CONFIG, **extra)

    def sample(self) -> float:
        """ms per decode step = (time of ``long`` new tokens - ``short``) / (long - short), on
        prompt 0."""
        t_short = elapsed_ms(lambda: self.run(self.short))
        t_long = elapsed_ms(lambda: self.run(self.long))
        return (t_long - t_short) / (self.long - self.short)

    def check(self, prompts: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [prompts * B, V] of the second generated position, first generated tokens
        [prompts * B]) over ``prompts`` prompts."""
        outs = [self.run(2, i, output_logits=True, return_dict_in_generate=True) for i in range(prompts)]
        return (torch.cat([o.logits[1].float() for o in outs]),
                torch.cat([o.sequences[:, PROMPT_TOKENS] for o in outs]))


def time_generate(model, batch: int, short: int, long: int, repeats: int,
                  prompts: int = 1) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(stats of ``repeats`` Generator samples, then its check over ``prompts`` prompts)."""
    gen = Generator(model, batch, short, long)
    samples = [gen.sample() for _ in range(repeats)]
    return (stats(samples), *gen.check(prompts))


def greedy_step(model, batch: int, prompts: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(first greedy tokens [prompts * B], logits [prompts * B, V] of the step after them) from
    ``prompts`` prompts, eager: the reference of compiled generate's check."""
    firsts, logits = [], []
    for i in range(prompts):
        dec = Decoder(model, batch, 2, graph=False, prompt=i)
        firsts.append(dec.token[:, 0].clone())
        logits.append(dec.advance().float().clone())
    return torch.cat(firsts), torch.cat(logits)
