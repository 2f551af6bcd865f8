"""kvtier inside a real vLLM: reused KV gives the tokens recomputing gives.

Every check runs the real engine (vLLM's CPU build, a tiny random Llama made
by make_model.py) with KVTierConnector against a real kvtierd, and compares
greedy tokens with a run where kvtier is off:
  - cold (saves) and warm in a new engine (loads all but the last chunk of
    a 4-chunk prompt: the connector's count, the daemon's bytes out and its
    chunk count agree);
  - a multi-turn chat and a long shared document over several requests in
    one engine (later requests hit what earlier ones saved);
  - after kvtierd restarts (the DRAM pool adopted);
  - after the chunks were flushed and evicted to NVMe (promoted back);
  - with the pool's bytes corrupted: checksums fail, the blocks are reported
    as load errors, vLLM recomputes (kv_load_failure_policy=recompute);
  - with kvtierd killed mid-run and started again: misses while it is gone,
    hits once it is back, the engine never stops.
Run with the engines venv's python (make test-engines).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from kvtd import Daemon, Results  # noqa: E402

import kvtier  # noqa: E402  (kvtd puts client/python on the path)

MODEL = os.environ.get("KVT_ENGINE_MODEL") or os.path.expanduser("~/.cache/kvtier/models/tiny")
CT = 256
R = Results()


def toks(seed, n):
    x, out = seed * 2654435761 % 1000003 + 1, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + x % 1990)
    return out


P = toks(1, 4 * CT)                     # 4 full chunks: 3 loadable
DOC = toks(2, 1500)
QS = [toks(10 + i, 24) for i in range(3)]
CHAT = [toks(20, 300), toks(21, 40), toks(22, 300), toks(23, 30)]


LAST = {}


def run(steps, kvtier=None, policy="recompute"):
    a = {"model": MODEL, "steps": steps, "kvtier": kvtier, "policy": policy,
         "max_tokens": 8, "hash_algo": "sha256_cbor", "drain": True}
    r = subprocess.run([sys.executable, os.path.join(HERE, "vllm_run.py"), json.dumps(a)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError("vllm run failed (%d):\n%s" % (r.returncode, r.stderr[-4000:]))
    LAST.update(json.loads(r.stdout.strip().splitlines()[-1]))
    return LAST["outputs"]


def cfg(d, tag):
    base = os.path.join(d.dir, "stats-" + tag)
    return {"socket": d.url, "chunk_tokens": CT, "stats_file": base}, base


def stats_of(base, role):
    p = "%s.%s.json" % (base, role)
    if not os.path.exists(p):
        return {}
    with open(p) as f:
        return json.load(f)


def dstats(d):
    return json.loads(d.ctl("stats", "--json").stdout)


MAIN = [{"prompt": P}, {"chat": CHAT}] + [{"prompt": DOC + q} for q in QS]
REF = {}


def test_reference_without_kvtier():
    REF["main"] = run(MAIN)
    assert len(REF["main"]) == 1 + 4 + 3 and all(len(o) == 8 for o in REF["main"])


def test_cold_then_warm(d):
    c, base = cfg(d, "cold")
    out = run(MAIN, c)
    assert out == REF["main"], "kvtier cold changed tokens"
    s = stats_of(base, "scheduler")
    # the doc is saved by its first request and hit by the next two; the
    # chat's later turns hit the earlier turns' chunks
    assert s["hit_tokens"] >= 2 * 5 * CT, s
    ds = dstats(d)
    assert ds["chunks"] > 0
    # the keys are vLLM's block hashes: kvtier's vllm scheme (sha256_cbor,
    # PYTHONHASHSEED=0) over blocks finds every chunk of P the engine saved
    bs = LAST["block_size"]
    hashes = kvtier.hash_chain(P, bs, scheme="vllm", seed="0")
    keys = hashes[CT // bs - 1::CT // bs]
    REF["ns"] = s["namespace"]
    with kvtier.Client(d.url) as kc:
        assert kc.lookup(s["namespace"], keys)[0] == 4, "engine keys differ from kvtier's"
    w = stats_of(base, "worker")
    assert w["load_failed_blocks"] == 0 and w["save_errors"] == 0, w
    # a new engine: the 4-chunk prompt loads its first three chunks
    before = dstats(d)
    c, base = cfg(d, "warm")
    out = run([{"prompt": P}], c)
    assert out == REF["main"][:1], "kvtier warm changed tokens"
    s, w, after = stats_of(base, "scheduler"), stats_of(base, "worker"), dstats(d)
    assert s["hit_tokens"] == 3 * CT and s["load_chunks"] == 3, s
    assert w["loaded_chunks"] == 3 and w["load_failed_blocks"] == 0, w
    chunk_bytes = ds["used_bytes"] // ds["chunks"]
    assert after["bytes_out"] - before["bytes_out"] == 3 * chunk_bytes, (before, after)
    assert after["chunks"] == before["chunks"]          # nothing saved twice


def warm_P(d, tag, expect_failed=False):
    c, base = cfg(d, tag)
    out = run([{"prompt": P}], c)
    assert out == REF["main"][:1], "tokens changed (%s)" % tag
    s, w = stats_of(base, "scheduler"), stats_of(base, "worker")
    assert s["hit_tokens"] == 3 * CT, (tag, s)
    if expect_failed:
        assert w["load_failed_blocks"] > 0, (tag, w)
    else:
        assert w["loaded_chunks"] == 3 and w["load_failed_blocks"] == 0, (tag, w)
    return s, w


def test_after_restart(d):
    d.stop()
    d.start()
    ds = dstats(d)
    assert ds["adopted_chunks"] > 0, ds
    warm_P(d, "restart")


def test_from_nvme(d):
    d.ctl("flush", "--evict")
    ds = dstats(d)
    assert ds["tiers"]["dram"]["chunks"] == 0, ds["tiers"]
    assert ds["tiers"]["nvme"]["chunks"] > 0, ds["tiers"]
    before = ds["nvme"]["promotions"]
    warm_P(d, "nvme")
    after = dstats(d)["nvme"]["promotions"]
    assert after >= before + 3, (before, after)


def corrupt_pool(d):
    """Overwrite every used byte range of the pool file with other bytes."""
    used = dstats(d)["used_bytes"]
    size = os.path.getsize(d.pool)
    with open(d.pool, "r+b") as f:
        for off in range(0, size, 1 << 20):
            f.seek(off)
            f.write(bytes((off // 4096 + i) % 251 for i in range(4096)))
    return used


def test_corrupt_chunks_recomputed(d):
    corrupt_pool(d)
    warm_P(d, "corrupt", expect_failed=True)
    # the corrupt chunks were dropped when found: the next engine misses,
    # recomputes and saves them again, and the one after hits
    c, base = cfg(d, "after-corrupt")
    assert run([{"prompt": P}, {"prompt": P}], c) == REF["main"][:1] * 2
    s, w = stats_of(base, "scheduler"), stats_of(base, "worker")
    assert s["hit_tokens"] == 3 * CT and w["load_failed_blocks"] == 0, (s, w)


def test_corrupt_chunks_fail_policy(d):
    """kv_load_failure_policy "fail": the request ends in error, no wrong token."""
    corrupt_pool(d)
    c, base = cfg(d, "fail")
    out = run([{"prompt": P}], c, policy="fail")
    assert LAST["finish"] == ["error"] and out != REF["main"][:1], (LAST["finish"], out)
    assert stats_of(base, "worker")["load_failed_blocks"] > 0


def test_daemon_killed_mid_run(d):
    # clean state: nothing of P cached, then one engine lives through the
    # daemon's death
    with kvtier.Client(d.url) as kc:
        kc.clear(REF["ns"])
    kill = "kill -9 %d" % d.proc.pid
    c, base = cfg(d, "killed")
    steps = [{"prompt": P}, {"prompt": P}, {"sh": kill}, {"prompt": P},
             {"sh": "sleep 0.2"}, {"prompt": P}]
    out = run(steps, c)
    assert out == REF["main"][:1] * 4, "tokens changed when the daemon died"
    s, w = stats_of(base, "scheduler"), stats_of(base, "worker")
    # the first request saves, the second loads 3 chunks; after the kill:
    # misses, and the engine goes on computing
    assert s["hit_tokens"] == 3 * CT and w["load_failed_blocks"] == 0, (s, w)
    d.proc.wait()
    d.start()
    warm_P(d, "back")


def main():
    if not os.path.exists(os.path.join(MODEL, "config.json")):
        raise SystemExit("no model at %s (make test-engines makes it)" % MODEL)
    R.run(test_reference_without_kvtier)
    with Daemon(pool="512M", args=["--nvme.nvme_bytes", "512M", "--nvme.file_bytes", "128M",
                                   "--nvme.fsync", "0"]) as d:
        for t in (test_cold_then_warm, test_after_restart, test_from_nvme,
                  test_corrupt_chunks_recomputed, test_corrupt_chunks_fail_policy,
                  test_daemon_killed_mid_run):
            R.run(t, d)
            if d.proc.poll() is not None and t is not test_daemon_killed_mid_run:
                raise SystemExit("kvtierd died:\n" + d.logtext()[-3000:])
    R.finish()


if __name__ == "__main__":
    main()
