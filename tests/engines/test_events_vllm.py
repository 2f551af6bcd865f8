"""kvtierd's KV events read by vLLM's own decoder.

Run with the engines venv's python (scripts/engines-env.sh prints it):
    $(scripts/engines-env.sh) tests/engines/test_events_vllm.py

A real kvtierd (DRAM and NVMe tiers, events and replay on) is driven with
kvtierctl: puts of a chain, a delete, a flush to NVMe, a flush that drops
the DRAM copies, a 20-chunk chain, namespace clears (one that leaves
another namespace, one that empties the cache). A pyzmq SUB socket reads
every message ([topic, 8-byte big-endian seq, payload]) and each payload is
decoded by
msgspec.msgpack.Decoder(vllm.distributed.kv_events.KVEventBatch), the class
vLLM's consumers decode with, then checked: BlockStored / BlockRemoved /
AllBlocksCleared with the right medium ("CPU" for DRAM, "STORAGE" for
NVMe), block hashes equal to the chunk keys, chained parents, block_size,
data_parallel_rank, strictly increasing sequence numbers. The replay
endpoint is then asked for everything from seq 0, with the framing vLLM's
ZmqEventPublisher serves ([b"", topic, seq, payload] ... then the end
marker [b"", b"", -1, b""]), and every replayed payload is decoded the same
way and equals the one published live.

Paths: $KVTIERD and $KVTIERCTL (default build/bin/kvtierd, build/bin/
kvtierctl). Exit 0 on pass, 1 on failure; one summary line at the end.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import msgspec
import zmq
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved,
                                        BlockStored, KVEventBatch)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
KVTIERD = os.environ.get("KVTIERD", os.path.join(ROOT, "build/bin/kvtierd"))
KVTIERCTL = os.environ.get("KVTIERCTL", os.path.join(ROOT, "build/bin/kvtierctl"))
TOPIC = b"kv@kvtier@test"
BLOCK_SIZE = 64
DP_RANK = 2
WAIT_S = 15.0
DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvt-evpy-")
        self.sock = os.path.join(self.dir, "kvtierd.sock")
        self.pool = "/dev/shm/kvt-evpy-%d.pool" % os.getpid()
        self.port = free_port()
        self.replay = "ipc://%s/replay" % self.dir
        self.log = open(os.path.join(self.dir, "kvtierd.log"), "w+")
        args = [KVTIERD, "--socket", "ipc://" + self.sock, "--state-dir", self.dir,
                "--pool-path", self.pool, "--pool-bytes", "64M",
                "--metrics.listen", "", "--nvme.nvme_bytes", "64M",
                "--nvme.file_bytes", "16M", "--nvme.fsync", "0",
                "--events.endpoint", "tcp://*:%d" % self.port,
                "--events.replay_endpoint", self.replay,
                "--events.topic", TOPIC.decode(),
                "--events.block_size", str(BLOCK_SIZE),
                "--events.dp_rank", str(DP_RANK)]
        self.proc = subprocess.Popen(args, stderr=self.log)
        end = time.time() + WAIT_S
        while self.ctl("status", check_rc=False).returncode != 0:
            if self.proc.poll() is not None or time.time() > end:
                text = self.log_text()
                self.stop()
                raise Fail("kvtierd did not start: " + text)
            time.sleep(0.05)

    def log_text(self):
        self.log.seek(0)
        return self.log.read()[-2000:]

    def ctl(self, *args, check_rc=True):
        r = subprocess.run([KVTIERCTL, "--socket", self.sock] + list(args),
                           capture_output=True, text=True)
        if check_rc and r.returncode != 0:
            raise Fail("kvtierctl %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r

    def put(self, ns, key, parent=None):
        path = os.path.join(self.dir, "chunk")
        with open(path, "wb") as f:
            f.write(os.urandom(20000))
        extra = ["--parent", parent] if parent else []
        self.ctl("put", "--ns", ns, "--key", key, *extra, path)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        if os.path.exists(self.pool):
            os.unlink(self.pool)


def key(i):
    return "%064x" % (0xE0E0_0000 + i)


class Stream:
    """Every live message, decoded by vLLM's KVEventBatch decoder."""

    def __init__(self, ctx, port):
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect("tcp://127.0.0.1:%d" % port)
        self.batches = []    # (seq, payload, KVEventBatch)
        self.events = []     # (seq, event)

    def recv(self, timeout_ms):
        if not self.sub.poll(timeout_ms):
            return False
        frames = self.sub.recv_multipart()
        check(len(frames) == 3, "want 3 frames, got %d" % len(frames))
        topic, seq_b, payload = frames
        check(topic == TOPIC, "topic %r" % topic)
        check(len(seq_b) == 8, "seq of %d bytes" % len(seq_b))
        seq = int.from_bytes(seq_b, "big")
        if self.batches:
            check(seq > self.batches[-1][0], "seq %d after %d" % (seq, self.batches[-1][0]))
        batch = DECODER.decode(payload)
        check(batch.data_parallel_rank == DP_RANK, "dp rank %r" % batch.data_parallel_rank)
        check(isinstance(batch.ts, float) and batch.ts > 1e9, "ts %r" % batch.ts)
        self.batches.append((seq, payload, batch))
        self.events += [(seq, ev) for ev in batch.events]
        return True

    def wait_for(self, pred, what):
        end = time.time() + WAIT_S
        while not any(pred(ev) for _, ev in self.events):
            check(time.time() < end, "no event: " + what)
            self.recv(100)

    def reset(self):
        self.events = []


