"""The engine-independent half of the vLLM connector: what to load and save.

Design: vLLM splits a connector into a scheduler side, which decides, and a
worker side, which moves bytes; kvtier.vllm is a thin adapter from vLLM's
classes to the two classes here, so that every decision can be unit-tested
without vLLM installed (tests/python/test_plan.py).

Invariants the planner keeps:
- A chunk is `chunk_blocks` whole engine blocks; its key is the engine's own
  block hash of its last block (block hashes chain, so it names the whole
  prefix) -- the key kvtier's `vllm` scheme computes for the same tokens.
- Only whole chunks are counted as hits, only the leading run the daemon
  reported, and never the whole prompt: at least one prompt token is always
  computed by the engine (it needs logits).
- A save names the blocks the request holds *now*: block ids are tracked
  per request and replaced when a preempted request resumes, so one
  request's KV is never stored under another's key. Chunks complete only
  when every token in them has been computed (num_computed + scheduled) and
  the engine has hashed their last block.
- Lookups are asynchronous: the first ask starts one, a short wait follows,
  and `None` tells the engine to ask again next step.

The worker side (Mover) executes LoadOps synchronously before the forward
pass (the engine reads the blocks in that pass) and SaveOps on one
background thread; a request whose saves are not done keeps its blocks
(request_finished -> True, reported later through finished()). Preemption
waits for that request's saves before its blocks can be reused. A load that
cannot deliver a chunk (missing, daemon gone, checksum mismatch) reports the
chunk's block ids as load errors; vLLM then recomputes them or fails the
request, by its kv_load_failure_policy.
"""
import concurrent.futures
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("kvtier.vllm")


def chunk_key(block_hash):
    """A kvtier key from an engine block hash (32-byte hashes are used as
    they are; other sizes, e.g. 64-bit xxhash, are widened by SHA-256)."""
    if isinstance(block_hash, int):
        block_hash = block_hash.to_bytes(8, "little", signed=block_hash < 0)
    b = bytes(block_hash)
    return b if len(b) == 32 else hashlib.sha256(b"vllm-block-hash" + b).digest()


@dataclass
class LoadOp:
    req_id: str
    keys: list            # one per chunk
    block_ids: list       # per chunk: the engine blocks it fills
    skip: list            # per chunk: leading blocks already computed locally


@dataclass
class SaveOp:
    req_id: str
    keys: list
    block_ids: list       # per chunk
    parent: bytes = None  # key of the chunk before keys[0]


@dataclass
class StepMeta:
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)
    preempted: set = field(default_factory=set)


@dataclass
class _Req:
    request: object
    future: object = None
    asked_at: float = 0.0
    hit_chunks: int = 0           # last lookup's answer
    load_from: int = -1           # tokens already computed when a load was planned
    load_chunks: int = 0          # chunks to load (0: none planned)
    saved_chunks: int = 0         # chunks in the cache (saved or loaded)
    block_ids: list = field(default_factory=list)
    had_saves: bool = False
    asked_computed: int = 0       # num_computed of the last matched() ask


