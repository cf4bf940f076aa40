#!/usr/bin/env bash
# README.md is assembled from the sections in docs/ (each kept beside the code it describes): bash docs/build_readme.sh
set -euo pipefail
cd "$(dirname "$0")"
sections=(header.md matlab.md pool.md training.md data.md ui.md jobs.md cluster.md labextension.md development.md)
for section in "${sections[@]}"; do
  [ -f "$section" ] || continue
  sed 's#](screenshot-panel.png)#](docs/screenshot-panel.png)#' "$section"
  echo
done > ../README.md
