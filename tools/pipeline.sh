#!/usr/bin/env bash
# The example Spark pipeline (tools/examples/orders_pipeline.py) on the default root, or ROOT:
# installs hostmq with the spark extra into .venv if needed. Usage: tools/pipeline.sh [ROOT] [--orders N]
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/_venv.sh
hostmq_venv "dev,spark"
exec .venv/bin/python tools/examples/orders_pipeline.py "$@"
