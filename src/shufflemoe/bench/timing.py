"""GPU timing: CUDA events, warm-up, many samples summarised by their median and spread, a CUDA
graph to remove launch gaps where the code allows it, and rotating input sets (weights included)
so that data does not sit in the L2 cache. The timed path's outputs come back for checking."""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Collection

import torch
from torch.utils._pytree import tree_map

L2_BYTES = 50 << 20  # an H100's; rotations() reads the GPU's own where there is one
SETTLE_S = 0.1  # a new graph replays this long before its samples (_settle)


@dataclass(frozen=True)
class Timing:
    """Summary of ``n`` timed samples of one call (us). ``mode`` says how the calls were issued:
    "graph" (replays of a captured CUDA graph), "eager" (launched from Python each time), or what
    the caller names (e.g. "compile" for a torch.compile'd callable launched from Python)."""

    median_us: float
    p20_us: float
    p80_us: float
    min_us: float
    max_us: float
    n: int
    mode: str
    outputs: list = field(default_factory=list, repr=False, compare=False)  # per input set

    @property
    def graph(self) -> bool:
        return self.mode == "graph"

    def fields(self, name: str = "us") -> dict:
        """Row fields: ``name`` = median, ``name_lo`` / ``name_hi`` = p20 / p80."""
        return {name: self.median_us, f"{name}_lo": self.p20_us, f"{name}_hi": self.p80_us}


def summarize(samples_us: list[float], mode: str) -> Timing:
    """Median, p20/p80 and min/max of samples (one sample: all equal)."""
    if not samples_us:
        raise ValueError("summarize needs at least one sample")
    q = statistics.quantiles(samples_us, n=5, method="inclusive") if len(samples_us) > 1 else samples_us * 4
    return Timing(statistics.median(samples_us), q[0], q[3], min(samples_us), max(samples_us),
                  len(samples_us), mode)


def rotations(bytes_per_set: int, l2_bytes: int | None = None, cap: int = 32) -> int:
    """Input sets to rotate through so that one pass reads over 2x the L2: ``l2_bytes``, else the
    current GPU's (50 MB on an H100, 60 on an H200), else L2_BYTES (no CUDA: dry runs)."""
    if l2_bytes is None:
        l2_bytes = (torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
                    if torch.cuda.is_available() else L2_BYTES)
    return max(1, min(cap, -(-2 * l2_bytes // max(bytes_per_set, 1))))


def _snapshot(out):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


def time_fn(run: Callable[[int], object], n_sets: int, *, graph: bool = True, reps: int = 40,
            warmup: int = 3, mode: str | None = None, keep_outputs: bool = False,
            reset: Callable[[], None] | None = None) -> Timing:
    """Time one ``run(i)`` (i = input set). With graph=True one CUDA graph runs all n_sets calls
    back to back and each replay is a sample (divided by n_sets); without, each call is a sample.
    keep_outputs: after the samples, ``reset()`` (restores what an in-place op changed) and one
    more pass of the timed path (a replay of the same graph, or eager calls of every set);
    Timing.outputs[i] is a copy of what it gave for set i, for the caller to check. Without
    CUDA, eager calls are timed with the host clock (dry runs of the suites' logic)."""
    cuda = torch.cuda.is_available()
    if graph and not cuda:
        raise RuntimeError("CUDA-graph timing needs a GPU")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    for _ in range(warmup):
        for i in range(n_sets):
            run(i)
    sync()
    samples: list[float] = []
    outputs: list = []
    if graph:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(g):
                captured = [run(i) for i in range(n_sets)]
        torch.cuda.current_stream().wait_stream(side)
        _settle(g.replay, sync)
        for _ in range(reps):
            samples.append(_elapsed_us(g.replay) / n_sets)
        if keep_outputs:
            if reset is not None:
                reset()
            g.replay()
            outputs = [_snapshot(o) for o in captured]  # copied: the graph's memory goes with it
        del g, captured
    else:
        samples = [_call_us(run, r % n_sets, cuda) for r in range(reps)]
        if keep_outputs:
            if reset is not None:
                reset()
            outputs = [_snapshot(run(i)) for i in range(n_sets)]
    sync()
    t = summarize(samples, mode or ("graph" if graph else "eager"))
    return dataclasses.replace(t, outputs=outputs) if keep_outputs else t


def time_turns(runs: dict[str, Callable[[int], object]], n_sets: int, *, reps: int = 20,
               warmup: int = 3, mode: str = "eager",
               keep_outputs: Collection[str] = ()) -> dict[str, Timing | Exception]:
    """Paths launched from Python (host-bound) timed in turns: each of ``reps`` rounds takes one
    sample (one call) of every path, ABC ABC ..., so that a slow spell of the host falls on all
    of them and their ratios hold. The calls walk the input sets in order across the paths (call
    c takes set c % n_sets), so each call follows calls on other sets, as when one path is timed
    alone. A path that raises while warming up is left out: its entry is the exception.
    keep_outputs names the paths whose outputs come back (one more pass over every set after
    the samples, as time_fn's)."""
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out: dict[str, Timing | Exception] = {}
    for label, run in runs.items():
        try:
            for _ in range(warmup):
                for i in range(n_sets):
                    run(i)
            sync()
        except Exception as e:  # noqa: BLE001 - the caller reports it as that path's result
            out[label] = e
    live = [label for label in runs if label not in out]
    samples: dict[str, list[float]] = {label: [] for label in live}
    for r in range(reps):
        for j, label in enumerate(live):
            samples[label].append(_call_us(runs[label], (r * len(live) + j) % n_sets, cuda))
    for label in live:
        t = summarize(samples[label], mode)
        if label in keep_outputs:
            t = dataclasses.replace(t, outputs=[_snapshot(runs[label](i)) for i in range(n_sets)])
        out[label] = t
    sync()
    return {label: out[label] for label in runs}


def _settle(replay: Callable[[], None], sync: Callable[[], None], seconds: float = SETTLE_S,
            least: int = 3) -> None:
    """Replays a freshly captured graph for ``seconds`` (at least ``least`` times) before it is
    timed: its first replays can run slow (H200, results/probe_bimodal.json and
    probe_warmup.json: the first 6-25 replays of Maverick TP8 T = 64, 12-50 ms, 8-12% slower; not
    after the GPU idles, so not clocks), and a timing of 40 replays took either side."""
    t0, n = time.perf_counter(), 0
    while n < least or time.perf_counter() - t0 < seconds:
        replay()
        sync()
        n += 1


def _call_us(run: Callable[[int], object], i: int, cuda: bool) -> float:
    """One call of run(i): CUDA events around it (up to its last kernel's end), or the host
    clock without CUDA (dry runs)."""
    if cuda:
        return _elapsed_us(lambda: run(i))
    t0 = time.perf_counter()
    run(i)
    return (time.perf_counter() - t0) * 1e6


def _elapsed_us(fn: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3
