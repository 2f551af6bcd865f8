#!/usr/bin/env bash
# Print deploy/kvtierd.conf: the key table's reference (kvtierd
# --print-config) with the settings a systemd install uses. A test
# (tests/integration/test_deploy.sh) checks the committed file matches:
#   deploy/gen-conf.sh build/bin/kvtierd > deploy/kvtierd.conf
set -euo pipefail
kvtierd=${1:-${KVTIERD:-build/bin/kvtierd}}
exec "$kvtierd" --print-config \
    --socket ipc:///run/kvtier/kvtierd.sock \
    --state-dir /var/lib/kvtier \
    --pool-mode 0660 \
    --pool-group kvtier \
    --dram.pool memfd
