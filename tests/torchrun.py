"""Run a script under torchrun on gloo CPU ranks, bounded in time (a hang fails, not the job)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def torchrun(script: str, *args: str, nproc: int = 2, timeout: float = 300) -> str:
    """stdout + stderr of ``torchrun --standalone --nproc-per-node nproc script args``; fails the
    test on a non-zero exit or on the timeout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"),
                                                       os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(ROOT / script), *args]
    try:
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{script} did not finish within {timeout} s:\n{e.stdout}\n{e.stderr}")
    out = done.stdout + done.stderr
    if done.returncode:
        lines = out.splitlines()
        first = next((i for i, l in enumerate(lines)
                      if "Traceback" in l or "terminate called" in l or "Error" in l), 0)
        raise AssertionError(f"{script} exited {done.returncode}:\n"
                             + "\n".join(lines[max(0, first - 5) : first + 60]))
    return out
