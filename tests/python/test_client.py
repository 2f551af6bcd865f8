"""The Python package kvtier against a real kvtierd.

Runs with Debian's /usr/bin/python3 and the standard library only: the
package must need nothing else. Covers: the library found in the build
tree (and a C program linked against build/lib starting, which needs the
SONAME link), the three key schemes against tests/vectors/keys.json,
put/lookup/get with zero-copy views bit-exact, views dead after release,
two-phase puts, copies, delete/clear/evict/stats, errors carrying their
kvt_err, and the KV-cache calls on a shared-memory "engine".
"""
import ctypes
import json
import mmap
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtd import BUILD, ROOT, Daemon, Results  # noqa: E402

import kvtier  # noqa: E402
from kvtier import Err, KVTierError, Tier  # noqa: E402
from kvtier import _lib  # noqa: E402

R = Results()


def blob(seed, n):
    out = bytearray(n)
    x = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF
    for i in range(0, n, 8):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        out[i:i + 8] = x.to_bytes(8, "little")[:n - i]
    return bytes(out)


def test_library_found_in_build_tree():
    lib = _lib.lib()
    assert os.path.realpath(lib._name) == os.path.realpath(
        os.path.join(BUILD, "lib", "libkvtier.so.0")), lib._name
    # A program linked against the build tree's libkvtier.so starts: the
    # file its SONAME names is there.
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "v.c")
        with open(src, "w") as f:
            f.write('#include <kvtier.h>\n#include <stdio.h>\n'
                    'int main(void){puts(kvt_strerror(KVT_ENOENT));return 0;}\n')
        exe = os.path.join(d, "v")
        subprocess.run(["cc", src, "-I", os.path.join(ROOT, "client", "include"),
                        "-L", os.path.join(BUILD, "lib"), "-lkvtier", "-o", exe],
                       check=True)
        out = subprocess.run([exe], capture_output=True, text=True, check=True,
                             env=dict(os.environ, LD_LIBRARY_PATH=os.path.join(BUILD, "lib")))
        assert out.stdout.strip() == kvtier.KVTierError(Err.ENOENT, "x").msg


def test_library_found_in_an_install():
    """make install PREFIX=P puts libkvtier.so.0 in P/lib; the package
    copied to P/lib/pythonX.Y/site-packages finds it with nothing set."""
    import shutil
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["make", "-s", "-C", ROOT, "install", "PREFIX=" + d,
                        "BUILD=" + os.path.relpath(BUILD, ROOT)], check=True,
                       stdout=subprocess.DEVNULL)
        site = os.path.join(d, "lib", "python3", "site-packages")
        shutil.copytree(os.path.join(ROOT, "client", "python", "kvtier"),
                        os.path.join(site, "kvtier"))
        env = {k: v for k, v in os.environ.items() if k not in ("KVTIER_LIB", "KVTIER_BUILD")}
        env["PYTHONPATH"] = site
        out = subprocess.run([sys.executable, "-c",
                              "import kvtier._lib as L, os; print(os.path.realpath(L.lib()._name))"],
                             env=env, capture_output=True, text=True, check=True, cwd=d)
        assert out.stdout.strip() == os.path.realpath(os.path.join(d, "lib", "libkvtier.so.0")), out


def test_key_vectors():
    with open(os.path.join(ROOT, "tests", "vectors", "keys.json")) as f:
        vecs = json.load(f)["vectors"]
    for v in vecs:
        keys = kvtier.hash_chain(
            v["tokens"], v["chunk_tokens"], scheme=v["scheme"], ns=v.get("ns") or "",
            salt=bytes.fromhex(v.get("salt_hex") or ""),
            extra=bytes.fromhex(v.get("extra_hex") or ""), seed=v.get("seed"),
            extra_strs=v.get("extra_strs") or None, parent=v.get("parent"))
        assert [k.hex() for k in keys] == v["keys"], v["name"]
    assert len(vecs) >= 30


def test_put_lookup_get(d):
    with kvtier.Client(d.url) as c:
        assert c.zero_copy
        keys = kvtier.hash_chain(range(1024), 256, ns="py")
        bufs = [blob(i, 65536 + i * 4096) for i in range(4)]
        assert c.put("py", keys[:3], bufs[:3]) == 3
        assert c.put("py", keys[:3], bufs[:3]) == 0          # nothing new
        n, tiers = c.lookup("py", keys)
        assert n == 3 and tiers[:3] == [Tier.DRAM] * 3 and tiers[3] == Tier.NONE
        with c.get("py", keys) as g:
            assert len(g) == 3
            for i in range(3):
                assert g[i].readonly and bytes(g[i]) == bufs[i]
                assert g.verify(i)
            v = g[0]
        try:                                                  # dead after release
            v[0]
            raise AssertionError("view usable after release")
        except ValueError:
            pass
        assert c.get_copy("py", keys[1]) == bufs[1]
        assert c.get_copy("py", keys[3]) is None
        assert c.lookup("py-other", keys)[0] == 0             # namespaces apart


