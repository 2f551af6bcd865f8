"""The Python face of libkvtier: one Client per connection to a kvtierd.

Design: every call maps to one libkvtier call through ctypes; a kvt_err other
than KVT_OK becomes a KVTierError carrying the code, its name and the
daemon's text. Zero-copy calls hand out memoryviews straight over the
daemon's shared-memory pool: a GetLease's views are read-only and die with
release(); a PutLease's views are writable until commit() or abort(). Using a
view after that is a use of memory the daemon may have given to someone else,
so leases invalidate their views (memoryview.release) when they end. A Client
may be shared by threads (libkvtier serialises calls on one connection);
open one per thread for parallel requests. Only the standard library is
needed; kvtier.vllm and kvtier.sglang add torch where the engines have it.
"""
import ctypes
import enum
import threading
import time

from . import _lib as L

__all__ = ["Client", "Connections", "KVTierError", "Err", "Tier", "Scheme", "GetLease",
           "PutLease", "hash_chain", "checksum", "key_hex", "key_bytes"]


class Err(enum.IntEnum):
    OK = 0
    EINVAL = 1
    ENOMEM = 2
    ENOSPC = 3
    ENOENT = 4
    EEXIST = 5
    EPERM = 6
    ETIMEDOUT = 7
    ECLOSED = 8
    EPROTO = 9
    EIO = 10
    EBUSY = 11
    ECORRUPT = 12
    ENOTSUP = 13
    ETOOBIG = 14
    EINTERNAL = 15


class Tier(enum.IntEnum):
    NONE = 0
    HBM = 1
    DRAM = 2
    NVME = 3
    PEER = 4


class Scheme(enum.IntEnum):
    KVT1 = 0
    VLLM = 1
    SGLANG = 2


class KVTierError(Exception):
    """A libkvtier call failed: .err is the kvt_err (an Err), .msg the text."""

    def __init__(self, err, what, detail=""):
        try:
            self.err = Err(err)
        except ValueError:
            self.err = err
        self.msg = L.lib().kvt_strerror(int(err)).decode()
        self.detail = detail
        text = "%s: %s" % (what, self.msg)
        if detail and detail != self.msg:
            text += " (%s)" % detail
        super().__init__(text)


def _check(err, what, client=None):
    if err != 0:
        detail = ""
        if client is not None and client._c:
            detail = (L.lib().kvt_last_error(client._c) or b"").decode(errors="replace")
        raise KVTierError(err, what, detail)


def key_bytes(k):
    """A key as 32 bytes; accepts bytes-like of 32 bytes or 64 hex digits."""
    if isinstance(k, str):
        k = bytes.fromhex(k)
    k = bytes(k)
    if len(k) != L.KEY_LEN:
        raise ValueError("a kvtier key is %d bytes, got %d" % (L.KEY_LEN, len(k)))
    return k


def key_hex(k):
    return key_bytes(k).hex()


def _keys(keys):
    keys = list(keys)
    arr = (L.kvt_key * max(1, len(keys)))()
    for i, k in enumerate(keys):
        ctypes.memmove(arr[i].b, key_bytes(k), L.KEY_LEN)
    return arr, len(keys)


def _key1(k):
    if k is None:
        return None
    kk = L.kvt_key()
    ctypes.memmove(kk.b, key_bytes(k), L.KEY_LEN)
    return ctypes.pointer(kk)


def _ns(ns):
    b = ns.encode() if isinstance(ns, str) else bytes(ns)
    if not b or len(b) > L.NS_MAX:
        raise ValueError("a namespace is 1..%d bytes" % L.NS_MAX)
    return b


def _view(addr, size, writable):
    mv = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
    return mv if writable else mv.toreadonly()


def checksum(data):
    """XXH3-64 of a bytes-like object, the checksum kvtier records."""
    mv = memoryview(data).cast("B")
    buf = (ctypes.c_char * len(mv)).from_buffer_copy(mv) if mv.readonly else \
        (ctypes.c_char * len(mv)).from_buffer(mv)
    return L.lib().kvt_checksum(ctypes.addressof(buf), len(mv))


