"""benchmarks/multi_gpu.py (the two-GPU NCCL run of issue 17) on 2 gloo ranks at tiny widths:
every layout it builds is correct against the single-device layer and every row is written."""

import json

from torchrun import torchrun


def test_multi_gpu_script_runs_on_gloo(tmp_path):
    torchrun("benchmarks/multi_gpu.py", "--tiny", "--tokens", "3", "--prefill", "0", "--reps", "1",
             "--no-hf", "--out", str(tmp_path))
    doc = json.loads((tmp_path / "multi_gpu.json").read_text())
    rows = doc["rows"]
    layouts = {r["layout"] for r in rows}
    assert {"tp ep=1 tp=2", "tp_sp ep=1 tp=2", "ep_alltoall ep=2 tp=1",
            "ep_allgather ep=2 tp=1", "ep_allgather ep=2 tp=1 redundant=2"} <= layouts
    assert len(rows) == 3 * 2 * 6 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert all(r["comm_us"] > 0 and r["predicted_comm_us"] > 0 for r in rows)
    assert (tmp_path / "multi_gpu.md").exists() and doc["meta"]["commit"]
