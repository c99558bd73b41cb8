#!/usr/bin/env bash
# Create .venv if missing, install hostmq, run the main job on the embedded default root
# ($HOSTMQ_ROOT, else ~/.hostmq). Until the broker exists the main job is the store demo.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/_venv.sh
hostmq_venv ""
exec .venv/bin/hostmq demo "$@"
