#!/usr/bin/python3
"""Generate tests/vectors/keys.json, the chunk-key test vectors.

Design: this is the reference implementation the C code (common/keys.c) is
checked against, so it shares nothing with it: only the Python stdlib
(hashlib, struct) and cbor2 (Debian python3-cbor2), which is the encoder
vLLM itself uses. Run it with /usr/bin/python3, where cbor2 is installed:

    /usr/bin/python3 tests/python/gen_vectors.py            # rewrite the file
    /usr/bin/python3 tests/python/gen_vectors.py --check    # 1 if stale

The schemes (DESIGN.md section 2):

  kvt1    seed   = SHA-256("kvt1" || u32le(len ns) || ns || u32le(len salt) || salt)
          key[i] = SHA-256(prev || u32le(n) || tokens as u32le
                           || u32le(len extra) || extra)
  vllm    vLLM sha256_cbor (vllm/utils/hashing.py + vllm/v1/core/
          kv_cache_utils.py: init_none_hash, hash_block_tokens):
          NONE_HASH = SHA-256(cbor2.dumps(PYTHONHASHSEED, canonical=True))
          key[i]    = SHA-256(cbor2.dumps((prev, tuple(tokens), extra), canonical=True))
          extra is None or a tuple of str (e.g. the LoRA name).
  sglang  SGLang HiCache get_hash_str (python/sglang/srt/mem_cache/
          hicache_storage.py): SHA-256(bytes.fromhex(prior) || tokens as u32le),
          no prior for the first page.

In every scheme prev starts at the seed (kvt1, vllm) or nothing (sglang),
unless a parent key is given; only full chunks are hashed. Tokens are drawn
from a fixed hash-based generator, so the output is byte-for-byte stable.
"""

import hashlib
import json
import os
import struct
import sys

import cbor2

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.path.join(HERE, "..", "vectors", "keys.json")

# Token ids at every CBOR integer-width boundary (0..23 inline, 1, 2, 4 bytes)
# and at the top of u32.
BOUNDARY_TOKENS = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**24 - 1, 2**24,
                   2**31, 2**32 - 2, 2**32 - 1, 100000, 151643, 128000]

NS = "llama-3.1-8b/bf16/vllm-flash/tp2r0"


# ------------------------------------------------------------------ schemes

def u32le(v):
    return struct.pack("<I", v)


def chunks(tokens, n):
    return [tokens[i:i + n] for i in range(0, len(tokens) - n + 1, n)]


def kvt1_keys(ns, salt, extra, chunk_tokens, tokens, parent=None):
    ns = ns.encode()
    prev = parent or hashlib.sha256(
        b"kvt1" + u32le(len(ns)) + ns + u32le(len(salt)) + salt).digest()
    keys = []
    for block in chunks(tokens, chunk_tokens):
        body = b"".join(u32le(t) for t in block)
        prev = hashlib.sha256(prev + u32le(len(block)) + body +
                              u32le(len(extra)) + extra).digest()
        keys.append(prev)
    return keys


def sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def vllm_keys(seed, extra_strs, chunk_tokens, tokens, parent=None):
    prev = parent or sha256_cbor(seed)
    extra = tuple(extra_strs) if extra_strs else None
    keys = []
    for block in chunks(tokens, chunk_tokens):
        prev = sha256_cbor((prev, tuple(block), extra))
        keys.append(prev)
    return keys


def sglang_keys(chunk_tokens, tokens, parent=None):
    prior = parent.hex() if parent else None
    keys = []
    for block in chunks(tokens, chunk_tokens):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in block:
            h.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = h.hexdigest()
        keys.append(bytes.fromhex(prior))
    return keys


def compute(v):
    """Keys of one vector (a dict as stored in keys.json)."""
    parent = bytes.fromhex(v["parent"]) if v["parent"] else None
    if v["scheme"] == "kvt1":
        return kvt1_keys(v["ns"], bytes.fromhex(v["salt_hex"]),
                         bytes.fromhex(v["extra_hex"]), v["chunk_tokens"],
                         v["tokens"], parent)
    if v["scheme"] == "vllm":
        return vllm_keys(v["seed"], v["extra_strs"], v["chunk_tokens"],
                         v["tokens"], parent)
    if v["scheme"] == "sglang":
        return sglang_keys(v["chunk_tokens"], v["tokens"], parent)
    raise ValueError("unknown scheme " + v["scheme"])


