"""Run every benchmark in bench/ (each against its peer, in the same run) and add the run to bench/HISTORY.md.

`make bench` runs `python bench/run_all.py --history bench/HISTORY.md`: the run goes in as the newest section of the
history, under its marker line. BENCHMARKS.md's table of where each figure stands is updated by hand from it (which
row a run moves, and against which target, is a judgement). `--write FILE` writes the run alone to FILE instead.
"""

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

MARKER = "<!-- new runs go below this line -->"
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
    parser.add_argument("--write", help="file to write the run to alone (default: print only)")
    parser.add_argument("--history", help="history file to add the run to, newest first (bench/HISTORY.md)")
    parser.add_argument("--only", nargs="*", help="section modules to run, e.g. bench_pool")
    args = parser.parse_args()
    if args.history and MARKER not in Path(args.history).read_text():  # said before the runs, not after them
        raise SystemExit(
            f"{args.history} has no line {MARKER!r} to add the run under: put it back above the newest run."
        )
    parts = [
        f"## {time.strftime('%Y-%m-%d %H:%M')}: `make bench`",
        "",
        f"Machine: {machine()}.",
        "Each section runs nbscale and its peer side by side in the same run and prints the ratio.",
        "",
    ]
    for name in args.only or SECTIONS:
        if not (Path(__file__).parent / f"{name}.py").exists():
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            parts.append(nested(importlib.import_module(name).run()))
        except Exception:
            parts.append(f"### {name}\n\nFailed:\n\n```\n{traceback.format_exc()}```\n")
    text = "\n".join(parts)
    print(text)
    if args.write:
        Path(args.write).write_text(text)
    if args.history:
        add_to_history(Path(args.history), text)
    return 0


def nested(section: str) -> str:
    """A bench module's section one heading level down, under the run's own heading."""
    return "\n".join(f"#{line}" if line.startswith("#") else line for line in section.split("\n"))


def add_to_history(path: Path, run: str) -> None:
    """Insert `run` under `path`'s marker line (main checked it is there), above the runs before it."""
    head, rest = path.read_text().split(MARKER, 1)
    path.write_text(f"{head}{MARKER}\n\n{run.rstrip()}\n\n{rest.lstrip()}")


if __name__ == "__main__":
    sys.exit(main())
