#!/usr/bin/env bash
# Create .venv if missing, install hostmq with the dev and spark extras (and redis-server, a bench
# peer), run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/_venv.sh
hostmq_venv "dev,spark"
hostmq_system_deps
exec .venv/bin/python -m pytest "$@"