# ------------------------------------------------------------------ vectors

def gen_tokens(label, n, vocab=152064):
    """n deterministic token ids in [0, vocab)."""
    return [int.from_bytes(hashlib.sha256(f"{label}/{i}".encode()).digest()[:4],
                           "little") % vocab for i in range(n)]


def vec(name, scheme, chunk_tokens, tokens, ns=NS, salt=b"", extra=b"",
        seed=None, extra_strs=(), parent=None, note=""):
    v = {
        "name": name,
        "note": note,
        "scheme": scheme,
        "chunk_tokens": chunk_tokens,
        "ns": ns,
        "salt_hex": salt.hex(),
        "extra_hex": extra.hex(),
        "seed": seed,
        "extra_strs": list(extra_strs),
        "parent": parent.hex() if parent else None,
        "tokens": list(tokens),
    }
    v["keys"] = [k.hex() for k in compute(v)]
    return v


def kvt1_vectors():
    t12 = gen_tokens("kvt1-basic", 12)
    basic = vec("kvt1-basic", "kvt1", 4, t12, note="3 chunks of 4")
    first = bytes.fromhex(basic["keys"][0])
    return [
        basic,
        vec("kvt1-empty-ns", "kvt1", 4, t12[:8], ns="", note="ns of 0 bytes"),
        vec("kvt1-utf8-ns", "kvt1", 4, t12[:8], ns="модель/bf16/tp1r0"),
        vec("kvt1-ns-255", "kvt1", 4, t12[:4], ns="n" * 255,
            note="longest namespace, KVT_NS_MAX bytes"),
        vec("kvt1-salt", "kvt1", 4, t12, salt=b"tenant-42"),
        vec("kvt1-binary-salt", "kvt1", 4, t12[:8],
            salt=bytes([0, 1, 0xfe, 0xff]) * 5, note="salt with NUL bytes"),
        vec("kvt1-extra", "kvt1", 4, t12, extra=b"lora:7\x00mm:" + bytes(range(20)),
            note="extra bytes in every chunk"),
        vec("kvt1-salt-extra", "kvt1", 4, t12[:8], salt=b"s", extra=b"e"),
        vec("kvt1-parent", "kvt1", 4, t12[:8], parent=bytes(range(32)),
            note="chain continues from a given parent, seed unused"),
        vec("kvt1-continuation", "kvt1", 4, t12[4:], parent=first,
            note="kvt1-basic split after chunk 0: keys == kvt1-basic keys[1:]"),
        vec("kvt1-chunk1", "kvt1", 1, t12[:5], note="chunk_tokens=1"),
        vec("kvt1-large-tokens", "kvt1", 4, BOUNDARY_TOKENS,
            note="ids at u8/u16/u24/u32 boundaries up to 0xFFFFFFFF"),
        vec("kvt1-partial", "kvt1", 4, t12[:10], note="trailing 2 tokens unhashed"),
        vec("kvt1-short", "kvt1", 4, t12[:3], note="no full chunk: no keys"),
        vec("kvt1-empty", "kvt1", 4, [], note="no tokens: no keys"),
        vec("kvt1-chunk256", "kvt1", 256, gen_tokens("kvt1-256", 513),
            note="default chunk size, 2 chunks + 1 token"),
    ]


