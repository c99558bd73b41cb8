#!/usr/bin/env bash
# Create .venv if missing, install hostmq, and run the main job: a cluster (NameServer + broker) on the
# default root ($HOSTMQ_ROOT, else ~/.hostmq) with a short produce / consume demo; it keeps serving
# until Ctrl-C. Arguments are passed on: tools/run.sh /tmp/myroot --brokers 2 --demo-messages 50000
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/_venv.sh
hostmq_venv ""
exec .venv/bin/hostmq up --demo "$@"
