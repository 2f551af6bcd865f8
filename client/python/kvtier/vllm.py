"""kvtier as a vLLM KV connector: `kvtier.vllm:KVTierConnector`.

    --kv-transfer-config '{"kv_connector": "KVTierConnector",
      "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"socket": "ipc:///run/kvtier/kvtierd.sock",
                                    "chunk_tokens": 256}}'

Design: a thin adapter from vLLM's KVConnectorBase_V1 to kvtier._plan, which
holds every decision (and is tested without vLLM). The scheduler side asks
kvtierd which leading chunks of a prompt are cached, keyed by the engine's
own block hashes; the worker side moves whole (layer, block) pages between
the engine's KV tensors and kvtier's shared-memory pool with one tensor
index operation per layer and chunk: no Python loop over tokens, no copy
through a socket. Pages are opaque bytes: the engine's layout inside a
block (K transposed on the CPU backend, say) never matters, and partial
blocks are never moved. A chunk holds [layer][block][page bytes].

GPU engines: with `"gpu_mode": "daemon"` and a kvtierd that has a GPU,
the worker registers its KV tensors through CUDA IPC and asks the daemon
to SAVE/LOAD blocks itself (kvt_kv_save / kvt_kv_load); otherwise pages go
through the pool as above (device tensors are gathered on the device and
copied to or from the pool).

Namespaces: one per model, dtype, KV shape and rank --
`<namespace>/<dtype>/<shape hash>/tp<size>r<rank>` ("mla" instead of the
rank for MLA models, whose KV every rank shares and rank 0 alone writes).

Settings (kv_connector_extra_config): socket (default $KVTIER_SOCKET),
namespace (default "vllm/<model>"), chunk_tokens (default 256, a multiple
of the block size), lookup_wait_ms (5), load / save (true), verify
(true: checksum each loaded chunk before the engine reads it),
async_save (true), timeout_ms (10000), stats_file (path prefix: the
connector's counters as JSON, for tests and operators), gpu_mode.
"""
import hashlib
import json
import logging
import os
from dataclasses import dataclass

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)

from . import _plan
from .client import Connections, Err, KVTierError

try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # older vLLM
    CacheHitSource = None

log = logging.getLogger("kvtier.vllm")


@dataclass
class KVTierMetadata(KVConnectorMetadata):
    step: _plan.StepMeta


def _extra(cfg, key, default):
    v = cfg.kv_transfer_config.get_from_extra_config(key, default)
    if isinstance(default, bool) and isinstance(v, str):
        return v.lower() in ("1", "true", "yes", "on")
    return type(default)(v) if default is not None and v is not None else v


def gpu_mode(vllm_config):
    """"daemon": kvtierd moves bytes over CUDA IPC (GPU engines, default);
    "pages": this process moves whole pages through the pool (CPU engines,
    or GPU engines asking for it). The chunk formats differ, so the mode is
    part of the namespace and both sides of the connector agree on it."""
    dev = str(getattr(getattr(vllm_config, "device_config", None), "device_type", "cpu"))
    want = _extra(vllm_config, "gpu_mode", None)
    if dev != "cuda":
        return "pages"
    return want or "daemon"


def namespace(vllm_config, kv_cache_config, chunk_tokens, rank, tp, pp_rank=0):
    mc = vllm_config.model_config
    base = _extra(vllm_config, "namespace", None) or \
        "vllm/" + os.path.basename(str(mc.model).rstrip("/"))
    dtype = str(vllm_config.cache_config.cache_dtype)
    if dtype == "auto":
        dtype = str(mc.dtype).replace("torch.", "")
    shape = repr([g.kv_cache_spec for g in kv_cache_config.kv_cache_groups])
    shape += "|bs%d|ct%d|%s" % (vllm_config.cache_config.block_size, chunk_tokens,
                                gpu_mode(vllm_config))
    h = hashlib.sha256(shape.encode()).hexdigest()[:12]
    who = "mla" if getattr(mc, "use_mla", False) else "tp%dr%d" % (tp, rank)
    if pp_rank:
        who += "pp%d" % pp_rank
    return "%s/%s/%s/%s" % (base, dtype, h, who)