def vllm_vectors():
    t48 = gen_tokens("vllm-basic", 48)
    basic = vec("vllm-seed0", "vllm", 16, t48, seed="0",
                note="PYTHONHASHSEED=0, no extra keys (CBOR null)")
    first = bytes.fromhex(basic["keys"][0])
    long_strs = ["lora-\u00e9\u4e2d", "", "a" * 30, "x" * 300]
    return [
        basic,
        vec("vllm-seed42", "vllm", 16, t48, seed="42"),
        vec("vllm-seed-max", "vllm", 16, t48[:16], seed="4294967295"),
        vec("vllm-seed-empty", "vllm", 16, t48[:16], seed="",
            note="PYTHONHASHSEED set but empty: vLLM hashes the empty string"),
        vec("vllm-lora", "vllm", 16, t48, seed="0", extra_strs=["my-lora-adapter"],
            note="LoRA name as the one extra key of every block"),
        vec("vllm-extra-strs", "vllm", 4, t48[:8], seed="0", extra_strs=long_strs,
            note="non-ASCII, empty, 30-byte (0x78) and 300-byte (0x79) text"),
        vec("vllm-parent", "vllm", 16, t48[:32], seed="0", parent=bytes([0xab] * 32)),
        vec("vllm-continuation", "vllm", 16, t48[16:], seed="0", parent=first,
            note="vllm-seed0 split after block 0: keys == vllm-seed0 keys[1:]"),
        vec("vllm-chunk1", "vllm", 1, t48[:3], seed="0"),
        vec("vllm-large-tokens", "vllm", 8, BOUNDARY_TOKENS, seed="0",
            note="every CBOR uint width: inline, 0x18, 0x19, 0x1a"),
        vec("vllm-chunk23", "vllm", 23, gen_tokens("vllm-23", 23), seed="0",
            note="largest inline array head (0x97)"),
        vec("vllm-chunk24", "vllm", 24, gen_tokens("vllm-24", 48), seed="0",
            note="array head 0x98 0x18"),
        vec("vllm-chunk256", "vllm", 256, gen_tokens("vllm-256", 512), seed="0",
            note="array head 0x99 0x01 0x00"),
        vec("vllm-partial", "vllm", 16, t48[:40], seed="0"),
        vec("vllm-short", "vllm", 16, t48[:15], seed="0"),
    ]


def sglang_vectors():
    t128 = gen_tokens("sglang-basic", 128)
    basic = vec("sglang-basic", "sglang", 32, t128, note="4 pages of 32")
    first = bytes.fromhex(basic["keys"][0])
    return [
        basic,
        vec("sglang-parent", "sglang", 32, t128[:64], parent=bytes([0x5a] * 32)),
        vec("sglang-continuation", "sglang", 32, t128[32:], parent=first,
            note="sglang-basic split after page 0: keys == sglang-basic keys[1:]"),
        vec("sglang-chunk1", "sglang", 1, t128[:4]),
        vec("sglang-large-tokens", "sglang", 4, BOUNDARY_TOKENS),
        vec("sglang-chunk64", "sglang", 64, gen_tokens("sglang-64", 130)),
        vec("sglang-ns-salt-ignored", "sglang", 32, t128[:32], ns="other/ns",
            salt=b"ignored", note="engine schemes ignore ns and salt: == sglang-basic keys[0]"),
        vec("sglang-short", "sglang", 32, t128[:31]),
    ]


def build():
    return {
        "format": "kvtier key vectors v1",
        "generator": "tests/python/gen_vectors.py (hashlib + cbor2)",
        "fields": ("salt_hex/extra_hex: kvt1 bytes as hex; seed: vLLM "
                   "PYTHONHASHSEED string; extra_strs: vLLM extra keys (empty "
                   "= CBOR null); parent: hex key the chain continues from, or "
                   "null; keys: one hex key per full chunk"),
        "vectors": kvt1_vectors() + vllm_vectors() + sglang_vectors(),
    }


def render(doc):
    """JSON with one vector field per line: readable diffs, compact lists."""
    head = {k: v for k, v in doc.items() if k != "vectors"}
    out = ["{"]
    for k, v in head.items():
        out.append(f"  {json.dumps(k)}: {json.dumps(v)},")
    out.append('  "vectors": [')
    for i, v in enumerate(doc["vectors"]):
        fields = [f"    {json.dumps(k)}: {json.dumps(x)}" for k, x in v.items()]
        out.append("   {\n" + ",\n".join(fields) + "\n   }" +
                   ("," if i + 1 < len(doc["vectors"]) else ""))
    out.append("  ]")
    out.append("}")
    return "\n".join(out) + "\n"


def main(argv):
    text = render(build())
    if "--check" in argv:
        with open(VECTORS, encoding="utf-8") as f:
            stale = f.read() != text
        print("keys.json is " + ("STALE" if stale else "up to date"))
        return 1 if stale else 0
    with open(VECTORS, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.normpath(VECTORS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
