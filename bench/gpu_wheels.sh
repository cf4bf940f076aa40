#!/usr/bin/env bash
# Wheels of the Jupyter packages the GPU tests and bench/bench_gpu.py's kernel row need, for a lent GPU machine
# whose Python (3.12) has torch, matplotlib, pytest and psutil but no Jupyter packages (docs/development.md).
# Run here, in the repo's root; it fills .whl/ (git-ignored), which the device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf .whl && mkdir .whl
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
           manylinux1_x86_64 any; do
  platforms+=(--platform "$tag")
done
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl \
  ipykernel ipython ipywidgets jupyter_client nbclient nbformat platformdirs 2>&1 | grep -v "is ignored" || true
# what the machine's image already has: carried too, these would shadow its versions
for name in attrs iniconfig packaging pluggy psutil pygments pytest pytest_timeout python_dateutil typing_extensions \
            six tzdata; do
  rm -f .whl/"$name"-*.whl
done
du -sh .whl
