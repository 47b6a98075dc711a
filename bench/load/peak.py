"""Peak resident memory of a fresh process that loads the file once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, os, resource, sys
mode, path, threads, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import torch
dev = torch.device(device)
if dev.type == "cuda":
    torch.zeros(1, device=dev)  # the CUDA context's own memory belongs to the baseline
from gpu_worker.loader import load_weights
from safetensors.torch import load_file
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
def hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
def anon_huge():
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
base = rss()
huge0 = anon_huge()
try:  # reset the high-water mark to now: the peak is then the load's alone
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    reset = True
except OSError:
    reset = False
if mode == "loader":
    out = load_weights(path, dev, threads=threads or None)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
else:
    out = {k: v.clone() for k, v in load_file(path).items()}
held = sum(t.numel() * t.element_size() for t in out.values())
print(json.dumps({"baseline_rss_bytes": base, "peak_rss_bytes": hwm(), "hwm_reset": reset,
                  "result_bytes": held, "anon_huge_page_bytes": anon_huge() - huge0}))
"""


def measure_peak_rss(path: Path, mode: str, threads: int | None, device: str = "cpu") -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(path), str(threads or 0), device],
        capture_output=True, text=True, env=env, timeout=600,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])