class Planner:
    """Scheduler side. lookup_fn(keys) -> number of leading keys cached."""

    def __init__(self, block_size, chunk_tokens, lookup_fn, load=True, save=True,
                 lookup_wait_ms=5.0, relookup_ms=1000.0):
        if chunk_tokens <= 0 or chunk_tokens % block_size:
            raise ValueError("chunk_tokens (%d) must be a positive multiple of the "
                             "engine's block size (%d)" % (chunk_tokens, block_size))
        self.block_size, self.chunk_tokens = block_size, chunk_tokens
        self.chunk_blocks = chunk_tokens // block_size
        self.lookup_fn, self.load, self.save = lookup_fn, load, save
        self.wait_s, self.relookup_s = lookup_wait_ms / 1000.0, relookup_ms / 1000.0
        self.reqs = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(1, "kvtier-lookup")
        self.stats = {"lookups": 0, "hit_tokens": 0, "load_chunks": 0,
                      "save_chunks": 0, "asked_again": 0}

    # ------------------------------------------------------------ keys
    def keys(self, request, n_chunks):
        """Keys of the first n_chunks chunks the engine has hashed."""
        hashes = request.block_hashes
        cb = self.chunk_blocks
        n = min(n_chunks, len(hashes) // cb)
        return [chunk_key(hashes[(c + 1) * cb - 1]) for c in range(n)]

    def _st(self, request):
        st = self.reqs.get(request.request_id)
        if st is None:
            st = self.reqs[request.request_id] = _Req(request)
        st.request = request
        return st

    # ----------------------------------------------------------- lookup
    def matched(self, request, num_computed):
        """(tokens to load beyond num_computed or None, async?)."""
        st = self._st(request)
        st.asked_computed = num_computed
        n_prompt = len(request.prompt_token_ids or ())
        max_chunks = (n_prompt - 1) // self.chunk_tokens if n_prompt else 0
        keys = self.keys(request, max_chunks) if self.load else []
        if not keys or num_computed >= len(keys) * self.chunk_tokens:
            return 0, False
        now = time.monotonic()
        if st.future is None or (st.future.done() and now - st.asked_at > self.relookup_s):
            st.future, st.asked_at = self.pool.submit(self._lookup, keys), now
            self.stats["lookups"] += 1
        try:
            hit = st.future.result(timeout=self.wait_s)
        except concurrent.futures.TimeoutError:
            self.stats["asked_again"] += 1
            return None, False
        st.hit_chunks = min(hit, len(keys))
        hit_tokens = st.hit_chunks * self.chunk_tokens
        return max(0, hit_tokens - num_computed), False

    def _lookup(self, keys):
        try:
            return self.lookup_fn(keys)
        except Exception as e:  # a daemon away is a miss, never an engine error
            log.warning("kvtier lookup failed: %s", e)
            return 0

    def after_alloc(self, request, num_external, num_computed_local=None):
        st = self._st(request)
        st.future = None                       # the next ask looks up afresh
        if num_external <= 0:
            return
        if num_computed_local is None:
            num_computed_local = st.asked_computed
        st.load_from = num_computed_local
        st.load_chunks = (num_computed_local + num_external) // self.chunk_tokens
        self.stats["hit_tokens"] += num_external

    # ------------------------------------------------------------ steps
    def _plan_load(self, st, meta):
        if st.load_chunks <= 0:
            return
        first = st.load_from // self.chunk_tokens
        keys = self.keys(st.request, st.load_chunks)
        op = LoadOp(st.request.request_id, [], [], [])
        cb = self.chunk_blocks
        for c in range(first, len(keys)):
            bids = st.block_ids[c * cb:(c + 1) * cb]
            if len(bids) < cb:
                break
            op.keys.append(keys[c])
            op.block_ids.append(bids)
            op.skip.append(max(0, st.load_from // self.block_size - c * cb))
        if op.keys:
            meta.loads.append(op)
            self.stats["load_chunks"] += len(op.keys)
        st.saved_chunks = max(st.saved_chunks, st.load_chunks)
        st.load_chunks, st.load_from = 0, -1

    def _plan_save(self, st, computed_after, meta):
        if not self.save:
            return
        n_full = computed_after // self.chunk_tokens
        keys = self.keys(st.request, n_full)
        n_full = min(len(keys), len(st.block_ids) // self.chunk_blocks)
        if n_full <= st.saved_chunks:
            return
        cb = self.chunk_blocks
        c0 = st.saved_chunks
        meta.saves.append(SaveOp(
            st.request.request_id, keys[c0:n_full],
            [st.block_ids[c * cb:(c + 1) * cb] for c in range(c0, n_full)],
            keys[c0 - 1] if c0 > 0 else None))
        self.stats["save_chunks"] += n_full - c0
        st.saved_chunks, st.had_saves = n_full, True

    def build(self, new_reqs, cached, num_scheduled, preempted=()):
        """One step's StepMeta.

        new_reqs: iterable of (req_id, block_ids, num_computed_tokens);
        cached: iterable of (req_id, new_block_ids or None, resumed,
        num_computed_tokens); num_scheduled: req_id -> tokens this step."""
        meta = StepMeta(preempted=set(preempted or ()))
        for rid in meta.preempted:
            st = self.reqs.get(rid)
            if st is not None:
                st.block_ids = []
        for rid, block_ids, computed in new_reqs:
            st = self.reqs.get(rid)
            if st is None:
                continue
            st.block_ids = list(block_ids)
            self._plan_load(st, meta)
            self._plan_save(st, computed + num_scheduled.get(rid, 0), meta)
        for rid, new_ids, resumed, computed in cached:
            st = self.reqs.get(rid)
            if st is None:
                continue
            if resumed:
                st.block_ids = list(new_ids or ())
            elif new_ids:
                st.block_ids.extend(new_ids)
            self._plan_load(st, meta)
            self._plan_save(st, computed + num_scheduled.get(rid, 0), meta)
        return meta

    def finished(self, req_id):
        """True when the request's blocks must live until its saves end."""
        st = self.reqs.pop(req_id, None)
        return bool(st and st.had_saves)

    def shutdown(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


class Mover:
    """Worker side. `store` does the byte moves (kvtier.vllm's page mover):
    store.load(op) -> set of failed block ids; store.save(op) -> None."""

    def __init__(self, store, writer=True, async_save=True):
        self.store, self.writer = store, writer
        self.lock = threading.Condition()
        self.pending = {}            # req_id -> saves queued or running
        self.save_reqs = set()       # had saves, not yet reported finished
        self.finishing = set()
        self.errors = set()
        self.queue = []
        self.stopping = False
        self.stats = {"loaded_chunks": 0, "saved_ops": 0, "load_failed_blocks": 0,
                      "save_errors": 0}
        self.thread = None
        if async_save:
            self.thread = threading.Thread(target=self._run, name="kvtier-save",
                                           daemon=True)
            self.thread.start()

    def load(self, meta):
        for op in meta.loads:
            try:
                failed = self.store.load(op)
            except Exception as e:
                log.warning("kvtier load of %s failed: %s", op.req_id, e)
                failed = {b for bids, s in zip(op.block_ids, op.skip) for b in bids[s:]}
            self.stats["loaded_chunks"] += len(op.keys)
            if failed:
                self.stats["load_failed_blocks"] += len(failed)
                with self.lock:
                    self.errors |= set(failed)

    def save(self, meta):
        with self.lock:
            for op in meta.saves:
                self.save_reqs.add(op.req_id)
                if not self.writer:
                    continue
                self.pending[op.req_id] = self.pending.get(op.req_id, 0) + 1
                self.queue.append(op)
            self.lock.notify_all()
        if self.thread is None:
            self._drain()

    def _do(self, op):
        try:
            self.store.save(op)
            self.stats["saved_ops"] += 1
        except Exception as e:       # a lost save is a later miss
            self.stats["save_errors"] += 1
            log.warning("kvtier save of %s failed: %s", op.req_id, e)
        with self.lock:
            self.pending[op.req_id] -= 1
            if not self.pending[op.req_id]:
                del self.pending[op.req_id]
            self.lock.notify_all()

    def _drain(self):
        while True:
            with self.lock:
                if not self.queue:
                    return
                op = self.queue.pop(0)
            self._do(op)

    def _run(self):
        while True:
            with self.lock:
                while not self.queue and not self.stopping:
                    self.lock.wait()
                if not self.queue:
                    return
                op = self.queue.pop(0)
            self._do(op)

    def wait_for(self, req_ids, timeout=None):
        """Block until no save of req_ids is queued or running."""
        end = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while any(r in self.pending for r in req_ids):
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.lock.wait(left)
        return True

    def wait_idle(self, timeout=None):
        """Block until no save is queued or running (tests, shutdown)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while self.pending:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.lock.wait(left)
        return True

    def preempted(self, meta):
        if meta.preempted:
            self.wait_for(meta.preempted)

    def finished(self, finished_req_ids):
        """Requests whose saves are all done, of those vLLM said finished."""
        with self.lock:
            self.finishing |= set(finished_req_ids or ()) & self.save_reqs
            done = {r for r in self.finishing if r not in self.pending}
            self.finishing -= done
            self.save_reqs -= done
        return done

    def take_errors(self):
        with self.lock:
            e, self.errors = self.errors, set()
        return e

    def close(self, timeout=30):
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        if self.thread:
            self.thread.join(timeout)