def hash_chain(tokens, chunk_tokens, scheme=Scheme.KVT1, ns=None, salt=b"",
               extra=b"", seed=None, extra_strs=None, parent=None):
    """One 32-byte key per full chunk of tokens (see kvt_hash_chain)."""
    if isinstance(scheme, str):
        scheme = Scheme[scheme.upper()]
    tokens = list(tokens)
    p = L.kvt_hash_params()
    p.scheme, p.chunk_tokens = int(scheme), int(chunk_tokens)
    keep = []
    if ns is not None:
        p.ns = ns.encode() if isinstance(ns, str) else bytes(ns)
    if salt:
        sb = ctypes.create_string_buffer(bytes(salt), len(salt))
        keep.append(sb)
        p.salt, p.salt_len = ctypes.addressof(sb), len(salt)
    if extra:
        eb = ctypes.create_string_buffer(bytes(extra), len(extra))
        keep.append(eb)
        p.extra, p.extra_len = ctypes.addressof(eb), len(extra)
    if seed is not None:
        p.seed = seed.encode() if isinstance(seed, str) else seed
    if extra_strs:
        arr = (ctypes.c_char_p * len(extra_strs))(*[s.encode() for s in extra_strs])
        keep.append(arr)
        p.extra_strs, p.n_extra_strs = arr, len(extra_strs)
    pk = _key1(parent)
    if pk is not None:
        p.parent = pk
    toks = (ctypes.c_uint32 * max(1, len(tokens)))(*tokens)
    nmax = len(tokens) // max(1, chunk_tokens) if chunk_tokens else 0
    out = (L.kvt_key * max(1, nmax))()
    n = ctypes.c_size_t()
    _check(L.lib().kvt_hash_chain(ctypes.byref(p), toks, len(tokens), out, nmax,
                                  ctypes.byref(n)), "hash_chain")
    return [bytes(out[i].b) for i in range(n.value)]


class GetLease:
    """Read-only views of pinned chunks; release() (or `with`) unpins them."""

    def __init__(self, client, lease, chunks):
        self._client, self.lease = client, lease
        self.views = [_view(c.data, c.size, False) for c in chunks]
        self.checksums = [c.checksum for c in chunks]
        self.addresses = [c.data for c in chunks]

    def __len__(self):
        return len(self.views)

    def __getitem__(self, i):
        return self.views[i]

    def verify(self, i):
        """True when chunk i's bytes still match its recorded checksum."""
        return L.lib().kvt_checksum(self.addresses[i], len(self.views[i])) == \
            self.checksums[i]

    def release(self):
        for v in self.views:
            v.release()
        self.views = []
        if self.lease:
            lease, self.lease = self.lease, 0
            self._client.release(lease)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class PutLease:
    """Writable views of reserved pool space; commit() makes them visible.

    views[i] is None for a key the daemon already has (exists[i] True)."""

    def __init__(self, client, lease, chunks, n):
        self._client, self.lease, self._n = client, lease, n
        self._chunks = chunks
        self.exists = [bool(chunks[i].exists) for i in range(n)]
        self.views = [None if chunks[i].exists or not chunks[i].data
                      else _view(chunks[i].data, chunks[i].size, True)
                      for i in range(n)]
        self.addresses = [chunks[i].data for i in range(n)]

    def _end(self):
        for v in self.views:
            if v is not None:
                v.release()
        self.views = [None] * self._n

    def commit(self, checksums=None):
        lease, self.lease = self.lease, 0
        self._end()
        if not lease:
            return
        cs = None
        if checksums is not None:
            cs = (ctypes.c_uint64 * max(1, self._n))(*checksums)
        _check(L.lib().kvt_put_commit(self._client._c, lease, self._chunks,
                                      self._n, cs), "put_commit", self._client)

    def abort(self):
        lease, self.lease = self.lease, 0
        self._end()
        if lease:
            _check(L.lib().kvt_put_abort(self._client._c, lease), "put_abort",
                   self._client)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self.lease:
            self.abort() if exc_type else self.commit()


