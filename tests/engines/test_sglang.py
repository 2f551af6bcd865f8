"""kvtier.sglang.KVTierStore, SGLang's HiCache storage backend, against a
real kvtierd.

Run with the engines venv's python (scripts/engines-env.sh prints it):
    $(scripts/engines-env.sh) tests/engines/test_sglang.py

Real SGLang classes throughout: device pools MHATokenToKVPool and
MLATokenToKVPool built on the CPU, the host pools MHATokenToKVPoolHost and
MLATokenToKVPoolHost over them (every layout kvtier supports), SGLang's page
hash (get_hash_str / get_storage_hash_str / storage_namespace_seed),
HiCacheStorageConfig, StorageBackendFactory.create_backend("dynamic", ...)
and the cache controller's own storage code: HiCacheController's
_storage_hit_query, _page_transfer, _page_backup, _page_get_zero_copy and
_page_set_zero_copy run unchanged on a CONTROLLER STAND-IN object that
carries only the attributes those methods read (a whole HiCacheController
needs a device allocator, process groups and CUDA streams).

Covers: SGLang's page keys equal kvtier.hash_chain(scheme="sglang"); v1
set then get into other host pages bit-exact for each layout, chunks equal
to the pool's get_data_page bytes (so the legacy calls share them); leading
hit counts; MLA: the non-writer rank stores nothing and reads what rank 0
stored; a chunk corrupted in the pool is a miss; a killed daemon gives
False / 0 and no exception, a restarted one is used again; the dynamic
loader; an unsupported layout refused with a clear error.
"""
import ctypes
import os
import queue
import random
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from kvtd import Daemon, Results  # noqa: E402

import torch  # noqa: E402

import kvtier  # noqa: E402
from sglang.srt.managers.cache_controller import (  # noqa: E402
    HiCacheController, PrefetchOperation, StorageOperation)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig, HiCacheStorageExtraInfo)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import (  # noqa: E402
    get_hash_str, get_storage_hash_str, storage_namespace_seed)

from kvtier.sglang import KVTierStore, page_key  # noqa: E402

R = Results()
PS = 4            # tokens per page
DEVICE_TOKENS = 64
MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head",
               "page_unified")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_unified")
DYNAMIC = {"backend_name": "kvtier", "module_path": "kvtier.sglang",
           "class_name": "KVTierStore", "interface_v1": 1}


def config(url, tp_rank=0, tp_size=1, mla=False, **extra):
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=True,
        is_page_first_layout=False, model_name="test-org/tiny-model",
        extra_config=dict(DYNAMIC, socket=url, reconnect_s=0.05, **extra))


def mha_host(layout, dtype=torch.bfloat16, tokens=DEVICE_TOKENS):
    dev = MHATokenToKVPool(size=tokens, page_size=PS, dtype=dtype, head_num=2,
                           head_dim=8, layer_num=3, device="cpu",
                           enable_memory_saver=False, enable_alt_stream=False)
    info = dev.get_device_pool_infos()[0].buffer_info
    with host_memory_budget_scope(1 << 30):
        return MHATokenToKVPoolHost(
            info, 2.0, 0, PS, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=dev.size, start_layer=dev.start_layer,
            end_layer=dev.end_layer)


def mla_host(layout, dtype=torch.bfloat16):
    dev = MLATokenToKVPool(size=DEVICE_TOKENS, page_size=PS, dtype=dtype, kv_lora_rank=16,
                           qk_rope_head_dim=8, layer_num=3, device="cpu",
                           enable_memory_saver=False)
    info = dev.get_device_pool_infos()[0].buffer_info
    with host_memory_budget_scope(1 << 30):
        return MLATokenToKVPoolHost(
            info, 2.0, 0, PS, layout, pin_memory=False, device="cpu",
            override_kv_cache_dim=dev.kv_cache_dim, device_capacity_tokens=dev.size,
            start_layer=dev.start_layer, end_layer=dev.end_layer,
            target_layer_num=dev.layer_num)


def fill_random(host, seed):
    g = torch.Generator().manual_seed(seed)
    b = u8(host.kv_buffer)
    b.copy_(torch.randint(0, 256, (b.numel(),), dtype=torch.uint8, generator=g))