def test_two_phase_put(d):
    with kvtier.Client(d.url) as c:
        keys = kvtier.hash_chain(range(10_000, 10_512), 256, ns="py2")
        data = [blob(100 + i, 32768) for i in range(2)]
        with c.put_begin("py2", keys, [32768, 32768]) as p:
            assert p.exists == [False, False]
            for i, v in enumerate(p.views):
                v[:] = data[i]
        assert c.lookup("py2", keys)[0] == 2
        p = c.put_begin("py2", keys, [32768, 32768])
        assert p.exists == [True, True] and p.views == [None, None]
        p.commit()
        k3 = kvtier.hash_chain(range(20_000, 20_256), 256, ns="py2")
        p = c.put_begin("py2", k3, [4096], parent=keys[-1])
        p.views[0][:] = b"z" * 4096
        p.abort()                                             # nothing visible
        assert c.lookup("py2", k3)[0] == 0
        with kvtier.Client(d.url) as c2:                       # checksums given
            p = c2.put_begin("py2", k3, [4096])
            p.views[0][:] = b"q" * 4096
            p.commit([kvtier.checksum(b"q" * 4096)])
        assert c.get_copy("py2", k3[0]) == b"q" * 4096


def test_delete_clear_evict_stats(d):
    with kvtier.Client(d.url) as c:
        keys = kvtier.hash_chain(range(4096), 256, ns="py3")
        c.put("py3", keys, [blob(i, 8192) for i in range(len(keys))])
        assert c.delete("py3", keys[-2:]) == 2
        assert c.lookup("py3", keys)[0] == len(keys) - 2
        assert c.clear("py3") == len(keys) - 2
        s = c.stats()
        assert s["pool_bytes"] == 64 << 20 and s["puts"] >= 1 and s["clients"] >= 1
        c.put("py3", keys[:4], [blob(i, 1 << 20) for i in range(4)])
        assert c.evict(64 << 20) >= 4 << 20
        assert c.lookup("py3", keys)[0] == 0


def test_errors(d):
    try:
        kvtier.Client("ipc:///nonexistent/kvt.sock")
        raise AssertionError("connected to nothing")
    except KVTierError as e:
        assert e.err == Err.ECLOSED, e.err
    with kvtier.Client(d.url) as c:
        k = kvtier.hash_chain(range(256), 256, ns="e")
        try:
            c.put("e", k, [b""])                              # zero-size chunk
            raise AssertionError("empty chunk accepted")
        except KVTierError as e:
            assert e.err == Err.EINVAL, e
        try:
            c.release(123456789)
            raise AssertionError("foreign lease released")
        except KVTierError as e:
            assert e.err in (Err.ENOENT, Err.EPERM), e
        for bad in ("", "x" * 256):
            try:
                c.lookup(bad, k)
                raise AssertionError("bad namespace taken")
            except ValueError:
                pass
        try:
            kvtier.key_bytes(b"short")
            raise AssertionError("short key taken")
        except ValueError:
            pass
    c = kvtier.Client(d.url)
    c.close()
    try:
        c.stats()
        raise AssertionError("closed client answered")
    except KVTierError as e:
        assert e.err == Err.ECLOSED


def test_kv_cache_calls(d):
    """Register a shared-memory 'engine' (vLLM flash NHD layout), save
    blocks as chunks and load them into other blocks, bit for bit."""
    L, NB, BS, H, D, E = 2, 8, 16, 2, 32, 2
    layer = 2 * NB * BS * H * D * E
    path = "/dev/shm/kvt-py-engine-%d" % os.getpid()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 4096 + L * layer)
        mm = mmap.mmap(fd, 4096 + L * layer)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        for li in range(L):
            mm[4096 + li * layer:4096 + (li + 1) * layer] = blob(li + 7, layer)
        with kvtier.Client(d.url) as c:
            lay = c.layout(1, L, NB, BS, H, D, E,
                           [base + 4096 + li * layer for li in range(L)])
            reg, info = c.kv_register_host("pykv", lay, 32, path, base)
            assert info["blocks_per_chunk"] == 2 and info["chunk_bytes"] == 2 * L * 2 * BS * H * D * E
            keys = kvtier.hash_chain(range(64), 32, ns="pykv")
            x = c.kv_save("pykv", reg, keys, [0, 1, 2, 3])
            st = c.kv_wait([x], 10000)
            assert st[0]["done"] and st[0]["err"] == Err.OK and st[0]["n_chunks"] == 2
            assert c.lookup("pykv", keys)[0] == 2
            x = c.kv_load("pykv", reg, keys, [4, 5, 6, 7])
            assert c.kv_wait([x], 10000)[0]["err"] == Err.OK
            page = BS * H * D * E
            for li in range(L):
                for kv in range(2):
                    off = 4096 + li * layer + kv * NB * page
                    assert mm[off:off + 4 * page] == mm[off + 4 * page:off + 8 * page]
            try:
                c.kv_load("pykv", reg, kvtier.hash_chain(range(1, 33), 32, ns="pykv"), [0, 1])
                raise AssertionError("load of an absent key accepted")
            except KVTierError as e:
                assert e.err == Err.ENOENT
            assert c.kv_stats()["saved_chunks"] >= 2
            c.kv_unregister(reg)
        del base
        mm.close()
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    R.run(test_library_found_in_build_tree)
    R.run(test_library_found_in_an_install)
    R.run(test_key_vectors)
    with Daemon() as d:
        for t in (test_put_lookup_get, test_two_phase_put, test_delete_clear_evict_stats,
                  test_errors, test_kv_cache_calls):
            R.run(t, d)
    R.finish()


if __name__ == "__main__":
    main()
