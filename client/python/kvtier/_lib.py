"""ctypes bindings of libkvtier (client/include/kvtier.h).

Design: this module only describes the C ABI -- structures, prototypes and
where the shared library is found; kvtier.client builds the Python API on
it. The library is searched in this order: $KVTIER_LIB (a path), the build
tree this package sits in (build/lib/libkvtier.so.0, or $KVTIER_BUILD/lib),
the directory of an installed package's prefix, then the system loader's
libkvtier.so.0 (make install). Nothing is loaded at import: the first
call to lib() does it, so importing kvtier never fails on a machine
without the library (vLLM imports the connector's module in processes
that may never use it).
"""
import ctypes
import ctypes.util
import os
import threading

KEY_LEN = 32
NS_MAX = 255


class kvt_key(ctypes.Structure):
    _fields_ = [("b", ctypes.c_uint8 * KEY_LEN)]


class kvt_chunk(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t),
                ("checksum", ctypes.c_uint64), ("exists", ctypes.c_int)]


class kvt_hash_params(ctypes.Structure):
    _fields_ = [("scheme", ctypes.c_int), ("chunk_tokens", ctypes.c_size_t),
                ("ns", ctypes.c_char_p),
                ("salt", ctypes.c_void_p), ("salt_len", ctypes.c_size_t),
                ("extra", ctypes.c_void_p), ("extra_len", ctypes.c_size_t),
                ("seed", ctypes.c_char_p),
                ("extra_strs", ctypes.POINTER(ctypes.c_char_p)),
                ("n_extra_strs", ctypes.c_size_t),
                ("parent", ctypes.POINTER(kvt_key))]


class kvt_stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "pool_bytes", "used_bytes", "chunks", "namespaces", "leases",
        "clients", "hits", "misses", "puts", "evictions", "bytes_in",
        "bytes_out")] + [("fragmentation", ctypes.c_double),
                         ("index_bytes", ctypes.c_uint64),
                         ("uptime_ms", ctypes.c_uint64)]


class kvt_layout_params(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("num_layers", ctypes.c_uint32),
                ("num_blocks", ctypes.c_uint32), ("block_size", ctypes.c_uint32),
                ("num_kv_heads", ctypes.c_uint32), ("head_size", ctypes.c_uint32),
                ("elem_size", ctypes.c_uint32),
                ("bases", ctypes.POINTER(ctypes.c_uint64)),
                ("n_bases", ctypes.c_size_t), ("num_kv", ctypes.c_uint32),
                ("block_stride", ctypes.c_uint64), ("token_stride", ctypes.c_uint64),
                ("head_stride", ctypes.c_uint64)]


class kvt_kv_info(ctypes.Structure):
    _fields_ = [("chunk_bytes", ctypes.c_uint64),
                ("blocks_per_chunk", ctypes.c_uint32),
                ("shape", ctypes.c_char * 64)]


class kvt_xfer_status(ctypes.Structure):
    _fields_ = [("xfer", ctypes.c_uint64), ("done", ctypes.c_int),
                ("err", ctypes.c_int), ("n_chunks", ctypes.c_uint32),
                ("n_skipped", ctypes.c_uint32), ("msg", ctypes.c_char * 160)]


class kvt_kv_stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "registrations", "transfers", "saved_chunks", "loaded_chunks",
        "failed", "hbm_bytes", "hbm_used", "hbm_loaded_chunks",
        "hbm_demoted")] + [("gpu", ctypes.c_char * 160)]


_P = ctypes.POINTER
_vp, _sz, _i, _u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64
_cp = ctypes.c_char_p

