"""Run every benchmark in bench/ (each against its peer, in the same run) and write BENCHMARKS.md."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# bench_gpu: where CUDA is
SECTIONS = ["bench_pool", "bench_train", "bench_live", "bench_gpu", "bench_data", "bench_cluster"]


def machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{platform.node()}: {os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {gpu}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", help="file to write (default: print only)")
    parser.add_argument("--only", nargs="*", help="section modules to run, e.g. bench_pool")
    args = parser.parse_args()
    parts = [
        "# Benchmarks",
        "",
        f"Written by `make bench` on {time.strftime('%Y-%m-%d %H:%M')} ({machine()}).",
        "Each section runs nbscale and its peer side by side in the same run and prints the ratio.",
        "",
    ]
    for name in args.only or SECTIONS:
        if not (Path(__file__).parent / f"{name}.py").exists():
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            parts.append(importlib.import_module(name).run())
        except Exception:
            parts.append(f"## {name}\n\nFailed:\n\n```\n{traceback.format_exc()}```\n")
    text = "\n".join(parts)
    print(text)
    if args.write:
        Path(args.write).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