def alloc_pages(host, n, shuffle_seed=None):
    """n whole pages of the host pool (their token indices), in a shuffled
    page order so that neighbouring keys do not sit in neighbouring pages."""
    idx = host.alloc(n * PS)
    assert idx is not None
    pages = list(idx.view(n, PS))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(pages)
    return torch.cat(pages)


def u8(t):
    """Bytes of a tensor: random bytes in bf16 hold NaNs, which torch.equal
    never finds equal."""
    return t.reshape(-1).view(torch.uint8)


def page_bytes(host, start, kv=None):
    """The bytes of the page at token index start, as SGLang's
    get_data_page(flat=True) gives them (of a saved kv_buffer copy when kv
    is given). page_unified pools have no get_data_page: their page is the
    page block kv_buffer[page]."""
    saved = host.kv_buffer
    if kv is not None:
        host.kv_buffer = kv
    try:
        if host.layout == "page_unified":
            return u8(host.kv_buffer[int(start) // PS])
        return u8(host.get_data_page(int(start), flat=True).contiguous())
    finally:
        host.kv_buffer = saved


def set_page(host, start, data):
    """Write a page's bytes back (set_from_flat_data_page where SGLang has it)."""
    if host.layout == "page_unified":
        u8(host.kv_buffer[int(start) // PS]).copy_(data)
    else:
        host.set_from_flat_data_page(int(start), data.view(host.kv_buffer.dtype))


def page_keys(n, seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(1, 150000) for _ in range(n * PS)]
    return get_hash_str(tokens, None, page_size=PS), tokens


def new_store(host, url, **kw):
    s = KVTierStore(config(url, **kw), {})
    s.register_mem_pool_host(host)
    return s


# ------------------------------------------------------------------ keys
def test_keys_equal_sglang_hash():
    rng = random.Random(7)
    for ps in (1, 4, 16, 64):
        tokens = [rng.randrange(0, 1 << 31) for _ in range(ps * 5 + ps // 2)]
        # SGLang hashes a trailing partial page too; kvtier only whole pages,
        # the only ones SGLang stores.
        want = get_hash_str(tokens, None, page_size=ps)
        got = [k.hex() for k in kvtier.hash_chain(tokens, ps, scheme="sglang")]
        assert len(got) == 5 and len(want) == (6 if ps > 1 else 5), (len(got), len(want))
        want = want[:5]
        assert got == want, (ps, got[:1], want[:1])
        assert [page_key(h) for h in want] == kvtier.hash_chain(tokens, ps, scheme="sglang")
        tokens = tokens[:5 * ps]
        # A chain continued from a prior page hash.
        more = [rng.randrange(0, 1 << 31) for _ in range(ps * 3)]
        want2 = get_hash_str(more, want[-1], page_size=ps)
        got2 = kvtier.hash_chain(more, ps, scheme="sglang", parent=bytes.fromhex(want[-1]))
        assert [k.hex() for k in got2] == want2
        # The keys the controller queries: get_storage_hash_str (a plain token
        # list: no namespace seed), and a salted request (seeded chain).
        assert get_storage_hash_str(tokens, None, page_size=ps) == want
        seed = storage_namespace_seed("lora-a", "salt-1")
        want3 = get_hash_str(tokens, seed, page_size=ps)
        got3 = kvtier.hash_chain(tokens, ps, scheme="sglang", parent=bytes.fromhex(seed))
        assert [k.hex() for k in got3] == want3 and want3 != want
    # Keys that are not 64 hex digits (sidecar pools, tests) are hashed.
    assert page_key("abc") == page_key("abc") != page_key("abd")
    assert len(page_key("x" * 64)) == 32


# ------------------------------------------------------- v1 round trips
def roundtrip(host, url, seed):
    fill_random(host, seed)
    s = new_store(host, url, mla=isinstance(host, MLATokenToKVPoolHost))
    n = 5
    keys, _ = page_keys(n, seed)
    src = alloc_pages(host, n, shuffle_seed=seed)
    assert s.batch_exists(keys) == 0
    assert s.batch_set_v1(keys, src) == [True] * n
    assert s.batch_exists(keys) == n
    # The stored chunk is the page as SGLang's own get_data_page sees it.
    with kvtier.Client(url) as c:
        for i, k in enumerate(keys):
            chunk = c.get_copy(s.ns, page_key(k))
            assert chunk == bytes(page_bytes(host, src[i * PS]).numpy()), (host.layout, i)
    dst = alloc_pages(host, n, shuffle_seed=seed + 1)
    for i in range(n):   # the destination pages hold something else first
        assert not torch.equal(page_bytes(host, src[i * PS]), page_bytes(host, dst[i * PS]))
    before = u8(host.kv_buffer).clone()
    assert s.batch_get_v1(keys, dst) == [True] * n
    for i in range(n):
        assert torch.equal(page_bytes(host, src[i * PS]), page_bytes(host, dst[i * PS])), i
    # Nothing outside the destination pages changed.
    after = u8(host.kv_buffer).clone()
    saved = before.view(host.kv_buffer.dtype).view(host.kv_buffer.shape)
    for i in range(n):
        set_page(host, dst[i * PS], page_bytes(host, dst[i * PS], kv=saved).clone())
    assert torch.equal(before, u8(host.kv_buffer))
    u8(host.kv_buffer).copy_(after)
    # Leading hits: the 4th page gone -> 3 of 5; none -> 0.
    assert s.delete([keys[3]]) == 1
    assert s.batch_exists(keys) == 3
    assert s.batch_get_v1(keys, dst) == [True, True, True, False, False]
    other, _ = page_keys(n, seed + 100)
    assert s.batch_exists(other) == 0
    assert s.batch_get_v1(other, dst) == [False] * n
    # Setting again: the present pages are kept, the missing one is added.
    assert s.batch_set_v1(keys, src) == [True] * n
    assert s.batch_exists(keys) == n
    if host.layout != "page_unified":
        legacy(s, host, keys, other, src, dst, seed)
    st = s.stats
    assert st["errors"] == 0 and st["get_corrupt"] == 0, st
    m = s.get_stats()
    assert sum(m.backup_pgs) >= n and sum(m.prefetch_pgs) >= n, m
    s.close()
    host.free(src)
    host.free(dst)
    return s.ns


def legacy(s, host, keys, other, src, dst, seed):
    """SGLang's legacy calls (interface_v1 off) read and write the same chunks."""
    page = s.get(keys[0], host.get_dummy_flat_data_page())
    assert page is not None and torch.equal(page.view(torch.uint8),
                                            page_bytes(host, src[0]))
    assert s.exists(keys[4]) and not s.exists(other[0])
    lk, _ = page_keys(2, seed + 200)
    assert s.batch_set(lk, [host.get_data_page(int(src[0])), host.get_data_page(int(src[PS]))])
    assert s.batch_exists(lk) == 2
    assert s.batch_get_v1(lk, dst[:2 * PS]) == [True, True]
    assert torch.equal(page_bytes(host, dst[0]), page_bytes(host, src[0]))
    assert torch.equal(page_bytes(host, dst[PS]), page_bytes(host, src[PS]))


def test_mha_layouts(url):
    seen = set()
    for i, layout in enumerate(MHA_LAYOUTS):
        host = mha_host(layout)
        ns = roundtrip(host, url, 10 + i)
        assert ns.startswith("sglang/test-org/tiny-model/bfloat16/") and \
            ns.endswith("/tp1r0"), ns
        seen.add(ns)
    assert len(seen) == len(MHA_LAYOUTS), seen   # layouts never share chunks


def test_mla_layouts(url):
    seen = set()
    for i, layout in enumerate(MLA_LAYOUTS):
        host = mla_host(layout)
        ns = roundtrip(host, url, 20 + i)
        assert ns.endswith("/mla"), ns
        seen.add(ns)
    assert len(seen) == len(MLA_LAYOUTS), seen


def test_namespaces(url):
    host = mha_host("page_first")
    a = new_store(host, url, tp_rank=0, tp_size=2)
    b = new_store(host, url, tp_rank=1, tp_size=2)
    assert a.ns.endswith("/tp2r0") and b.ns.endswith("/tp2r1")
    assert a.ns.rsplit("/", 1)[0] == b.ns.rsplit("/", 1)[0]
    fp = new_store(mha_host("page_first", torch.float16), url)
    assert "/float16/" in fp.ns
    mla = new_store(mla_host("page_first"), url, mla=True)
    assert mla.ns.endswith("/mla")
    own = KVTierStore(config(url, namespace="team/llama"), {})
    own.register_mem_pool_host(host)
    assert own.ns.startswith("team/llama/bfloat16/")
    # A page written by rank 0 is not seen by rank 1 (its heads differ).
    fill_random(host, 5)
    keys, _ = page_keys(2, 5)
    idx = alloc_pages(host, 2)
    assert a.batch_set_v1(keys, idx) == [True, True]
    assert a.batch_exists(keys) == 2 and b.batch_exists(keys) == 0
    for s in (a, b, fp, mla, own):
        s.close()
    host.free(idx)


def test_mla_writer_and_reader(url):
    host0, host1 = mla_host("page_first"), mla_host("page_first")
    fill_random(host0, 31)
    fill_random(host1, 32)
    w = new_store(host0, url, tp_rank=0, tp_size=2, mla=True)
    r = new_store(host1, url, tp_rank=1, tp_size=2, mla=True)
    assert w.writer and not r.writer and w.ns == r.ns
    keys, _ = page_keys(4, 33)
    i0, i1 = alloc_pages(host0, 4), alloc_pages(host1, 4, shuffle_seed=3)
    # The reader rank's backup stores nothing (and says so without failing).
    assert r.batch_set_v1(keys, i1) == [True] * 4
    assert r.batch_set(keys[:1], [host1.get_data_page(int(i1[0]))])
    assert r.batch_exists(keys) == 0 and w.batch_exists(keys) == 0
    assert r.stats["set_skipped_writer"] == 5
    assert w.batch_set_v1(keys, i0) == [True] * 4
    assert r.batch_exists(keys) == 4
    assert r.batch_get_v1(keys, i1) == [True] * 4
    for i in range(4):
        assert torch.equal(page_bytes(host0, i0[i * PS]), page_bytes(host1, i1[i * PS]))
    r.clear()                           # not the writer: leaves the shared pages
    assert w.batch_exists(keys) == 4
    w.clear()
    assert r.batch_exists(keys) == 0
    w.close()
    r.close()


def test_mla_dcp(url):
    """MLA with decode context parallelism (DCP 2 of TP 4): a logical page
    of 2*PS slots is PS physical rows on each DCP rank; each DCP shard has
    its namespace, written by its rank in the first DCP group and read by
    the same shard's rank in the other group."""
    def host(dcp_rank):
        dev = MLATokenToKVPool(size=DEVICE_TOKENS, page_size=2 * PS, dtype=torch.bfloat16,
                               kv_lora_rank=16, qk_rope_head_dim=8, layer_num=3,
                               device="cpu", enable_memory_saver=False)
        info = dev.get_device_pool_infos()[0].buffer_info
        with host_memory_budget_scope(1 << 30):
            return MLATokenToKVPoolHost(
                info, 2.0, 0, 2 * PS, "page_first", pin_memory=False, device="cpu",
                override_kv_cache_dim=dev.kv_cache_dim, device_capacity_tokens=dev.size,
                start_layer=dev.start_layer, end_layer=dev.end_layer,
                target_layer_num=dev.layer_num, dcp_size=2, dcp_rank=dcp_rank)

    def store(h, tp_rank):
        cfg = config(url, tp_rank=tp_rank, tp_size=4, mla=True)
        cfg.dcp_size, cfg.dcp_rank, cfg.logical_page_size = 2, tp_rank % 2, 2 * PS
        cfg.__post_init__()
        s = KVTierStore(cfg, {})
        s.register_mem_pool_host(h)
        return s

    hosts = [host(r % 2) for r in range(4)]
    stores = [store(hosts[r], r) for r in range(4)]
    assert [s.writer for s in stores] == [True, True, False, False]
    assert stores[0].ns.endswith("/mladcp2r0") and stores[1].ns.endswith("/mladcp2r1")
    assert stores[2].ns == stores[0].ns and stores[3].ns == stores[1].ns
    keys, _ = page_keys(3, 97)
    lp = 2 * PS
    idx = [h.alloc(3 * lp) for h in hosts]
    for r in range(4):
        fill_random(hosts[r], 970 + r)
        assert stores[r].batch_set_v1(keys, idx[r]) == [True] * 3
    for r in range(4):
        assert stores[r].batch_exists(keys) == 3
        dst = hosts[r].alloc(3 * lp)
        assert stores[r].batch_get_v1(keys, dst) == [True] * 3
        writer = r % 2
        for i in range(3):
            want = page_bytes(hosts[writer], idx[writer][i * lp])
            assert torch.equal(page_bytes(hosts[r], dst[i * lp]), want), (r, i)
    for s in stores:
        s.close()


def test_corrupt_chunk_is_a_miss(url):
    host = mha_host("layer_first")
    fill_random(host, 41)
    s = new_store(host, url)
    keys, _ = page_keys(4, 41)
    src, dst = alloc_pages(host, 4), alloc_pages(host, 4, shuffle_seed=4)
    assert s.batch_set_v1(keys, src) == [True] * 4
    # Flip bytes of the third chunk in kvtier's pool after its commit.
    with kvtier.Client(url) as c:
        with c.get(s.ns, [page_key(keys[2])]) as g:
            assert len(g) == 1 and g.verify(0)
            buf = (ctypes.c_char * len(g.views[0])).from_address(g.addresses[0])
            buf[100] = bytes([buf[100][0] ^ 0xFF])
            assert not g.verify(0)
        # A chunk of the wrong size under the fourth key.
        c.delete(s.ns, [page_key(keys[3])])
        c.put(s.ns, [page_key(keys[3])], [b"\x01" * 64])
    dst_before = [page_bytes(host, dst[i * PS]).clone() for i in range(4)]
    assert s.batch_get_v1(keys, dst) == [True, True, False, False]
    assert s.stats["get_corrupt"] == 2
    assert torch.equal(page_bytes(host, dst[2 * PS]), dst_before[2])   # left alone
    assert torch.equal(page_bytes(host, dst[0]), page_bytes(host, src[0]))
    assert s.get(keys[2], host.get_dummy_flat_data_page()) is None
    # With verify off the flipped chunk would load: verify is what caught it.
    nv = KVTierStore(config(url, verify=False), {})
    nv.register_mem_pool_host(host)
    assert nv.batch_get_v1(keys[:3], dst[:3 * PS]) == [True, True, True]
    assert not torch.equal(page_bytes(host, dst[2 * PS]), page_bytes(host, src[2 * PS]))
    s.close()
    nv.close()


def test_bad_indices_and_layouts(url):
    host = mha_host("page_first_direct")
    s = new_store(host, url)
    keys, _ = page_keys(2, 51)
    idx = alloc_pages(host, 2)
    assert s.batch_set_v1(keys, idx[:PS]) == [False, False]          # too few indices
    bad = idx.clone()
    bad[PS:] += 1                                                    # page not aligned
    assert s.batch_set_v1(keys, bad) == [True, False]
    assert s.batch_exists(keys) == 1
    assert s.batch_get_v1(keys, bad) == [True, False]
    assert s.batch_exists([]) == 0 and s.batch_get_v1([], idx[:0]) == []
    s.close()
    # An unsupported layout is refused when SGLang registers the pool:
    # page_first_kv_split, which SGLang builds only over an NPU's split MLA
    # buffers -- here a real page_first MLA pool RELABELLED as such.
    split = mla_host("page_first")
    split.layout = "page_first_kv_split"
    st = KVTierStore(config(url, mla=True), {})
    try:
        st.register_mem_pool_host(split)
        raise AssertionError("page_first_kv_split accepted")
    except ValueError as e:
        assert "page_first_kv_split" in str(e) and "layer_first" in str(e), e
    # Before registration the data calls fail softly.
    st2 = KVTierStore(config(url), {})
    assert st2.batch_exists(keys) == 0
    assert st2.batch_get_v1(keys, idx) == [False, False]
    assert st2.batch_set_v1(keys, idx) == [False, False]
    host.free(idx)


def test_dynamic_loader(url):
    host = mha_host("page_first")
    cfg = config(url)
    s = StorageBackendFactory.create_backend("dynamic", cfg, host)
    assert type(s) is KVTierStore, type(s)
    s.register_mem_pool_host(host)      # what the controller does next
    assert cfg.extra_config["interface_v1"] == 1
    fill_random(host, 61)
    keys, _ = page_keys(3, 61)
    idx = alloc_pages(host, 3)
    assert s.batch_set_v1(keys, idx) == [True] * 3
    assert s.batch_exists(keys) == 3
    s.close()
    host.free(idx)


def controller_stand_in(store, host):
    """CONTROLLER STAND-IN: the attributes HiCacheController's storage
    methods read, with its real methods bound as the v1 page functions the
    controller picks for a dynamic backend with interface_v1."""
    c = types.SimpleNamespace(storage_backend=store, page_size=PS, mem_pool_host=host,
                              storage_host_pool=host, prefetch_sync_queue=queue.Queue())
    c.page_get_func = types.MethodType(HiCacheController._page_get_zero_copy, c)
    c.page_set_func = types.MethodType(HiCacheController._page_set_zero_copy, c)
    c._page_transfer_kv_batch = types.MethodType(
        HiCacheController._page_transfer_kv_batch, c)
    return c


def test_controller_calls(url):
    """Backup, hit query and prefetch transfer through the controller's own
    code (STAND-IN object, real methods), over 300 pages (3 storage batches)."""
    host = mha_host("page_first", tokens=2048)
    fill_random(host, 71)
    store = StorageBackendFactory.create_backend("dynamic", config(url), host)
    store.register_mem_pool_host(host)
    ctl = controller_stand_in(store, host)
    n = 300
    rng = random.Random(71)
    tokens = [rng.randrange(1, 150000) for _ in range(n * PS)]
    hashes = get_storage_hash_str(tokens, None, page_size=PS)
    src = alloc_pages(host, n, shuffle_seed=71)
    op = StorageOperation(src, tokens, hash_value=hashes, prefix_keys=[])
    HiCacheController._page_backup(ctl, op)
    assert op.completed_tokens == n * PS, op.completed_tokens
    # The chain was stored with its parents: what kvtier itself computes.
    assert store.batch_exists([k.hex() for k in kvtier.hash_chain(tokens, PS,
                                                                  scheme="sglang")]) == n
    # A prompt that shares the first 200 pages, then differs.
    tokens2 = tokens[:200 * PS] + [7] * (50 * PS)
    pop = PrefetchOperation("req-1", tokens2, last_hash=None, prefix_keys=[])
    hit_hashes, hit_tokens = HiCacheController._storage_hit_query(ctl, pop)
    assert hit_tokens == 200 * PS and hit_hashes == hashes[:200]
    pop.hash_value = hit_hashes
    host.free(src[200 * PS:])
    pop.host_indices = alloc_pages(host, 200, shuffle_seed=72)
    assert HiCacheController._page_transfer(ctl, pop) == 200
    assert pop.is_terminated() is False
    for i in range(0, 200, 17):
        assert torch.equal(page_bytes(host, src[i * PS]),
                           page_bytes(host, pop.host_indices[i * PS])), i
    acks = []
    while not ctl.prefetch_sync_queue.empty():
        acks.append(ctl.prefetch_sync_queue.get())
    assert acks[-1].completed_tokens == 200 * PS, [a.completed_tokens for a in acks]
    # extra_info reached the backend: prefix keys of the later batches.
    ei = HiCacheStorageExtraInfo(prefix_keys=hashes[:128])
    assert store.batch_exists(hashes[128:200], ei) == 72
    store.close()


def test_threads(url):
    """The controller's three storage threads at once (backup, hit query,
    prefetch I/O): each gets its own connection; nothing is lost."""
    import threading
    host = mha_host("layer_first", tokens=1024)
    fill_random(host, 91)
    s = new_store(host, url)
    groups = [page_keys(8, 900 + g)[0] for g in range(12)]
    src = [alloc_pages(host, 8, shuffle_seed=g) for g in range(12)]
    dst = alloc_pages(host, 8)
    errors = []

    def setter():
        for g in range(12):
            if s.batch_set_v1(groups[g], src[g]) != [True] * 8:
                errors.append(("set", g))

    def checker():
        for _ in range(60):
            for g in range(12):
                if s.batch_exists(groups[g]) not in (0, 8):
                    errors.append(("exists", g))

    def getter():
        for _ in range(5):
            for g in range(12):
                r = s.batch_get_v1(groups[g], dst)
                if r not in ([True] * 8, [False] * 8):
                    errors.append(("get", g, r))

    ts = [threading.Thread(target=f) for f in (setter, checker, getter)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[:5]
    assert len(s.conns.all) == 3 and s.stats["errors"] == 0
    for g in range(12):
        assert s.batch_get_v1(groups[g], dst) == [True] * 8
        for i in range(8):
            assert torch.equal(page_bytes(host, src[g][i * PS]), page_bytes(host, dst[i * PS]))
    s.close()


def test_daemon_killed_and_restarted():
    d = Daemon().start()
    try:
        host = mha_host("layer_first")
        fill_random(host, 81)
        s = new_store(host, d.url)
        keys, _ = page_keys(3, 81)
        idx, dst = alloc_pages(host, 3), alloc_pages(host, 3, shuffle_seed=8)
        assert s.batch_set_v1(keys, idx) == [True] * 3
        d.kill()
        # Every call fails softly, more than once (cached client, then reconnects).
        for _ in range(3):
            assert s.batch_exists(keys) == 0
            assert s.batch_get_v1(keys, dst) == [False] * 3
            assert s.batch_set_v1(keys, idx) == [False] * 3
            assert s.get(keys[0], host.get_dummy_flat_data_page()) is None
            assert s.batch_get(keys) == [None] * 3
            assert s.batch_set(keys[:1], [host.get_data_page(int(idx[0]))]) is False
            assert not s.exists(keys[0])
            assert s.delete(keys) == 0
            s.clear()
            time.sleep(0.06)
        assert s.stats["errors"] >= 9
        # A restarted kvtierd on the same socket is used again (with the
        # pages it recovered from its pool file, or without them).
        d.start()
        time.sleep(0.1)
        assert s.batch_exists(keys) in (0, 3)
        assert s.batch_set_v1(keys, idx) == [True] * 3
        assert s.batch_get_v1(keys, dst) == [True] * 3
        assert torch.equal(page_bytes(host, idx[PS]), page_bytes(host, dst[PS]))
        s.close()
    finally:
        d.cleanup()


def test_remote_daemon_copies():
    """A kvtierd reached over tcp:// (pool not mapped): the same calls work
    through copying PUT / GET, and the chunks are the same bytes."""
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    tcp = "tcp://127.0.0.1:%d" % port
    with Daemon(args=["--tcp", tcp, "--tcp-insecure", "1"]) as d:
        host = mla_host("layer_first")
        fill_random(host, 95)
        s = new_store(host, tcp, mla=True)
        local = new_store(host, d.url, mla=True)
        assert s.ns == local.ns
        assert not s._client().zero_copy and local._client().zero_copy
        keys, _ = page_keys(3, 95)
        src, dst = alloc_pages(host, 3, shuffle_seed=1), alloc_pages(host, 3, shuffle_seed=2)
        assert s.batch_set_v1(keys, src) == [True] * 3
        assert s.batch_exists(keys) == 3 and local.batch_exists(keys) == 3
        assert s.batch_get_v1(keys, dst) == [True] * 3
        for i in range(3):
            assert torch.equal(page_bytes(host, src[i * PS]), page_bytes(host, dst[i * PS]))
        # Written remotely, read locally zero-copy (and the other way).
        dst2 = alloc_pages(host, 3)
        assert local.batch_get_v1(keys, dst2) == [True] * 3
        assert torch.equal(page_bytes(host, src[2 * PS]), page_bytes(host, dst2[2 * PS]))
        assert local.delete([keys[1]]) == 1
        assert s.batch_get_v1(keys, dst) == [True, False, False]
        # A chunk corrupted in the pool is a miss over tcp:// too.
        with kvtier.Client(d.url) as c, c.get(s.ns, [page_key(keys[2])]) as g:
            buf = (ctypes.c_char * len(g.views[0])).from_address(g.addresses[0])
            buf[7] = bytes([buf[7][0] ^ 0x55])
        assert s.batch_get_v1([keys[0], keys[2]], dst[:2 * PS]) == [True, False]
        assert s.stats["get_corrupt"] == 1
        page = s.get(keys[0], host.get_dummy_flat_data_page())
        assert page is not None and torch.equal(u8(page), page_bytes(host, src[0]))
        s.close()
        local.close()


def main():
    R.run(test_keys_equal_sglang_hash)
    with Daemon(pool="256M") as d:
        for t in (test_mha_layouts, test_mla_layouts, test_namespaces,
                  test_mla_writer_and_reader, test_mla_dcp, test_corrupt_chunk_is_a_miss,
                  test_bad_indices_and_layouts, test_dynamic_loader,
                  test_controller_calls, test_threads):
            R.run(t, d.url)
    R.run(test_remote_daemon_copies)
    R.run(test_daemon_killed_and_restarted)
    R.finish()


if __name__ == "__main__":
    main()