def has_hash(ev, cls, medium, k):
    return isinstance(ev, cls) and ev.medium == medium and bytes.fromhex(k) in ev.block_hashes


def sync(d, st):
    """Probe until the subscription is live, then wait past a marker."""
    for i in range(200):
        d.put("evsync", key(0xFF00 + i))
        d.ctl("delete", "--ns", "evsync", key(0xFF00 + i))
        if st.recv(50):
            break
    check(st.batches, "no event reached the subscriber")
    d.put("evsync", key(0xFFFF))
    d.ctl("delete", "--ns", "evsync", key(0xFFFF))
    st.wait_for(lambda ev: has_hash(ev, BlockRemoved, "CPU", key(0xFFFF)), "sync marker")
    st.reset()


def stored_parents(st, medium):
    """key hex -> parent hex (or None) over every BlockStored of medium."""
    out = {}
    for _, ev in st.events:
        if not isinstance(ev, BlockStored) or ev.medium != medium:
            continue
        check(ev.block_size == BLOCK_SIZE, "block_size %r" % ev.block_size)
        check(ev.token_ids == [] and ev.lora_id is None, "token_ids / lora_id")
        parent = ev.parent_block_hash
        for h in ev.block_hashes:
            check(isinstance(h, bytes) and len(h) == 32, "hash %r" % (h,))
            out[h.hex()] = parent.hex() if parent is not None else None
            parent = h
    return out


