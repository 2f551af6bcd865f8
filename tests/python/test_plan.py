"""The vLLM connector's bookkeeping (kvtier._plan), without vLLM installed.

Fake requests carry what vLLM's carry (request_id, prompt_token_ids,
block_hashes); a fake store records what the worker side was asked to
move. Covers: whole chunks only and never the whole prompt, the
asynchronous lookup (None until answered), partial chunks after local
prefix hits, saves only of completed and hashed chunks with the blocks the
request holds now, preemption (block ids replaced on resume, saves of the
preempted request waited for), async completion (request_finished keeps
the blocks until finished() reports them), load errors, and the MLA
non-writer rank.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtd import Results  # noqa: E402

from kvtier import _plan  # noqa: E402

R = Results()
BS, CT = 16, 64           # 4 blocks per chunk


class Req:
    def __init__(self, rid, n_tokens, salt=0):
        self.request_id = rid
        self.prompt_token_ids = list(range(n_tokens))
        self.block_hashes = [bytes([salt, b]) * 16 for b in range(n_tokens // BS)]


def planner(hit, wait_ms=1000.0, **kw):
    calls = []

    def lookup(keys):
        calls.append(list(keys))
        return hit(keys) if callable(hit) else hit
    p = _plan.Planner(BS, CT, lookup, lookup_wait_ms=wait_ms, **kw)
    return p, calls


def test_chunk_size_checked():
    try:
        _plan.Planner(BS, 40, lambda k: 0)
        raise AssertionError("chunk size not a multiple of the block size taken")
    except ValueError:
        pass


def test_whole_chunks_never_whole_prompt():
    p, calls = planner(lambda keys: len(keys))          # everything cached
    r = Req("a", 256)                                    # exactly 4 chunks
    n, is_async = p.matched(r, 0)
    assert not is_async
    assert n == 192, n                                   # 3 chunks: 1 token left
    assert len(calls[0]) == 3
    assert calls[0][2] == r.block_hashes[11]            # last block of chunk 3
    r2 = Req("b", 200)                                   # 3 chunks + 8 tokens
    assert p.matched(r2, 0)[0] == 192
    r3 = Req("c", 64)                                    # one chunk: nothing
    assert p.matched(r3, 0) == (0, False)
    p.shutdown()


def test_leading_hits_and_local_prefix():
    p, _ = planner(2)                                    # two leading chunks
    r = Req("a", 512)
    assert p.matched(r, 0)[0] == 128
    assert p.matched(r, 128)[0] == 0                     # locally computed
    p2, _ = planner(2)
    assert p2.matched(Req("b", 512), 80)[0] == 48        # mid-chunk local hit
    p.shutdown(), p2.shutdown()


def test_async_lookup_asks_again():
    gate = threading.Event()

    def slow(keys):
        gate.wait(10)
        return len(keys)
    p, calls = planner(slow, wait_ms=1.0)
    r = Req("a", 300)
    assert p.matched(r, 0) == (None, False)              # not answered yet
    assert p.matched(r, 0) == (None, False)
    gate.set()
    p.reqs["a"].future.result(5)
    assert p.matched(r, 0)[0] == 256
    assert len(calls) == 1                               # one lookup, reused
    assert p.stats["asked_again"] == 2
    p.shutdown()


def test_lookup_failure_is_a_miss():
    def boom(keys):
        raise OSError("daemon gone")
    p, _ = planner(boom)
    assert p.matched(Req("a", 300), 0) == (0, False)
    p.shutdown()


def test_load_plan_then_saves():
    p, _ = planner(2)
    r = Req("a", 300)
    n, _ = p.matched(r, 16)                              # one block local
    assert n == 112
    p.after_alloc(r, n)
    blocks = list(range(100, 119))                       # 19 blocks for 300 tokens
    m = p.build([("a", blocks, 128)], [], {"a": 172})
    assert len(m.loads) == 1
    op = m.loads[0]
    assert op.keys == p.keys(r, 2)
    assert op.block_ids == [blocks[0:4], blocks[4:8]] and op.skip == [1, 0]
    # 300 tokens computed: chunks 3 and 4 complete (4 * 64 = 256 <= 300);
    # chunks 1-2 came from kvtier and are not saved again.
    assert len(m.saves) == 1
    s = m.saves[0]
    assert s.keys == p.keys(r, 4)[2:] and s.parent == p.keys(r, 2)[1]
    assert s.block_ids == [blocks[8:12], blocks[12:16]]
    m = p.build([], [("a", [119], False, 300)], {"a": 1})
    assert not m.loads and not m.saves                   # no new full chunk
    assert p.finished("a") is True
    assert "a" not in p.reqs
    p.shutdown()


def test_saves_wait_for_hashes_and_compute():
    p, _ = planner(0)
    r = Req("a", 100)                                    # 6 hashed blocks
    p.matched(r, 0)
    p.after_alloc(r, 0)
    m = p.build([("a", list(range(7)), 0)], [], {"a": 40})      # chunked prefill
    assert not m.saves                                   # 40 < 64 computed
    m = p.build([], [("a", None, False, 40)], {"a": 60})
    assert len(m.saves) == 1 and m.saves[0].block_ids == [[0, 1, 2, 3]]
    # generation goes on: 128 computed but only 6 blocks hashed so far
    m = p.build([], [("a", [7], False, 100)], {"a": 28})
    assert not m.saves
    r.block_hashes += [b"\x00\x07" * 16, b"\x00\x08" * 16]
    m = p.build([], [("a", None, False, 128)], {"a": 1})
    assert len(m.saves) == 1 and m.saves[0].block_ids == [[4, 5, 6, 7]]
    assert m.saves[0].keys == [r.block_hashes[7]]
    p.shutdown()


def test_preemption_replaces_blocks():
    p, _ = planner(0)
    r = Req("a", 200)
    p.matched(r, 0)
    p.after_alloc(r, 0)
    m = p.build([("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], 0)], [], {"a": 100})
    assert m.saves[0].block_ids == [[1, 2, 3, 4]]
    m = p.build([], [], {}, preempted={"a"})             # blocks freed
    assert m.preempted == {"a"}
    # another request now owns blocks 5..8; "a" resumes on new blocks
    m = p.build([], [("a", [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62], True, 0)],
                {"a": 200})
    assert [s.block_ids for s in m.saves] == [[[54, 55, 56, 57], [58, 59, 60, 61]]]
    assert all(b >= 50 for s in m.saves for c in s.block_ids for b in c)
    p.shutdown()


class FakeStore:
    def __init__(self, fail_blocks=(), save_gate=None):
        self.loaded, self.saved = [], []
        self.fail, self.gate = set(fail_blocks), save_gate

    def load(self, op):
        self.loaded.append(op)
        return {b for c in op.block_ids for b in c} & self.fail

    def save(self, op):
        if self.gate:
            self.gate.wait(10)
        self.saved.append(op)


def test_mover_async_completion_and_preemption():
    gate = threading.Event()
    st = FakeStore(save_gate=gate)
    m = _plan.Mover(st, writer=True, async_save=True)
    step = _plan.StepMeta(saves=[_plan.SaveOp("a", [b"k" * 32], [[1, 2, 3, 4]]),
                                 _plan.SaveOp("b", [b"j" * 32], [[5, 6, 7, 8]])])
    m.save(step)
    assert m.finished({"a"}) == set()                    # save still running
    assert not m.wait_for({"b"}, timeout=0.05)
    gate.set()
    m.preempted(_plan.StepMeta(preempted={"b"}))          # waits for b's save
    assert "b" not in m.pending
    assert m.wait_for({"a"}, timeout=10)
    assert m.finished(set()) == {"a"}                    # asked before, reported now
    assert m.finished({"b"}) == {"b"}
    assert m.finished({"a", "b"}) == set()               # reported once
    assert m.finished({"zzz"}) == set()                  # never had saves
    m.close()
    assert len(st.saved) == 2


def test_mover_load_errors():
    st = FakeStore(fail_blocks={6, 7})
    m = _plan.Mover(st, async_save=False)
    step = _plan.StepMeta(loads=[_plan.LoadOp("a", [b"a" * 32, b"b" * 32],
                                              [[1, 2, 3, 4], [5, 6, 7, 8]], [0, 0])])
    m.load(step)
    assert m.take_errors() == {6, 7}
    assert m.take_errors() == set()

    class Broken(FakeStore):
        def load(self, op):
            raise OSError("gone")
    m2 = _plan.Mover(Broken(), async_save=False)
    step.loads[0].skip = [2, 0]
    m2.load(step)
    assert m2.take_errors() == {3, 4, 5, 6, 7, 8}        # skipped blocks untouched
    m.close(), m2.close()


def test_mla_non_writer_reports_but_writes_nothing():
    st = FakeStore()
    m = _plan.Mover(st, writer=False, async_save=True)
    m.save(_plan.StepMeta(saves=[_plan.SaveOp("a", [b"k" * 32], [[1, 2, 3, 4]])]))
    assert m.finished({"a"}) == {"a"}
    m.close()
    assert st.saved == []


def test_chunk_key_widths():
    k = b"\x01" * 32
    assert _plan.chunk_key(k) == k
    assert len(_plan.chunk_key(b"\x01" * 8)) == 32
    assert len(_plan.chunk_key(12345)) == 32
    assert _plan.chunk_key(b"\x01" * 8) != _plan.chunk_key(b"\x02" * 8)


def main():
    for t in (test_chunk_size_checked, test_whole_chunks_never_whole_prompt,
              test_leading_hits_and_local_prefix, test_async_lookup_asks_again,
              test_lookup_failure_is_a_miss, test_load_plan_then_saves,
              test_saves_wait_for_hashes_and_compute, test_preemption_replaces_blocks,
              test_mover_async_completion_and_preemption, test_mover_load_errors,
              test_mla_non_writer_reports_but_writes_nothing, test_chunk_key_widths):
        R.run(t)
    R.finish()


if __name__ == "__main__":
    main()
