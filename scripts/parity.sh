#!/usr/bin/env bash
# Parity benchmark: LLO ops and scheduled bundles of every example kernel (ours vs Pallas) per TPU
# generation, with the XLA-fused baseline's estimated_cycles beside it. Needs the Python toolchain
# (scripts/setup.sh --python).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python benches/parity.py "$@"
