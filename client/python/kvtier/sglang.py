"""kvtier as an SGLang HiCache storage backend: `kvtier.sglang:KVTierStore`.

    python -m sglang.launch_server --model-path ... --enable-hierarchical-cache \
      --hicache-storage-backend dynamic \
      --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KVTierStore",
        "interface_v1": 1, "socket": "ipc:///run/kvtier/kvtierd.sock"}'

Design: SGLang's cache controller asks its storage backend three things, in
this order: batch_exists(page keys) on the prefetch thread (how many leading
pages of a prompt are stored: one kvtier LOOKUP), batch_get_v1(keys, host
indices) on the prefetch I/O thread (fill host-pool pages: one kvtier GET,
then one torch copy per page from the pinned pool chunk into the page) and
batch_set_v1(keys, host indices) on the backup thread (one PUT_BEGIN, one
torch copy per page from the host pool into the reserved chunk, one
PUT_COMMIT). "interface_v1": 1 selects these zero-copy calls; without it
SGLang falls back to the legacy get/set calls, which this class serves as
well (with copies) and which read and write the same chunks.

One SGLang page is one kvtier chunk. Its bytes are the page's bytes in the
host pool's own order -- exactly what the pool's get_data_page(flat=True)
returns, so every layout reads back bit-exact and the legacy calls share
chunks with the v1 calls ("page_unified" pools have no get_data_page: a
page is their page block). Supported host pools: MHATokenToKVPoolHost with
equal K/V head dims ("layer_first", "page_first", "page_first_direct",
"page_head", "page_unified") and MLATokenToKVPoolHost ("layer_first",
"page_first", "page_first_direct", "page_unified"); anything else is
refused at registration with an error that names it. Pages are addressed
through tensor views of the pool's kv_buffer (no pointer arithmetic, no
Python loop over tokens). SGLang's batch_*_v2 calls (hybrid models' extra
pools: Mamba, SWA, DSA indexer) are not implemented.

Keys: SGLang's page keys are the hex of its chained SHA-256 page hashes,
which kvtier's "sglang" key scheme computes too (kvtier.hash_chain(tokens,
page_size, scheme="sglang")), so a 64-hex key is used as the 32-byte
kvtier key as is; any other string is hashed with SHA-256.

Namespaces: `<namespace>/<dtype>/<shape hash>/<who>`: the shape hash covers
the pool kind, layout, page size, layers, heads, head dims and dtype, so
incompatible pools never share a chunk; who is "tp<size>r<rank>" for MHA
(each rank its own heads) and "mla" for MLA, whose KV every TP rank holds
whole: only the storage writer (TP rank 0, or the first DCP group) stores,
every rank reads. Pipeline and attention-context parallel ranks get their
own suffix.

Failures: no exception ever reaches SGLang from the data calls. A daemon
that is down or restarting makes lookups report 0 pages, gets and sets
report False; the connection is re-opened at most every reconnect_s, so a
restarted kvtierd is used again without restarting SGLang. A chunk whose
checksum fails (verify) or whose size is not the page size is a miss.

Settings (the extra config, next to backend_name etc.): socket (default
$KVTIER_SOCKET), namespace (default "sglang/<model>"), verify (true:
checksum each chunk before it reaches the host pool; a tcp:// kvtierd,
whose pool is not mapped, is served by copying calls, which libkvtier
always checks), timeout_ms (10000), reconnect_s (0.5).
"""
import ctypes
import hashlib
import logging
import os
import time

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from .client import Connections, Err, KVTierError

log = logging.getLogger("kvtier.sglang")

CHUNK_FORMAT = "kvtier-sglang-page-1"

_MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head",
                "page_unified")
_MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_unified")


def page_key(key):
    """SGLang page key (hex string) -> the 32-byte kvtier key."""
    if isinstance(key, (bytes, bytearray)) and len(key) == 32:
        return bytes(key)
    if isinstance(key, str) and len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    s = key if isinstance(key, (bytes, bytearray)) else str(key).encode()
    return hashlib.sha256(s).digest()