def scenario(d, st):
    # put: BlockStored CPU, hashes = keys, chained parents.
    d.put("py", key(1))
    d.put("py", key(2), parent=key(1))
    d.put("py", key(3), parent=key(2))
    st.wait_for(lambda ev: has_hash(ev, BlockStored, "CPU", key(3)), "stored CPU 3")
    par = stored_parents(st, "CPU")
    check(par == {key(1): None, key(2): key(1), key(3): key(2)}, "CPU stored %r" % par)
    # delete: BlockRemoved CPU.
    d.ctl("delete", "--ns", "py", key(3))
    st.wait_for(lambda ev: has_hash(ev, BlockRemoved, "CPU", key(3)), "removed CPU 3")
    # flush: BlockStored STORAGE; flush --evict: BlockRemoved CPU.
    d.ctl("flush")
    st.wait_for(lambda ev: has_hash(ev, BlockStored, "STORAGE", key(2)), "stored STORAGE 2")
    par = stored_parents(st, "STORAGE")
    check(par == {key(1): None, key(2): key(1)}, "STORAGE stored %r" % par)
    d.ctl("flush", "--evict")
    for i in (1, 2):
        st.wait_for(lambda ev, i=i: has_hash(ev, BlockRemoved, "CPU", key(i)),
                    "removed CPU %d" % i)
    # A longer chain: written and dropped by one flush, so events of many
    # hashes (msgpack arrays of 16 and more) when the records complete together.
    prev = None
    for i in range(100, 120):
        d.put("py", key(i), parent=prev)
        prev = key(i)
    d.ctl("flush", "--evict")
    st.wait_for(lambda ev: has_hash(ev, BlockRemoved, "CPU", key(119)), "removed CPU 119")
    par = stored_parents(st, "STORAGE")
    check(all(par.get(key(i)) == key(i - 1) for i in range(101, 120)), "long chain on STORAGE")
    # clear of a namespace while another holds chunks: BlockRemoved of its
    # keys (all on NVMe only by now: one event of 22 hashes, a msgpack
    # array16); clear of the last one: AllBlocksCleared, no per-key removal.
    d.put("keep", key(500))
    d.ctl("clear", "--ns", "py")
    gone = [key(i) for i in [1, 2] + list(range(100, 120))]
    for k in gone:
        st.wait_for(lambda ev, k=k: has_hash(ev, BlockRemoved, "STORAGE", k), "removed " + k)
    d.ctl("clear", "--ns", "keep")
    st.wait_for(lambda ev: isinstance(ev, AllBlocksCleared), "AllBlocksCleared")
    check(not any(has_hash(ev, BlockRemoved, "CPU", key(500)) for _, ev in st.events),
          "a per-key removal with AllBlocksCleared")


def replay(d, ctx, st):
    """Everything from seq 0: the start-up inventory first, then the same
    payloads as live, then the end marker."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(d.replay)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    got = []
    while True:
        check(dealer.poll(int(WAIT_S * 1000)), "replay: no end marker")
        frames = dealer.recv_multipart()
        check(len(frames) == 4 and frames[0] == b"", "replay framing %r" % frames[:2])
        seq = int.from_bytes(frames[2], "big", signed=True)
        if seq == -1:
            check(frames[1] == b"" and frames[3] == b"", "end marker")
            break
        check(frames[1] == TOPIC, "replay topic")
        got.append((seq, frames[3], DECODER.decode(frames[3])))
    dealer.close(linger=0)
    check(got and got[0][0] == 0, "replay does not start at seq 0")
    check(isinstance(got[0][2].events[0], AllBlocksCleared), "no inventory reset at seq 0")
    check(all(b[0] > a[0] for a, b in zip(got, got[1:])), "replay out of order")
    live = {seq: payload for seq, payload, _ in st.batches}
    same = [seq for seq, payload, _ in got if live.get(seq) == payload]
    check(len(same) == len(live), "replayed %d of %d live batches byte for byte"
          % (len(same), len(live)))
    return len(got)


def main():
    for p in (KVTIERD, KVTIERCTL):
        if not os.access(p, os.X_OK):
            print("test_events_vllm: FAIL: %s is not built" % p)
            return 1
    ctx = zmq.Context()
    try:
        d = Daemon()
    except Fail as e:
        print("test_events_vllm: FAIL: %s" % e)
        return 1
    try:
        st = Stream(ctx, d.port)
        sync(d, st)
        scenario(d, st)
        n_replay = replay(d, ctx, st)
        st.sub.close(linger=0)
    except (Fail, msgspec.ValidationError, msgspec.DecodeError, zmq.ZMQError) as e:
        # A payload vLLM's decoder refuses lands here too.
        sys.stderr.write("kvtierd log (tail):\n%s\n" % d.log_text())
        print("test_events_vllm: FAIL: %s: %s" % (type(e).__name__, e))
        return 1
    finally:
        d.stop()
        ctx.term()
    widest = max((len(getattr(ev, "block_hashes", [])) for _, _, b in st.batches
                  for ev in b.events), default=0)
    print("test_events_vllm: PASS: %d live batches (%d events, up to %d hashes in one) "
          "and %d replayed, all decoded by vLLM's KVEventBatch"
          % (len(st.batches), sum(len(b.events) for _, _, b in st.batches), widest, n_replay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