class PageStore:
    """Moves whole (layer, block) pages between KV tensors and the pool.

    Each layer tensor is seen as bytes [num_blocks, page] (or [2, num_blocks,
    half-page] for K/V-first layouts, whose page is the K half then the V
    half). A chunk is [layer][block in chunk][page]."""

    def __init__(self, kv_caches, chunk_blocks, ns, conns, verify):
        self.ns, self.conns, self.verify = ns, conns, verify
        self.chunk_blocks = chunk_blocks
        self.views, self.device = [], None
        for name, t in kv_caches.items():
            self.views.append(self._bytes_view(name, t))
            self.device = t.device
        self.num_layers = len(self.views)
        self.page = self.views[0][1]
        self.chunk_bytes = self.num_layers * chunk_blocks * self.page

    @staticmethod
    def _bytes_view(name, t):
        if not t.is_contiguous():
            raise ValueError("kvtier: KV tensor %s is not contiguous" % name)
        u8 = t.view(-1).view(torch.uint8)
        if t.dim() == 5 and t.shape[0] == 2:        # [2, blocks, ...]: K/V first
            nb = t.shape[1]
            return (u8.view(2, nb, -1), 2 * u8.numel() // (2 * nb), True)
        nb = t.shape[0]
        return (u8.view(nb, -1), u8.numel() // nb, False)

    def _pool_tensor(self, addr, n):
        import ctypes
        buf = (ctypes.c_char * n).from_address(addr)
        return torch.frombuffer(buf, dtype=torch.uint8)

    def _gather(self, layer, bids):
        v, page, kv_first = self.views[layer]
        if kv_first:
            return torch.cat([v[0].index_select(0, bids), v[1].index_select(0, bids)], 1)
        return v.index_select(0, bids)

    def _scatter(self, layer, bids, src):
        v, page, kv_first = self.views[layer]
        src = src.to(v.device, non_blocking=False) if v.device.type != "cpu" else src
        if kv_first:
            half = page // 2
            v[0].index_copy_(0, bids, src[:, :half])
            v[1].index_copy_(0, bids, src[:, half:])
        else:
            v.index_copy_(0, bids, src)

    def load(self, op):
        """Scatter op's chunks into their blocks; the failed blocks' ids."""
        failed = set()
        try:
            c = self.conns.get()
            lease = c.get(self.ns, op.keys)
        except KVTierError as e:
            self.conns.failed(e)
            return {b for bids, s in zip(op.block_ids, op.skip) for b in bids[s:]}
        bad = []
        with lease:
            for i, bids in enumerate(op.block_ids):
                want = bids[op.skip[i]:]
                ok = i < len(lease) and len(lease[i]) == self.chunk_bytes and \
                    (not self.verify or lease.verify(i))
                if not ok:
                    if i < len(lease):
                        log.warning("kvtier: chunk %s of %s unusable (size or checksum)",
                                    op.keys[i].hex()[:16], op.req_id)
                        bad.append(op.keys[i])
                    failed.update(want)
                    continue
                src = self._pool_tensor(lease.addresses[i], self.chunk_bytes)
                src = src.view(self.num_layers, self.chunk_blocks, self.page)[:, op.skip[i]:]
                idx = torch.tensor(want, dtype=torch.long, device=self.device)
                for layer in range(self.num_layers):
                    self._scatter(layer, idx, src[layer])
        if bad:        # never served again: the next request recomputes and saves
            try:
                c.delete(self.ns, bad)
            except KVTierError as e:
                self.conns.failed(e)
        return failed

    def save(self, op):
        try:
            c = self.conns.get()
            p = c.put_begin(self.ns, op.keys, [self.chunk_bytes] * len(op.keys),
                            parent=op.parent)
        except KVTierError as e:
            self.conns.failed(e)
            raise
        try:
            for i, bids in enumerate(op.block_ids):
                if p.exists[i]:
                    continue
                dst = self._pool_tensor(p.addresses[i], self.chunk_bytes)
                dst = dst.view(self.num_layers, self.chunk_blocks, self.page)
                idx = torch.tensor(bids, dtype=torch.long, device=self.device)
                for layer in range(self.num_layers):
                    g = self._gather(layer, idx)
                    dst[layer].copy_(g if g.device.type == "cpu" else g.cpu())
        except BaseException:
            p.abort()
            raise
        p.commit()


class DaemonStore:
    """GPU engines: kvtierd itself gathers and scatters the blocks (CUDA IPC
    registration of the KV tensors, kvt_kv_save / kvt_kv_load), so no KV
    byte passes through this process. Not yet run on a GPU (none where it
    was written); a daemon without one refuses the registration with
    KVT_ENOTSUP, and `"gpu_mode": "pages"` moves pages through the pool
    instead (a namespace of its own: the chunk formats differ)."""

    KINDS = {"flash_nhd": 1, "flashinfer_nhd": 3, "mla": 8}

    def __init__(self, kv_caches, chunk_tokens, block_size, ns, conns, device):
        # a registration belongs to its connection: loads and saves use the
        # one that made it (a Client may be shared by threads)
        self.ns, self.conns = ns, conns
        ts = list(kv_caches.values())
        t = ts[0]
        if t.dim() == 5 and t.shape[0] == 2:
            kind, nb, heads, hd = "flash_nhd", t.shape[1], t.shape[3], t.shape[4]
        elif t.dim() == 5 and t.shape[1] == 2:
            kind, nb, heads, hd = "flashinfer_nhd", t.shape[0], t.shape[3], t.shape[4]
        elif t.dim() == 3:
            kind, nb, heads, hd = "mla", t.shape[0], 1, t.shape[2]
        else:
            raise ValueError("kvtier: no daemon-side layout for KV shape %s" % (tuple(t.shape),))
        handles, offsets = b"", []
        for x in ts:
            info = x.untyped_storage()._share_cuda_()
            handles += bytes(info[1])[:64].ljust(64, b"\0")
            offsets.append(int(info[3]) + x.storage_offset() * x.element_size())
        c = self.c = conns.get()
        lay = c.layout(self.KINDS[kind], len(ts), nb, block_size, heads, hd,
                       t.element_size(), [0] * len(ts))
        self.reg, self.info = c.kv_register_cuda(ns, lay, chunk_tokens, device, handles, offsets)
        self.timeout_ms = 60000

    def load(self, op):
        failed = set()
        c = self.c
        for i, key in enumerate(op.keys):     # all or nothing per request: chunk by chunk
            want = op.block_ids[i][op.skip[i]:]
            try:
                x = c.kv_load(self.ns, self.reg, [key], op.block_ids[i])
                st = c.kv_wait([x], self.timeout_ms)[0]
                if st["err"] != Err.OK:
                    failed.update(want)
            except KVTierError:
                failed.update(want)
        return failed

    def save(self, op):
        c = self.c
        x = c.kv_save(self.ns, self.reg, op.keys, [b for ids in op.block_ids for b in ids],
                      parent=op.parent)
        st = c.kv_wait([x], self.timeout_ms)[0]
        if st["err"] != Err.OK:
            raise KVTierError(st["err"], "kv_save", st["msg"])


class KVTierConnector(KVConnectorBase_V1):
    if CacheHitSource is not None:
        _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = vllm_config
        self.block_size = cfg.cache_config.block_size
        ct = _extra(cfg, "chunk_tokens", 256)
        if ct % self.block_size:
            raise ValueError("kvtier: chunk_tokens %d is not a multiple of the block "
                             "size %d" % (ct, self.block_size))
        self.chunk_tokens = ct
        self.url = _extra(cfg, "socket", None) or os.environ.get("KVTIER_SOCKET")
        self.timeout_ms = _extra(cfg, "timeout_ms", 10000)
        self.stats_file = _extra(cfg, "stats_file", None)
        self._written = None
        pc = cfg.parallel_config
        self.tp = pc.tensor_parallel_size
        self.mla = bool(getattr(cfg.model_config, "use_mla", False))
        self.planner = self.mover = None
        if role == KVConnectorRole.SCHEDULER:
            self.ns = namespace(cfg, kv_cache_config, ct, 0, self.tp)
            self.lookup_conn = Connections(self.url, self.timeout_ms, 0.5)
            self.planner = _plan.Planner(
                self.block_size, ct, self._lookup, load=_extra(cfg, "load", True),
                save=_extra(cfg, "save", True),
                lookup_wait_ms=float(_extra(cfg, "lookup_wait_ms", 5.0)))
        else:
            from vllm.distributed.parallel_state import (
                get_pipeline_model_parallel_rank, get_tensor_model_parallel_rank)
            try:
                self.rank = get_tensor_model_parallel_rank()
                pp = get_pipeline_model_parallel_rank()
            except Exception:
                self.rank, pp = 0, 0
            self.ns = namespace(cfg, kv_cache_config, ct, self.rank, self.tp, pp)
            self.writer = not self.mla or self.rank == 0
            self.verify = _extra(cfg, "verify", True)
            self.async_save = _extra(cfg, "async_save", True)
        log.info("kvtier connector (%s): namespace %s, %d-token chunks",
                 role.name, self.ns, ct)

    # --------------------------------------------------------- scheduler
    def _lookup(self, keys):
        try:
            n, _ = self.lookup_conn.get().lookup(self.ns, keys)
            return n
        except KVTierError as e:
            self.lookup_conn.failed(e)
            raise

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        n, is_async = self.planner.matched(request, num_computed_tokens)
        return n, is_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.planner.after_alloc(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        so = scheduler_output
        new = [(r.req_id, r.block_ids[0], r.num_computed_tokens)
               for r in so.scheduled_new_reqs]
        cr = so.scheduled_cached_reqs
        cached = [(rid, cr.new_block_ids[i][0] if cr.new_block_ids[i] else None,
                   rid in cr.resumed_req_ids, cr.num_computed_tokens[i])
                  for i, rid in enumerate(cr.req_ids)]
        step = self.planner.build(new, cached, so.num_scheduled_tokens,
                                  getattr(so, "preempted_req_ids", None))
        if step.loads or step.saves:
            self._write_stats(self.planner.stats, "scheduler")
        return KVTierMetadata(step)

    def request_finished(self, request, block_ids):
        return self.planner.finished(request.request_id), None

    # ------------------------------------------------------------ worker
    def register_kv_caches(self, kv_caches):
        self.conns = Connections(self.url, self.timeout_ms, 0.5)
        self.store = None
        first = next(iter(kv_caches.values()))
        if first.device.type == "cuda" and gpu_mode(self._vllm_config) == "daemon":
            # no fallback: the namespace says "daemon", PageStore chunks differ
            self.store = DaemonStore(kv_caches, self.chunk_tokens, self.block_size,
                                     self.ns, self.conns,
                                     int(_extra(self._vllm_config, "device",
                                                first.device.index or 0)))
        else:
            self.store = PageStore(kv_caches, self.chunk_tokens // self.block_size,
                                   self.ns, self.conns, self.verify)
        self.mover = _plan.Mover(self.store, writer=self.writer,
                                 async_save=self.async_save)
        log.info("kvtier: %s on %s", type(self.store).__name__, first.device)

    def handle_preemptions(self, kv_connector_metadata):
        if self.mover is not None and isinstance(kv_connector_metadata, KVTierMetadata):
            self.mover.preempted(kv_connector_metadata.step)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        if self.mover is not None and meta.step.loads:
            self.mover.load(meta.step)
            self._write_stats(self.mover.stats, "worker")

    def wait_for_layer_load(self, layer_name):
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return  # whole chunks are saved after the forward, in wait_for_save

    def wait_for_save(self):
        if self.mover is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if meta.step.saves:
            self.mover.save(meta.step)

    def get_finished(self, finished_req_ids):
        if self.mover is None:
            return None, None
        done = self.mover.finished(finished_req_ids)
        if self.stats_file and self.mover.stats != self._written:
            self._written = dict(self.mover.stats)
            self._write_stats(self._written, "worker")
        return (done or None), None

    def get_block_ids_with_load_errors(self):
        return self.mover.take_errors() if self.mover is not None else set()

    def shutdown(self):
        if self.mover is not None:
            self.mover.close()
            self._write_stats(self.mover.stats, "worker")
            self.conns.close()
        if self.planner is not None:
            self.planner.shutdown()
            self.lookup_conn.close()

    def _write_stats(self, stats, role):
        if not self.stats_file:
            return
        path = "%s.%s.json" % (self.stats_file, role)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(dict(stats, namespace=self.ns), f)
        os.replace(tmp, path)