def _flag(v):
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _pool_tensor(addr, n):
    return torch.frombuffer((ctypes.c_char * n).from_address(addr), dtype=torch.uint8)


class PageMap:
    """Where each page of an SGLang host pool lives, as uint8 tensor views.

    view: kv_buffer seen as bytes, reshaped so that one dimension (dim)
    runs over token slots (by_page False: a page is page_size slots from
    its first one) or over pages (by_page True: a page is one index).
    page(start) is the view of the page whose first physical slot is start:
    a strided view for layer_first pools, contiguous ones for the others."""

    def __init__(self, pool):
        kind = self.kind_of(pool)
        layout = getattr(pool, "layout", None)
        kv = getattr(pool, "kv_buffer", None)
        if kv is None or not isinstance(kv, torch.Tensor):
            raise NotImplementedError(
                "kvtier: host pool %s has no single kv_buffer tensor (allocator-only "
                "or multi-buffer pool); only MHA and MLA KV host pools are supported"
                % type(pool).__name__)
        if not kv.is_contiguous():
            raise NotImplementedError("kvtier: host pool %s kv_buffer is not contiguous"
                                      % type(pool).__name__)
        ps = int(pool.page_size)
        u8 = kv.view(-1).view(torch.uint8)
        supported = _MHA_LAYOUTS if kind == "mha" else _MLA_LAYOUTS
        if layout not in supported:
            raise ValueError(
                "kvtier: %s host pool layout %r is not supported; use one of %s "
                "(--hicache-mem-layout)" % (kind.upper(), layout, ", ".join(supported)))
        if kind == "mha":
            if layout == "layer_first":     # [2, layer, slot, head, dim]
                view, dim, by_page = u8.view(2, kv.shape[1], kv.shape[2], -1), 2, False
            elif layout == "page_first":    # [2, slot, layer, head, dim]
                view, dim, by_page = u8.view(2, kv.shape[1], -1), 1, False
            elif layout == "page_unified":  # [page, ...]: one block a page
                view, dim, by_page = u8.view(kv.shape[0], -1), 0, True
            else:                           # [2, page, ...]
                view, dim, by_page = u8.view(2, kv.shape[1], -1), 1, True
        else:
            if layout == "layer_first":     # [layer, slot, 1, dim]
                view, dim, by_page = u8.view(kv.shape[0], kv.shape[1], -1), 1, False
            else:                           # [slot, ...] or [page, ...]
                view, dim, by_page = u8.view(kv.shape[0], -1), 0, layout != "page_first"
        self.pool, self.kind, self.layout = pool, kind, layout
        self.view, self.dim, self.by_page, self.page_size = view, dim, by_page, ps
        self.dcp = int(getattr(pool, "dcp_size", 1) or 1)
        self.logical_page = ps * self.dcp
        self.slots = view.shape[dim] * (ps if by_page else 1)
        p0 = self.page(0)
        self.page_shape = tuple(p0.shape)
        self.page_bytes = p0.numel()
        self.dtype = pool.dtype

    @staticmethod
    def kind_of(pool):
        name = type(pool).__name__
        mla_cls = mha_cls = None
        try:
            from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost as mla_cls
            from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost as mha_cls
        except Exception:
            pass
        if mla_cls is not None and isinstance(pool, mla_cls):
            return "mla"
        if mha_cls is not None and isinstance(pool, mha_cls) or \
                mha_cls is None and hasattr(pool, "head_num") and hasattr(pool, "v_head_dim"):
            if getattr(pool, "head_dim", None) != getattr(pool, "v_head_dim", None):
                raise NotImplementedError(
                    "kvtier: %s has different K and V head dims; not supported" % name)
            return "mha"
        if mla_cls is None and hasattr(pool, "kv_lora_rank"):
            return "mla"
        raise NotImplementedError("kvtier: host pool %s is neither an MHA nor an MLA "
                                  "KV host pool" % name)

    def shape_tag(self):
        p = self.pool
        parts = [CHUNK_FORMAT, type(p).__name__, self.kind, self.layout,
                 "ps%d" % self.page_size, "dcp%d" % self.dcp, str(self.dtype),
                 "L%s" % getattr(p, "layer_num", "?"), "pb%d" % self.page_bytes,
                 "fmt%s" % getattr(p, "storage_format_tag", None)]
        if self.kind == "mha":
            parts += ["H%s" % p.head_num, "D%s" % p.head_dim, "V%s" % p.v_head_dim,
                      "G%s" % getattr(p, "head_group_num", 1)]
        else:
            parts += ["R%s" % getattr(p, "kv_lora_rank", "?"),
                      "P%s" % getattr(p, "qk_rope_head_dim", "?"),
                      "K%s" % getattr(p, "kv_cache_dim", "?")]
        return "|".join(parts)

    def page(self, start):
        if self.by_page:
            return self.view.narrow(self.dim, start // self.page_size, 1)
        return self.view.narrow(self.dim, start, self.page_size)

    def starts(self, host_indices, n):
        """Physical first slot of each of the n pages host_indices names; None
        for a page whose slots are not one whole page of the pool."""
        idx = host_indices
        if not isinstance(idx, torch.Tensor):
            idx = torch.as_tensor(idx)
        idx = idx.reshape(-1).to("cpu", torch.int64)
        lp = self.logical_page
        if idx.numel() != n * lp:
            raise ValueError("kvtier: %d host indices for %d pages of %d slots"
                             % (idx.numel(), n, lp))
        rows = idx.view(n, lp)
        first = rows[:, 0]
        ok = (rows - first[:, None] == torch.arange(lp)).all(1)
        ok &= first >= 0
        if self.by_page or self.dcp > 1:
            ok &= first % lp == 0
        phys = first // self.dcp
        ok &= phys + self.page_size <= self.slots
        return [int(s) if good else None for s, good in zip(phys.tolist(), ok.tolist())]


class KVTierStore(HiCacheStorage):
    """SGLang HiCache storage backed by the node's kvtierd (see the module
    docstring). Constructed by SGLang's dynamic backend loader as
    KVTierStore(storage_config, kwargs)."""

    def __init__(self, storage_config, kwargs=None, **kw):
        cfg = storage_config
        extra = dict(getattr(cfg, "extra_config", None) or {})
        if isinstance(kwargs, dict):
            extra.update({k: v for k, v in kwargs.items() if k not in extra})
        extra.update(kw)
        self.storage_config = cfg
        self.extra = extra
        self.url = extra.get("socket") or extra.get("url") or os.environ.get("KVTIER_SOCKET")
        self.verify = _flag(extra.get("verify", True))
        self.timeout_ms = int(extra.get("timeout_ms", 10000))
        self.reconnect_s = float(extra.get("reconnect_s", 0.5))
        self.tp_rank = int(getattr(cfg, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(cfg, "tp_size", 1) or 1)
        self.is_mla = bool(getattr(cfg, "is_mla_model", False))
        try:
            self.writer = bool(cfg.is_storage_writer)
        except AttributeError:
            self.writer = not self.is_mla or self.tp_rank == 0
        if getattr(cfg, "should_split_heads", False):
            log.warning("kvtier: should_split_heads (heterogeneous TP) is not supported; "
                        "pages are stored per rank")
        self.metrics = bool(getattr(cfg, "enable_storage_metrics", False))
        self.conns = Connections(self.url, self.timeout_ms, self.reconnect_s)
        self.mem_pool_host = None
        self.pages = None
        self.ns = None
        self.stats = {"exists_calls": 0, "exists_hits": 0, "get_pages": 0,
                      "get_hits": 0, "get_corrupt": 0, "set_pages": 0, "set_new": 0,
                      "set_skipped_writer": 0, "errors": 0}
        self._m = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                   "backup_bandwidth": []}
        self._down_logged = False
        log.info("kvtier store: socket %s, tp %d/%d, %s, writer %s",
                 self.url or "$KVTIER_SOCKET", self.tp_rank, self.tp_size,
                 "MLA" if self.is_mla else "MHA", self.writer)

    # -------------------------------------------------------- setup
    def namespace(self, pages):
        cfg = self.storage_config
        base = self.extra.get("namespace")
        if not base:
            model = str(getattr(cfg, "model_name", None) or "model").rstrip("/")
            if model.startswith(("/", ".", "~")):
                model = os.path.basename(model) or "model"
            base = "sglang/" + model
        base = base[:160]
        h = hashlib.sha256(pages.shape_tag().encode()).hexdigest()[:12]
        dt = str(pages.dtype).replace("torch.", "")
        if pages.kind == "mla":
            who = "mla"
            dcp = int(getattr(cfg, "dcp_size", 1) or 1)
            if dcp > 1:
                who += "dcp%dr%d" % (dcp, int(getattr(cfg, "dcp_rank", 0)))
        else:
            who = "tp%dr%d" % (self.tp_size, self.tp_rank)
        pp = int(getattr(cfg, "pp_size", 1) or 1)
        if pp > 1:
            who += "pp%dr%d" % (pp, int(getattr(cfg, "pp_rank", 0)))
        cp = int(getattr(cfg, "attn_cp_size", 1) or 1)
        if cp > 1:
            who += "cp%dr%d" % (cp, int(getattr(cfg, "attn_cp_rank", 0)))
        return "%s/%s/%s/%s" % (base, dt, h, who)

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self.pages = PageMap(mem_pool_host)
        self.ns = self.namespace(self.pages)
        log.info("kvtier store: namespace %s, %s %s pool, %d-byte pages",
                 self.ns, self.pages.kind.upper(), self.pages.layout,
                 self.pages.page_bytes)

    # ------------------------------------------------------ helpers
    def _client(self):
        c = self.conns.get()
        if self._down_logged:
            log.info("kvtier store: kvtierd reachable again")
            self._down_logged = False
        return c

    def _fail(self, what, e):
        self.stats["errors"] += 1
        self.conns.failed(e)
        if isinstance(e, KVTierError) and e.err in (Err.ECLOSED, Err.ETIMEDOUT, Err.EPROTO,
                                                     Err.EIO):
            if not self._down_logged:
                log.warning("kvtier store: %s failed, kvtierd unreachable: %s", what, e)
                self._down_logged = True
        else:
            log.warning("kvtier store: %s failed: %s", what, e)

    def _release(self, lease):
        try:
            lease.release()
        except Exception as e:
            self._fail("release", e)

    @staticmethod
    def _parent(extra_info):
        pk = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        return page_key(pk[-1]) if pk else None

    def _ready(self, what):
        if self.pages is None:
            log.warning("kvtier store: %s before register_mem_pool_host", what)
            return False
        return True

    def _metric(self, name, pages, t0):
        if self.metrics and pages:
            dt = max(time.perf_counter() - t0, 1e-9)
            self._m[name + "_pgs"].append(pages)
            self._m[name + "_bandwidth"].append(
                pages * self.pages.page_bytes / dt / (1 << 30))

    # ---------------------------------------------------- v1 calls
    def batch_exists(self, keys, extra_info=None):
        """Number of leading keys stored (one LOOKUP); 0 on any failure."""
        if not keys or self.ns is None:
            return 0
        self.stats["exists_calls"] += 1
        try:
            n, _ = self._client().lookup(self.ns, [page_key(k) for k in keys])
        except Exception as e:
            self._fail("lookup", e)
            return 0
        self.stats["exists_hits"] += n
        return n

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        n = len(keys)
        res = [False] * n
        if not n or not self._ready("batch_get_v1"):
            return res
        t0 = time.perf_counter()
        pm = self.pages
        try:
            starts = pm.starts(host_indices, n)
        except Exception as e:
            self._fail("batch_get_v1", e)
            return res
        self.stats["get_pages"] += n
        kk = [page_key(k) for k in keys]
        try:
            c = self._client()
            if not c.zero_copy:
                return self._get_copies(c, kk, starts)
            lease = c.get(self.ns, kk)
        except Exception as e:
            self._fail("get", e)
            return res
        try:
            for i in range(len(lease)):
                if starts[i] is None:
                    continue
                if len(lease.views[i]) != pm.page_bytes or \
                        (self.verify and not lease.verify(i)):
                    self.stats["get_corrupt"] += 1
                    log.warning("kvtier store: chunk %s unusable (%s), a miss",
                                kk[i].hex()[:16],
                                "size %d" % len(lease.views[i])
                                if len(lease.views[i]) != pm.page_bytes else "checksum")
                    continue
                src = _pool_tensor(lease.addresses[i], pm.page_bytes)
                pm.page(starts[i]).copy_(src.view(pm.page_shape))
                res[i] = True
        except Exception as e:
            self._release(lease)
            self._fail("get copy", e)
            return [False] * n
        self._release(lease)    # the pages are copied: a failed release loses nothing
        self.stats["get_hits"] += sum(res)
        self._metric("prefetch", sum(res), t0)
        return res

    def _get_copies(self, c, kk, starts):
        """Pool not mapped (a remote kvtierd): one copying GET per page."""
        pm = self.pages
        res = [False] * len(kk)
        for i, k in enumerate(kk):
            try:
                data = c.get_copy(self.ns, k, cap=pm.page_bytes)
            except KVTierError as e:
                if e.err not in (Err.ECORRUPT, Err.ETOOBIG):
                    raise
                self.stats["get_corrupt"] += 1
                log.warning("kvtier store: chunk %s unusable (%s), a miss",
                            k.hex()[:16], e.err.name)
                continue
            if data is None:
                break
            if starts[i] is None or len(data) != pm.page_bytes:
                continue
            src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            pm.page(starts[i]).copy_(src.view(pm.page_shape))
            res[i] = True
        self.stats["get_hits"] += sum(res)
        return res

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        n = len(keys)
        if not n:
            return []
        if not self._ready("batch_set_v1"):
            return [False] * n
        if not self.writer:
            self.stats["set_skipped_writer"] += n
            return [True] * n
        t0 = time.perf_counter()
        pm = self.pages
        try:
            starts = pm.starts(host_indices, n)
        except Exception as e:
            self._fail("batch_set_v1", e)
            return [False] * n
        # A page SGLang cannot name whole ends the batch: later pages would
        # be stored without the prefix that makes them reachable.
        good = next((i for i, s in enumerate(starts) if s is None), n)
        res = [True] * good + [False] * (n - good)
        if not good:
            return res
        kk = [page_key(k) for k in keys[:good]]
        self.stats["set_pages"] += good
        try:
            c = self._client()
            parent = self._parent(extra_info)
            if not c.zero_copy:
                bufs = [pm.page(s).contiguous().numpy() for s in starts[:good]]
                self.stats["set_new"] += c.put(self.ns, kk, bufs, parent=parent)
                return res
            lease = c.put_begin(self.ns, kk, [pm.page_bytes] * good, parent=parent)
        except Exception as e:
            self._fail("put", e)
            return [False] * n
        try:
            new = 0
            for i in range(good):
                if lease.exists[i]:
                    continue
                dst = _pool_tensor(lease.addresses[i], pm.page_bytes)
                dst.view(pm.page_shape).copy_(pm.page(starts[i]))
                new += 1
        except Exception as e:
            try:
                lease.abort()
            except Exception:
                pass
            self._fail("put copy", e)
            return [False] * n
        try:
            lease.commit()
        except Exception as e:
            self._fail("put_commit", e)
            return [False] * n
        self.stats["set_new"] += new
        self._metric("backup", good, t0)
        return res

    # ----------------------------------------------- legacy calls
    def exists(self, key):
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        out = self.batch_get([key], [target_location] if target_location is not None
                             else None)
        return out[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Copies of whole pages (get_data_page(flat=True) bytes): into
        target_locations[i] when given, else new tensors of the pool dtype."""
        n = len(keys)
        out = [None] * n
        if not n or self.ns is None:
            return out
        pb = self.pages.page_bytes
        kk = [page_key(k) for k in keys]
        try:
            c = self._client()
            if c.zero_copy:
                lease = c.get(self.ns, kk)
                datas = []
                try:
                    for i in range(len(lease)):
                        if len(lease.views[i]) != pb or \
                                (self.verify and not lease.verify(i)):
                            self.stats["get_corrupt"] += 1
                            break
                        datas.append(_pool_tensor(lease.addresses[i], pb).clone())
                finally:
                    self._release(lease)
            else:
                datas = []
                for k in kk:
                    try:
                        d = c.get_copy(self.ns, k, cap=pb)
                    except KVTierError as e:
                        if e.err not in (Err.ECORRUPT, Err.ETOOBIG):
                            raise
                        self.stats["get_corrupt"] += 1
                        break
                    if d is None or len(d) != pb:
                        break
                    datas.append(torch.frombuffer(bytearray(d), dtype=torch.uint8))
        except Exception as e:
            self._fail("get", e)
            return out
        for i, d in enumerate(datas):
            tgt = target_locations[i] if target_locations is not None and \
                i < len(target_locations) else None
            if tgt is None:
                out[i] = d.view(self.pages.dtype)
                continue
            if not isinstance(tgt, torch.Tensor) or not tgt.is_contiguous() or \
                    tgt.numel() * tgt.element_size() != pb:
                log.warning("kvtier store: get target of the wrong size or layout")
                break
            tgt.view(-1).view(torch.uint8).copy_(d)
            out[i] = tgt
        return out

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Store whole pages given as tensors (get_data_page(flat=True))."""
        n = len(keys)
        if not n:
            return True
        if self.ns is None or values is None or len(values) != n:
            return False
        if not self.writer:
            self.stats["set_skipped_writer"] += n
            return True
        bufs = []
        for v in values:
            if not isinstance(v, torch.Tensor):
                return False
            v = v.detach().contiguous().view(-1)
            if v.device.type != "cpu":
                v = v.cpu()
            if v.numel() * v.element_size() != self.pages.page_bytes:
                log.warning("kvtier store: set value of %d bytes, pages are %d",
                            v.numel() * v.element_size(), self.pages.page_bytes)
                return False
            bufs.append(v.view(torch.uint8).numpy())
        try:
            self.stats["set_new"] += self._client().put(self.ns, [page_key(k) for k in keys],
                                                        bufs)
        except Exception as e:
            self._fail("put", e)
            return False
        self.stats["set_pages"] += n
        return True

    # ---------------------------------------------------- the rest
    def delete(self, keys):
        """Drop pages; how many were stored (0 on failure)."""
        if self.ns is None or not keys:
            return 0
        try:
            return self._client().delete(self.ns, [page_key(k) for k in keys])
        except Exception as e:
            self._fail("delete", e)
            return 0

    def clear(self):
        """Drop this store's namespace (the writer's, for a shared MLA one)."""
        if self.ns is None or not self.writer:
            return
        try:
            n = self._client().clear(self.ns)
            log.info("kvtier store: cleared %d chunks of %s", n, self.ns)
        except Exception as e:
            self._fail("clear", e)

    def get_stats(self):
        """SGLang's StorageMetrics (pages and GB/s of loads and backups since
        the last call) when storage metrics are on, else None."""
        if not self.metrics:
            return None
        m = {k: list(v) for k, v in self._m.items()}
        for v in self._m.values():
            v.clear()
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except Exception:
            return m
        out = StorageMetrics()
        for k, v in m.items():
            getattr(out, k).extend(v)
        return out

    def close(self):
        self.conns.close()
