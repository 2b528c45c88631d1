"""Which part of a layer row's time follows the memory's bandwidth, from two runs of the layer suite
on GPUs that differ in little else (an H100 and an H200: the same SMs and clocks, the H200's
HBM ~1.4x as fast).

Model: a row's time t = F + B / bw, F the part no faster memory shortens (launches and their
ramps, the dependent chain of kernels, instructions: a decode that is bound by its arithmetic),
B / bw the part that streams bytes. With the two runs' read ceilings in ratio r = bw_b / bw_a:
F = (r t_b - t_a) / (r - 1), and the bandwidth part on device a is t_a - F. F near t_a: more
bandwidth buys nothing (the row is bound by something else); F near 0: the row streams. The
two runs differ in more than the memory (machines, the day's clocks, the run-to-run spread of
each row, a few per cent), so read F to a few microseconds, never as a measurement of its own.

    python benchmarks/two_devices.py benchmarks/results/layer.json \\
        benchmarks/results/h200/layer.json > benchmarks/results/h200/two_devices.md
"""

from __future__ import annotations

import json
import pathlib
import sys

from shufflemoe.bench.analysis import select

KEY = ("preset", "format", "T")


def split(t_a: float, t_b: float, ratio: float) -> tuple[float, float]:
    """(F, the bandwidth part on device a) for times t_a, t_b (us) on devices whose read
    ceilings are in ``ratio`` = b / a (> 1)."""
    if ratio <= 1:
        raise ValueError(f"ratio must exceed 1 (device b's read ceiling over a's), got {ratio}")
    fixed = (ratio * t_b - t_a) / (ratio - 1)
    return fixed, t_a - fixed


def _ours(doc: dict) -> dict:
    """(preset, format, T) -> our checked CUDA-graph row under random routing."""
    rows = select(doc["rows"], impl="shufflemoe", mode="graph", routing="random", check="ok", us=bool)
    return {tuple(r[k] for k in KEY): r for r in rows}


def table(doc_a: dict, doc_b: dict) -> str:
    """Markdown: every row both runs timed, with F and the bandwidth part (us, device a)."""
    ratio = doc_b["ceilings"]["used"]["read_gbps"] / doc_a["ceilings"]["used"]["read_gbps"]
    a, b = _ours(doc_a), _ours(doc_b)
    ma, mb = doc_a["meta"], doc_b["meta"]
    lines = [f"# Fixed and bandwidth parts: {ma['gpu']} (a, commit {ma['commit'][:7]}, run {ma['run_id']}) "
             f"and {mb['gpu']} (b, commit {mb['commit'][:7]}, run {mb['run_id']})", "",
             f"Read ceilings {doc_a['ceilings']['used']['read_gbps']:.0f} / "
             f"{doc_b['ceilings']['used']['read_gbps']:.0f} GB/s (ratio {ratio:.3f}). us, medians of "
             "CUDA-graph replays; F = the part more bandwidth did not shorten (benchmarks/two_devices.py).", "",
             "| preset | format | T | a us | b us | b speed-up | F | a's bandwidth part | a's floor |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(set(a) & set(b), key=lambda k: (k[0], k[1], k[2])):
        ta, tb = a[key]["us"], b[key]["us"]
        fixed, streamed = split(ta, tb, ratio)
        floor = a[key].get("floor_us")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {ta:.1f} | {tb:.1f} | {ta / tb:.2f} | {fixed:.1f} | "
                     f"{streamed:.1f} | {'' if floor is None else f'{floor:.1f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: two_devices.py <layer.json of device a> <layer.json of device b>")
    docs = [json.loads(pathlib.Path(p).read_text()) for p in argv]
    sys.stdout.write(table(*docs))


if __name__ == "__main__":
    main(sys.argv[1:])
