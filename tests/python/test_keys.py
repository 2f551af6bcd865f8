#!/usr/bin/python3
"""Check tests/vectors/keys.json against a second, independent computation.

Design: gen_vectors.py wrote the vectors; this test recomputes every one
with its own code (hashlib, struct and cbor2 only, written differently on
purpose), checks the file is exactly what gen_vectors.py produces today
(so nobody hand-edits it), checks cbor2's canonical encoding byte for byte
against a hand encoder (the same encoding common/keys.c writes in C), and,
if kvtierctl has been built, runs `kvtierctl hash` on every vector its
command line can express. The C side is checked by tests/unit/test_keys.c.

Run from anywhere with the system Python (it has python3-cbor2):

    /usr/bin/python3 tests/python/test_keys.py [-v]

KVTIERCTL names the kvtierctl binary (default build/bin/kvtierctl); the
kvtierctl test is skipped when it does not exist. Exit status is non-zero
on any failure.
"""

import hashlib
import json
import os
import struct
import subprocess
import sys
import unittest

import cbor2

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
VECTORS = os.path.join(ROOT, "tests", "vectors", "keys.json")
sys.path.insert(0, HERE)

import gen_vectors  # noqa: E402  (after the path fix)


def load():
    with open(VECTORS, encoding="utf-8") as f:
        text = f.read()
    return text, json.loads(text)


TEXT, DOC = load()
BY_NAME = {v["name"]: v for v in DOC["vectors"]}


