#!/usr/bin/env bash
# Install the Debian packages kvtier needs to build, test and benchmark.
# Idempotent: only missing packages are installed. Needs root for apt-get;
# without it, prints what is missing and fails.
set -euo pipefail

pkgs=(
  build-essential pkg-config
  libnng-dev protobuf-c-compiler libprotobuf-c-dev
  liburing-dev librocksdb-dev libucx-dev ucx-utils
  libxxhash-dev libssl-dev openssl libinih-dev libcmocka-dev libzmq3-dev
  python3 python3-cbor2
  redis-server libhiredis-dev fio
  systemd prometheus python3-yaml groff-base
  openssl
  etcd-server libcurl4-openssl-dev
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: missing packages: ${missing[*]}" >&2
  echo "deps.sh: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