# name -> (restype, argtypes); every call but the helpers returns kvt_err.
PROTOS = {
    "kvt_strerror": (_cp, [_i]),
    "kvt_tier_name": (_cp, [_i]),
    "kvt_scheme_parse": (_i, [_cp]),
    "kvt_hash_chain": (_i, [_P(kvt_hash_params), _P(ctypes.c_uint32), _sz,
                            _P(kvt_key), _sz, _P(_sz)]),
    "kvt_checksum": (_u64, [_vp, _sz]),
    "kvt_copy_checksum": (_u64, [_vp, _vp, _sz]),
    "kvt_connect": (_i, [_cp, _P(_vp)]),
    "kvt_close": (None, [_vp]),
    "kvt_set_timeout": (None, [_vp, _i]),
    "kvt_zero_copy": (_i, [_vp]),
    "kvt_last_error": (_cp, [_vp]),
    "kvt_lookup": (_i, [_vp, _cp, _P(kvt_key), _sz, _P(_sz), _P(_i)]),
    "kvt_put_begin": (_i, [_vp, _cp, _P(kvt_key), _P(_sz), _sz, _P(kvt_key),
                           _P(_u64), _P(kvt_chunk)]),
    "kvt_put_commit": (_i, [_vp, _u64, _P(kvt_chunk), _sz, _P(_u64)]),
    "kvt_put_abort": (_i, [_vp, _u64]),
    "kvt_put": (_i, [_vp, _cp, _P(kvt_key), _P(_vp), _P(_sz), _sz,
                     _P(kvt_key), _P(_sz)]),
    "kvt_get": (_i, [_vp, _cp, _P(kvt_key), _sz, _P(_u64), _P(kvt_chunk), _P(_sz)]),
    "kvt_release": (_i, [_vp, _u64]),
    "kvt_get_copy": (_i, [_vp, _cp, _P(kvt_key), _vp, _sz, _P(_sz)]),
    "kvt_delete": (_i, [_vp, _cp, _P(kvt_key), _sz, _P(_sz)]),
    "kvt_clear": (_i, [_vp, _cp, _P(_u64)]),
    "kvt_evict": (_i, [_vp, _u64, _P(_u64)]),
    "kvt_stats_get": (_i, [_vp, _P(kvt_stats)]),
    "kvt_kv_register_host": (_i, [_vp, _cp, _P(kvt_layout_params), _sz, _cp, _vp,
                                  _P(_u64), _P(kvt_kv_info)]),
    "kvt_kv_register_cuda": (_i, [_vp, _cp, _P(kvt_layout_params), _sz, _i, _vp,
                                  _P(_u64), _P(_u64), _P(kvt_kv_info)]),
    "kvt_kv_unregister": (_i, [_vp, _u64]),
    "kvt_kv_save": (_i, [_vp, _cp, _u64, _P(kvt_key), _sz, _P(ctypes.c_int32), _sz,
                         _P(kvt_key), _P(_u64)]),
    "kvt_kv_load": (_i, [_vp, _cp, _u64, _P(kvt_key), _sz, _P(ctypes.c_int32), _sz,
                         _P(_u64)]),
    "kvt_kv_poll": (_i, [_vp, _P(_u64), _sz, _P(kvt_xfer_status)]),
    "kvt_kv_wait": (_i, [_vp, _P(_u64), _sz, _i, _P(kvt_xfer_status)]),
    "kvt_kv_stats_get": (_i, [_vp, _P(kvt_kv_stats)]),
}

_lock = threading.Lock()
_lib = None


def candidates():
    """Paths tried, in order (the loader's own search comes last)."""
    out = []
    if os.environ.get("KVTIER_LIB"):
        out.append(os.environ["KVTIER_LIB"])
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", "..", ".."))
    build = os.environ.get("KVTIER_BUILD", os.path.join(root, "build"))
    if not os.path.isabs(build):
        build = os.path.join(root, build)
    out.append(os.path.join(build, "lib", "libkvtier.so.0"))
    # An installed package under PREFIX/lib/pythonX.Y/site-packages/kvtier.
    prefix = os.path.normpath(os.path.join(here, "..", "..", "..", ".."))
    out.append(os.path.join(prefix, "lib", "libkvtier.so.0"))
    found = ctypes.util.find_library("kvtier")
    if found:
        out.append(found)
    out.append("libkvtier.so.0")
    return out


def lib():
    """The loaded library (loaded once, thread-safe); OSError if none."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidates():
            if os.path.isabs(path) and not os.path.exists(path):
                tried.append(path + " (absent)")
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            for name, (res, args) in PROTOS.items():
                fn = getattr(handle, name)
                fn.restype, fn.argtypes = res, args
            _lib = handle
            return _lib
        raise OSError("libkvtier not found; tried: " + "; ".join(tried) +
                      " (build it with `make`, or set KVTIER_LIB)")
