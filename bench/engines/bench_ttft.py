"""Time to first token in real vLLM: recompute vs kvtier DRAM vs NVMe hits.

Design: a random Llama big enough that prefill of a 4k-token prompt takes
seconds on this machine's CPUs (made once by tests/engines/make_model.py);
each configuration is one engine process (tests/engines/vllm_run.py), each
request asks for one token, so its latency is the time to first token.
In one run:
  - kvtier off: three distinct prompts, recomputed;
  - kvtier on: the same prompts cold (recompute, saved to kvtier), warm
    (all but the last chunk loaded from DRAM), then after `kvtierctl flush
    --evict` (loaded from NVMe, promoted through DRAM);
  - vLLM's own CPU offloading (OffloadingConnector through
    --kv-offloading-size), cold and warm, where it runs on this backend.
Figures are medians and ratios against recompute in the same run.

    ~/.cache/kvtier/engines-venv/bin/python bench/engines/bench_ttft.py
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from kvtd import Daemon  # noqa: E402

MODEL = os.environ.get("KVT_BENCH_MODEL") or os.path.expanduser("~/.cache/kvtier/models/bench")
RUN = os.path.join(ROOT, "tests", "engines", "vllm_run.py")
N_TOKENS, CT, REPS = 4096, 256, 3


def prompt(seed):
    x, out = seed + 17, []
    for _ in range(N_TOKENS):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + x % 1990)
    return out


def run(steps, kvtier=None, extra=None):
    a = {"model": MODEL, "steps": steps, "kvtier": kvtier, "max_tokens": 1,
         "max_model_len": 8192, "max_num_batched_tokens": 8192}
    a.update(extra or {})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(a, f)
    try:
        r = subprocess.run([sys.executable, RUN, "@" + f.name], capture_output=True,
                           text=True, timeout=1800)
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        return None, r.stderr[-1500:]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def main():
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "engines", "make_model.py"),
                    MODEL, "--hidden", "1024", "--layers", "8", "--heads", "16",
                    "--kv-heads", "4", "--intermediate", "2816", "--ctx", "8192"],
                   check=True, capture_output=True)
    ps = [prompt(i) for i in range(REPS)]
    off, err = run([{"prompt": p} for p in ps])
    if off is None:
        sys.exit("vLLM without kvtier failed: " + err)
    recompute = statistics.median(off["ttft_s"])
    with Daemon(pool="2G", args=["--nvme.nvme_bytes", "2G", "--nvme.file_bytes", "256M",
                                 "--nvme.fsync", "0"]) as d:
        flush = "%s --socket %s flush --evict >/dev/null" % (
            os.environ.get("KVTIERCTL", os.path.join(ROOT, "build", "bin", "kvtierctl")), d.url)
        steps = [{"prompt": p} for p in ps] + [{"prompt": p} for p in ps] + \
            [{"sh": flush}] + [{"prompt": p} for p in ps]
        on, err = run(steps, {"socket": d.url, "chunk_tokens": CT})
        if on is None:
            sys.exit("vLLM with kvtier failed: " + err)
        t = on["ttft_s"]
        cold, dram, nvme = (statistics.median(t[i * REPS:(i + 1) * REPS]) for i in range(3))
        assert on["outputs"][:REPS] == off["outputs"], "kvtier changed tokens"
    gib = 2.0
    vo, verr = run([{"prompt": p} for p in ps] * 2, None,
                   {"kv_offloading_size": gib})
    print("time to first token, %d-token prompt, %s (median of %d):" % (
        N_TOKENS, os.path.basename(MODEL), REPS))
    print("  recompute (kvtier off)    %7.3f s   1.00x" % recompute)
    print("  kvtier cold (+ save)      %7.3f s   %.2fx of recompute" % (cold, cold / recompute))
    print("  kvtier DRAM hit           %7.3f s   %.2fx of recompute (%.1fx faster)" % (
        dram, dram / recompute, recompute / dram))
    print("  kvtier NVMe hit           %7.3f s   %.2fx of recompute (%.1fx faster)" % (
        nvme, nvme / recompute, recompute / nvme))
    if vo is None:
        print("  vLLM OffloadingConnector  does not run on this backend: %s" %
              " ".join(verr.strip().splitlines()[-1:])[:200])
    else:
        vc = statistics.median(vo["ttft_s"][:REPS])
        vw = statistics.median(vo["ttft_s"][REPS:])
        print("  vLLM CPU offload cold     %7.3f s   %.2fx of recompute" % (vc, vc / recompute))
        print("  vLLM CPU offload hit      %7.3f s   %.2fx of recompute; kvtier DRAM hit "
              "/ this: %.2fx" % (vw, vw / recompute, dram / vw))


if __name__ == "__main__":
    main()
