"""Workload replay without model compute: hit rate and bytes per tier.

Design: replays what engines would ask of kvtier -- LOOKUP of a prompt's
chunk keys, GET of the leading hits (the daemon promotes NVMe copies into
DRAM), PUT of the prompt's and answer's new full chunks, chained to their
parents -- against real kvtierd processes, with no model: chunk bytes stand
in for KV. Two workloads, both with DRAM smaller than the working set and
an NVMe tier behind it:
  - multi-round QA: many users, several rounds each, over one shared system
    prompt; each round's prompt is the history so far;
  - long-document QA: documents of many chunks, each asked several
    questions, documents drawn with a skew (a few are hot).
Each runs twice in the same run, once with prefix-aware eviction (the
default) and once with plain LRU (dram.plain_lru = 1); the figure is the
ratio. Token-weighted hit rate = prompt tokens served from kvtier / prompt
tokens that could be (all but the last, in whole chunks).

    /usr/bin/python3 bench/engines/bench_replay.py [--scale 1.0]
"""
import argparse
import json
import os
import random
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from kvtd import Daemon  # noqa: E402

import kvtier  # noqa: E402

CT = 256                 # tokens per chunk
CHUNK = 64 << 10         # bytes standing in for one chunk's KV
PAYLOAD = bytes(range(256)) * (CHUNK // 256)


def multi_round(scale, rng):
    users, rounds = int(120 * scale), 6
    system = [rng.randrange(50000) for _ in range(2 * CT)]
    hist = {u: list(system) for u in range(users)}
    order = [(r, u) for r in range(rounds) for u in range(users)]
    order.sort(key=lambda x: (x[0], rng.random()))
    for r, u in order:
        hist[u] += [rng.randrange(50000) for _ in range(rng.randrange(60, 200))]
        prompt = list(hist[u])
        hist[u] += [rng.randrange(50000) for _ in range(rng.randrange(100, 300))]
        yield prompt, list(hist[u])


def long_doc(scale, rng):
    docs = [[rng.randrange(50000) for _ in range(rng.randrange(8, 24) * CT)]
            for _ in range(int(60 * scale))]
    weights = [1.0 / (i + 1) ** 0.8 for i in range(len(docs))]
    for _ in range(int(600 * scale)):
        d = rng.choices(range(len(docs)), weights)[0]
        q = [rng.randrange(50000) for _ in range(rng.randrange(20, 60))]
        prompt = docs[d] + q
        yield prompt, prompt + [rng.randrange(50000) for _ in range(100)]


def replay(c, ns, reqs):
    served = possible = refused = 0
    for prompt, full in reqs:
        n_load = (len(prompt) - 1) // CT
        keys = kvtier.hash_chain(full, CT, ns=ns)
        possible += n_load * CT
        if n_load:
            with c.get(ns, keys[:n_load]) as g:
                served += len(g) * CT
        n_have = c.lookup(ns, keys)[0]
        new = keys[n_have:]
        if new:
            try:
                p = c.put_begin(ns, new, [CHUNK] * len(new),
                                parent=keys[n_have - 1] if n_have else None)
            except kvtier.KVTierError as e:   # DRAM full of unwritten chunks
                if e.err != kvtier.Err.ENOSPC:
                    raise
                refused += len(new)
                continue
            for v in p.views:
                if v is not None:
                    v[:] = PAYLOAD
            p.commit()
    return served, possible, refused


def one(workload, scale, plain_lru, dram_mb, nvme_mb):
    args = ["--nvme.nvme_bytes", "%dM" % nvme_mb, "--nvme.file_bytes", "64M",
            "--nvme.fsync", "0", "--dram.plain_lru", "1" if plain_lru else "0"]
    with Daemon(pool="%dM" % dram_mb, args=args) as d:
        with kvtier.Client(d.url) as c:
            gen = workload(scale, random.Random(7))
            served, possible, refused = replay(c, "replay", gen)
        s = json.loads(d.ctl("stats", "--json").stdout)
    nv = s.get("nvme", {})
    return {"hit_rate": served / max(1, possible), "served_tokens": served,
            "possible_tokens": possible, "refused_chunks": refused,
            "dram_in_bytes": s["bytes_in"],
            "dram_out_bytes": s["bytes_out"], "dram_evictions": s["evictions"],
            "nvme_demoted_bytes": nv.get("demoted_bytes", 0),
            "nvme_promoted_bytes": nv.get("promoted_bytes", 0),
            "nvme_evictions": s["tiers"].get("nvme", {}).get("evictions", 0)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {}
    for name, wl, dram, nvme in (("multi-round QA", multi_round, 16, 32),
                                 ("long-document QA", long_doc, 16, 32)):
        res = {pol: one(wl, a.scale, pol == "lru", dram, nvme) for pol in ("prefix", "lru")}
        out[name] = res
        p, l = res["prefix"], res["lru"]
        print("%-18s token hit rate: prefix-aware %.3f, plain LRU %.3f, ratio %.2fx "
              "(DRAM %d MiB, NVMe %d MiB, %d chunk-tokens possible)"
              % (name, p["hit_rate"], l["hit_rate"], p["hit_rate"] / max(1e-9, l["hit_rate"]),
                 dram, nvme, p["possible_tokens"]))
        for pol in ("prefix", "lru"):
            r = res[pol]
            print("    %-6s DRAM in %6.1f MiB out %6.1f MiB evictions %5d | NVMe demoted "
                  "%6.1f MiB promoted %6.1f MiB evictions %5d | puts refused %d" % (
                      pol, r["dram_in_bytes"] / 2**20, r["dram_out_bytes"] / 2**20,
                      r["dram_evictions"], r["nvme_demoted_bytes"] / 2**20,
                      r["nvme_promoted_bytes"] / 2**20, r["nvme_evictions"],
                      r["refused_chunks"]))
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
