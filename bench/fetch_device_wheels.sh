#!/usr/bin/env bash
# Download, on a machine with network, the wheels the device suite needs on a bare GPU box
# (Python 3.12, manylinux x86_64, no network there): they land in bench/.wheels (ignored by
# git) and travel with the tree; bench/device_suite.py installs what is missing on first use.
# Usage: bash bench/fetch_device_wheels.sh [python-version (default 3.12)]
set -euo pipefail
cd "$(dirname "$0")"
PYV="${1:-3.12}"
PIP="${PIP:-python3 -m pip}"
mkdir -p .wheels
$PIP download --quiet --no-deps --only-binary=:all: --python-version "$PYV" \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 --implementation cp -d .wheels \
  msgspec webdataset braceexpand av rich markdown-it-py mdurl pygments
ls -la .wheels
du -sh .wheels