class Client:
    """A connection to kvtierd. url: "ipc:///path", "tcp://host:port", a path,
    or None for $KVTIER_SOCKET (else ./var/kvtierd.sock)."""

    def __init__(self, url=None, timeout_ms=None):
        self._c = None
        h = ctypes.c_void_p()
        u = url.encode() if isinstance(url, str) else url
        _check(L.lib().kvt_connect(u, ctypes.byref(h)), "connect %s" % (url or "$KVTIER_SOCKET"))
        self._c = h.value
        if timeout_ms is not None:
            L.lib().kvt_set_timeout(self._c, int(timeout_ms))

    # ---------------------------------------------------------- lifecycle
    def close(self):
        if self._c:
            c, self._c = self._c, None
            L.lib().kvt_close(c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _h(self):
        if not self._c:
            raise KVTierError(Err.ECLOSED, "client closed")
        return self._c

    @property
    def zero_copy(self):
        return bool(L.lib().kvt_zero_copy(self._h()))

    def set_timeout(self, ms):
        L.lib().kvt_set_timeout(self._h(), int(ms))

    # ------------------------------------------------------------- chunks
    def lookup(self, ns, keys):
        """(n_present, [Tier per key]): how many leading keys are cached."""
        arr, n = _keys(keys)
        tiers = (ctypes.c_int * max(1, n))()
        got = ctypes.c_size_t()
        _check(L.lib().kvt_lookup(self._h(), _ns(ns), arr, n, ctypes.byref(got), tiers),
               "lookup", self)
        return got.value, [Tier(tiers[i]) for i in range(n)]

    def put(self, ns, keys, bufs, parent=None):
        """Copy one buffer per key into the cache; returns how many were new."""
        arr, n = _keys(keys)
        bufs = [memoryview(b).cast("B") for b in bufs]
        if len(bufs) != n:
            raise ValueError("one buffer per key")
        holders = [(ctypes.c_char * len(b)).from_buffer_copy(b) if b.readonly
                   else (ctypes.c_char * len(b)).from_buffer(b) for b in bufs]
        ptrs = (ctypes.c_void_p * max(1, n))(*[ctypes.addressof(h) for h in holders])
        sizes = (ctypes.c_size_t * max(1, n))(*[len(b) for b in bufs])
        new = ctypes.c_size_t()
        _check(L.lib().kvt_put(self._h(), _ns(ns), arr, ptrs, sizes, n, _key1(parent),
                               ctypes.byref(new)), "put", self)
        return new.value

    def put_begin(self, ns, keys, sizes, parent=None):
        """Reserve pool space: a PutLease with writable views (zero copy)."""
        arr, n = _keys(keys)
        sz = (ctypes.c_size_t * max(1, n))(*sizes)
        chunks = (L.kvt_chunk * max(1, n))()
        lease = ctypes.c_uint64()
        _check(L.lib().kvt_put_begin(self._h(), _ns(ns), arr, sz, n, _key1(parent),
                                     ctypes.byref(lease), chunks), "put_begin", self)
        return PutLease(self, lease.value, chunks, n)

    def get(self, ns, keys):
        """Pin the leading present chunks: a GetLease of read-only views."""
        arr, n = _keys(keys)
        chunks = (L.kvt_chunk * max(1, n))()
        lease, got = ctypes.c_uint64(), ctypes.c_size_t()
        _check(L.lib().kvt_get(self._h(), _ns(ns), arr, n, ctypes.byref(lease), chunks,
                               ctypes.byref(got)), "get", self)
        return GetLease(self, lease.value, [chunks[i] for i in range(got.value)])

    def release(self, lease):
        lease = lease.lease if isinstance(lease, GetLease) else lease
        if lease:
            _check(L.lib().kvt_release(self._h(), lease), "release", self)

    def get_copy(self, ns, key, cap=1 << 20):
        """One chunk's bytes (a copy); None when absent."""
        size = ctypes.c_size_t()
        while True:
            buf = ctypes.create_string_buffer(cap)
            e = L.lib().kvt_get_copy(self._h(), _ns(ns), _key1(key), buf, cap,
                                     ctypes.byref(size))
            if e == Err.ETOOBIG and size.value > cap:
                cap = size.value
                continue
            if e == Err.ENOENT:
                return None
            _check(e, "get_copy", self)
            return buf.raw[:size.value]

    def delete(self, ns, keys):
        arr, n = _keys(keys)
        out = ctypes.c_size_t()
        _check(L.lib().kvt_delete(self._h(), _ns(ns), arr, n, ctypes.byref(out)),
               "delete", self)
        return out.value

    def clear(self, ns):
        out = ctypes.c_uint64()
        _check(L.lib().kvt_clear(self._h(), _ns(ns), ctypes.byref(out)), "clear", self)
        return out.value

    def evict(self, nbytes=0):
        out = ctypes.c_uint64()
        _check(L.lib().kvt_evict(self._h(), int(nbytes), ctypes.byref(out)), "evict", self)
        return out.value

    def stats(self):
        st = L.kvt_stats()
        _check(L.lib().kvt_stats_get(self._h(), ctypes.byref(st)), "stats", self)
        return {f: getattr(st, f) for f, _ in L.kvt_stats._fields_}

    # ---------------------------------------------------- KV-cache calls
    @staticmethod
    def layout(kind, num_layers, num_blocks, block_size, num_kv_heads, head_size,
               elem_size, bases, num_kv=0, block_stride=0, token_stride=0,
               head_stride=0):
        """A kvt_layout_params (see kvtier.h); keep it alive while in use."""
        p = L.kvt_layout_params()
        p.kind, p.num_layers, p.num_blocks = int(kind), num_layers, num_blocks
        p.block_size, p.num_kv_heads, p.head_size = block_size, num_kv_heads, head_size
        p.elem_size, p.num_kv = elem_size, num_kv
        p.block_stride, p.token_stride, p.head_stride = block_stride, token_stride, head_stride
        arr = (ctypes.c_uint64 * max(1, len(bases)))(*bases)
        p.bases, p.n_bases = arr, len(bases)
        p._keep = arr
        return p

    @staticmethod
    def _info(info):
        return {"chunk_bytes": info.chunk_bytes,
                "blocks_per_chunk": info.blocks_per_chunk,
                "shape": info.shape.decode()}

    def kv_register_host(self, ns, layout, chunk_tokens, path, map_base):
        reg, info = ctypes.c_uint64(), L.kvt_kv_info()
        _check(L.lib().kvt_kv_register_host(self._h(), _ns(ns), ctypes.byref(layout),
                                            chunk_tokens, path.encode(), map_base,
                                            ctypes.byref(reg), ctypes.byref(info)),
               "kv_register_host", self)
        return reg.value, self._info(info)

    def kv_register_cuda(self, ns, layout, chunk_tokens, device, ipc_handles, offsets):
        """ipc_handles: bytes of n_bases cudaIpcMemHandle_t (64 bytes each)."""
        reg, info = ctypes.c_uint64(), L.kvt_kv_info()
        h = ctypes.create_string_buffer(bytes(ipc_handles), len(ipc_handles))
        off = (ctypes.c_uint64 * max(1, len(offsets)))(*offsets)
        _check(L.lib().kvt_kv_register_cuda(self._h(), _ns(ns), ctypes.byref(layout),
                                            chunk_tokens, device, h, off,
                                            ctypes.byref(reg), ctypes.byref(info)),
               "kv_register_cuda", self)
        return reg.value, self._info(info)

    def kv_unregister(self, reg):
        _check(L.lib().kvt_kv_unregister(self._h(), reg), "kv_unregister", self)

    def _kv_args(self, keys, block_ids):
        arr, n = _keys(keys)
        bids = (ctypes.c_int32 * max(1, len(block_ids)))(*block_ids)
        return arr, n, bids, len(block_ids)

    def kv_save(self, ns, reg, keys, block_ids, parent=None):
        arr, n, bids, nb = self._kv_args(keys, block_ids)
        x = ctypes.c_uint64()
        _check(L.lib().kvt_kv_save(self._h(), _ns(ns), reg, arr, n, bids, nb,
                                   _key1(parent), ctypes.byref(x)), "kv_save", self)
        return x.value

    def kv_load(self, ns, reg, keys, block_ids):
        arr, n, bids, nb = self._kv_args(keys, block_ids)
        x = ctypes.c_uint64()
        _check(L.lib().kvt_kv_load(self._h(), _ns(ns), reg, arr, n, bids, nb,
                                   ctypes.byref(x)), "kv_load", self)
        return x.value

    @staticmethod
    def _st(s):
        return {"xfer": s.xfer, "done": bool(s.done), "err": Err(s.err),
                "n_chunks": s.n_chunks, "n_skipped": s.n_skipped,
                "msg": s.msg.decode(errors="replace")}

    def kv_poll(self, xfers):
        xs = (ctypes.c_uint64 * max(1, len(xfers)))(*xfers)
        st = (L.kvt_xfer_status * max(1, len(xfers)))()
        _check(L.lib().kvt_kv_poll(self._h(), xs, len(xfers), st), "kv_poll", self)
        return [self._st(st[i]) for i in range(len(xfers))]

    def kv_wait(self, xfers, timeout_ms=-1):
        """Statuses of xfers once all are done; KVTierError ETIMEDOUT if not."""
        xs = (ctypes.c_uint64 * max(1, len(xfers)))(*xfers)
        st = (L.kvt_xfer_status * max(1, len(xfers)))()
        _check(L.lib().kvt_kv_wait(self._h(), xs, len(xfers), int(timeout_ms), st),
               "kv_wait", self)
        return [self._st(st[i]) for i in range(len(xfers))]

    def kv_stats(self):
        st = L.kvt_kv_stats()
        _check(L.lib().kvt_kv_stats_get(self._h(), ctypes.byref(st)), "kv_stats", self)
        out = {f: getattr(st, f) for f, _ in L.kvt_kv_stats._fields_}
        out["gpu"] = st.gpu.decode(errors="replace")
        return out


class Connections:
    """One Client per calling thread, re-opened after the daemon went away.

    Engines call kvtier from several threads (a scheduler's lookup thread, a
    worker's loads and its save thread; SGLang's exists/get/set threads): one
    connection each keeps them parallel, since libkvtier serialises calls on
    one connection. After a transport error (failed(e)) the thread's client
    is dropped and re-opened at most every reconnect_s, so a restarted
    kvtierd is used again without restarting the engine."""

    def __init__(self, url, timeout_ms, reconnect_s):
        self.url, self.timeout_ms, self.reconnect_s = url, timeout_ms, reconnect_s
        self.local = threading.local()
        self.lock = threading.Lock()
        self.all = []
        self.closed = False

    def get(self):
        c = getattr(self.local, "c", None)
        if c is not None:
            return c
        now = time.monotonic()
        if now < getattr(self.local, "next_try", 0.0):
            raise KVTierError(Err.ECLOSED, "kvtierd unreachable")
        self.local.next_try = now + self.reconnect_s
        if self.closed:
            raise KVTierError(Err.ECLOSED, "kvtier store closed")
        c = Client(self.url, self.timeout_ms)
        self.local.c = c
        with self.lock:
            self.all.append(c)
        return c

    def failed(self, e):
        """Drop this thread's client after a transport error (the stream may
        be out of step); other errors leave it be."""
        if not isinstance(e, KVTierError) or e.err not in (
                Err.ECLOSED, Err.ETIMEDOUT, Err.EPROTO, Err.EIO):
            return
        c = getattr(self.local, "c", None)
        self.local.c = None
        if c is not None:
            with self.lock:
                if c in self.all:
                    self.all.remove(c)
            try:
                c.close()
            except Exception:
                pass

    def close(self):
        with self.lock:
            cs, self.all = self.all, []
            self.closed = True
        for c in cs:
            try:
                c.close()
            except Exception:
                pass