def full_chunks(v):
    n, toks = v["chunk_tokens"], v["tokens"]
    for i in range(len(toks) // n):
        yield toks[i * n:(i + 1) * n]


def parent_of(v):
    return bytes.fromhex(v["parent"]) if v["parent"] is not None else None


# ------------------------------------------------- independent computations

def kvt1(v):
    ns = v["ns"].encode("utf-8")
    salt = bytes.fromhex(v["salt_hex"])
    extra = bytes.fromhex(v["extra_hex"])
    prev = parent_of(v)
    if prev is None:
        h = hashlib.sha256()
        for part in (b"kvt1", struct.pack("<I", len(ns)), ns,
                     struct.pack("<I", len(salt)), salt):
            h.update(part)
        prev = h.digest()
    out = []
    for block in full_chunks(v):
        h = hashlib.sha256(prev)
        h.update(struct.pack("<I%dI" % len(block), len(block), *block))
        h.update(struct.pack("<I", len(extra)) + extra)
        prev = h.digest()
        out.append(prev.hex())
    return out


def vllm(v):
    prev = parent_of(v)
    if prev is None:
        prev = hashlib.sha256(cbor2.dumps(v["seed"], canonical=True)).digest()
    extra = list(v["extra_strs"]) or None
    out = []
    for block in full_chunks(v):
        prev = hashlib.sha256(
            cbor2.dumps([prev, list(block), extra], canonical=True)).digest()
        out.append(prev.hex())
    return out


def sglang_get_hash_str(token_ids, prior_hash=None):
    """SGLang's get_hash_str, python/sglang/srt/mem_cache/hicache_storage.py."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def sglang(v):
    prior, out = v["parent"], []
    for block in full_chunks(v):
        prior = sglang_get_hash_str(block, prior)
        out.append(prior)
    return out


RECOMPUTE = {"kvt1": kvt1, "vllm": vllm, "sglang": sglang}


# --------------------------------------------------------- hand CBOR coder

def cbor_head(major, n):
    if n < 24:
        return bytes([major << 5 | n])
    for ai, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * width):
            return bytes([major << 5 | ai]) + n.to_bytes(width, "big")
    raise ValueError(n)


def cbor_text(s):
    b = s.encode("utf-8")
    return cbor_head(3, len(b)) + b


def cbor_block(parent, tokens, extra_strs):
    out = cbor_head(4, 3) + cbor_head(2, len(parent)) + parent
    out += cbor_head(4, len(tokens)) + b"".join(cbor_head(0, t) for t in tokens)
    if not extra_strs:
        return out + b"\xf6"
    return out + cbor_head(4, len(extra_strs)) + b"".join(map(cbor_text, extra_strs))


# ------------------------------------------------------------------- tests

class VectorTest(unittest.TestCase):

    def test_file_is_generator_output(self):
        self.assertEqual(TEXT, gen_vectors.render(gen_vectors.build()),
                         "keys.json is stale: run tests/python/gen_vectors.py")

    def test_every_vector_recomputed(self):
        self.assertGreater(len(DOC["vectors"]), 30)
        for v in DOC["vectors"]:
            with self.subTest(v["name"]):
                self.assertEqual(RECOMPUTE[v["scheme"]](v), v["keys"])
                self.assertEqual(len(v["keys"]),
                                 len(v["tokens"]) // v["chunk_tokens"])

    def test_vector_shape(self):
        names = [v["name"] for v in DOC["vectors"]]
        self.assertEqual(len(names), len(set(names)), "duplicate names")
        for v in DOC["vectors"]:
            with self.subTest(v["name"]):
                self.assertIn(v["scheme"], RECOMPUTE)
                self.assertGreaterEqual(v["chunk_tokens"], 1)
                self.assertTrue(all(0 <= t <= 0xFFFFFFFF for t in v["tokens"]))
                for k in v["keys"]:
                    self.assertRegex(k, "^[0-9a-f]{64}$")
                if v["scheme"] == "vllm":
                    self.assertIsInstance(v["seed"], str)

    def test_edge_cases_present(self):
        toks = [t for v in DOC["vectors"] for t in v["tokens"]]
        for bound in (2**16, 2**24, 0xFFFFFFFF):
            self.assertIn(bound, toks)
        seeds = {v["seed"] for v in DOC["vectors"] if v["scheme"] == "vllm"}
        self.assertGreaterEqual(len(seeds), 3)
        for name in ("kvt1-empty-ns", "kvt1-salt", "kvt1-extra", "kvt1-parent",
                     "kvt1-chunk1", "vllm-lora", "vllm-seed0", "sglang-parent"):
            self.assertIn(name, BY_NAME)

    def test_chains_split_anywhere(self):
        for whole, tail in (("kvt1-basic", "kvt1-continuation"),
                            ("vllm-seed0", "vllm-continuation"),
                            ("sglang-basic", "sglang-continuation")):
            with self.subTest(whole):
                self.assertEqual(BY_NAME[whole]["keys"][1:], BY_NAME[tail]["keys"])

    def test_inputs_that_must_change_keys(self):
        k = {n: v["keys"] for n, v in BY_NAME.items()}
        self.assertNotEqual(k["kvt1-basic"], k["kvt1-salt"])
        self.assertNotEqual(k["kvt1-basic"], k["kvt1-extra"])
        self.assertNotEqual(k["kvt1-basic"][:2], k["kvt1-empty-ns"])
        self.assertNotEqual(k["vllm-seed0"], k["vllm-seed42"])
        self.assertNotEqual(k["vllm-seed0"], k["vllm-lora"])
        # The engine schemes know nothing of namespaces or salts.
        self.assertEqual(k["sglang-basic"][:1], k["sglang-ns-salt-ignored"])

    def test_cbor2_canonical_matches_hand_encoding(self):
        parent = bytes(range(32))
        for v in DOC["vectors"]:
            if v["scheme"] != "vllm":
                continue
            for block in full_chunks(v):
                with self.subTest(v["name"]):
                    ours = cbor_block(parent, block, v["extra_strs"])
                    theirs = cbor2.dumps(
                        (parent, tuple(block),
                         tuple(v["extra_strs"]) if v["extra_strs"] else None),
                        canonical=True)
                    self.assertEqual(ours, theirs)
        self.assertEqual(cbor2.dumps("0", canonical=True), b"\x61\x30")
        self.assertEqual(cbor_head(0, 0xFFFFFFFF), b"\x1a\xff\xff\xff\xff")


def kvtierctl_path():
    path = os.environ.get("KVTIERCTL") or os.path.join(ROOT, "build", "bin", "kvtierctl")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def kvtierctl_args(v):
    """argv tail for `kvtierctl hash`, or None if its syntax cannot say v."""
    if v["extra_hex"] or v["extra_strs"] or v["parent"] or not v["tokens"]:
        return None
    salt = bytes.fromhex(v["salt_hex"])
    if not all(0x20 <= b < 0x7f for b in salt):
        return None
    args = ["hash", "--scheme", v["scheme"], "--ns", v["ns"],
            "--chunk-tokens", str(v["chunk_tokens"])]
    if salt:
        args += ["--salt", salt.decode("ascii")]
    if v["scheme"] == "vllm":
        args += ["--seed", v["seed"]]
    return args + [str(t) for t in v["tokens"]]


class KvtierctlTest(unittest.TestCase):

    def test_kvtierctl_hash(self):
        exe = kvtierctl_path()
        if exe is None:
            self.skipTest("kvtierctl not built (set KVTIERCTL or build build/bin/kvtierctl)")
        ran = 0
        for v in DOC["vectors"]:
            args = kvtierctl_args(v)
            if args is None:
                continue
            with self.subTest(v["name"]):
                r = subprocess.run([exe] + args, capture_output=True, text=True,
                                   timeout=30)
                self.assertEqual(r.returncode, 0, r.stderr)
                lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
                self.assertEqual(lines, v["keys"])
                ran += 1
        self.assertGreater(ran, 10)


if __name__ == "__main__":
    unittest.main()
