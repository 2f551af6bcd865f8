#!/usr/bin/env python3
"""bench_fleet.py -- N real kvtierd in one insecure cluster on loopback,
against the membership simulator at the same N (see bench/bench_fleet.sh,
which runs this; BENCHMARKS.md "Membership with real daemons").

For each N and each backend (swim; etcd when etcd is installed):
  idle   converged and serving nothing for --idle seconds: membership
         messages and bytes per node per second (tx, from each daemon's
         /metrics), CPU per daemon and of the whole cluster (utime+stime
         from /proc), fds and RSS per daemon; etcd's own CPU
  crash  kill -9 of one daemon: seconds until the first and until every
         other daemon's /metrics no longer counts it live (alive or suspect)
  join   one more daemon started: seconds until every daemon's view counts
         every running daemon live (alive or suspect) and nothing else
  leave  one daemon sent SIGTERM (explicit leave): seconds until every
         other daemon no longer counts it live; how many count it dead
  stop   SIGTERM to all at once: seconds until every one exited, how many
         exited 0, how many needed SIGKILL (still running after --stop-bound)
Then swimsim --bench --only clean,crash1%,join,leave at the same N, and
the two side by side. The membership knobs are the daemon's defaults
(printed from kvtierd --print-config): nothing here sets them.

Views are polled from /metrics (kvtier_peers{state=...}: the membership
backend's view) about every --poll seconds, all daemons each round; a
time is stamped when that daemon's answer arrives. After each phase every
daemon's kvtierctl peers --json is checked against the truth (ids and
states), untimed, and any mismatch printed.

Every daemon and etcd started here gets SIGKILL when this process exits,
however it exits (prctl PDEATHSIG, plus a kill of every pid at exit and
on SIGTERM/SIGINT/SIGHUP).
"""
import argparse
import atexit
import ctypes
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HZ = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
CHILDREN = []          # every Popen started here
TMPDIRS = []


def _pdeathsig():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def kill_all():
    for p in CHILDREN:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in CHILDREN:
        try:
            p.wait(timeout=5)
        except Exception:
            pass
    for d in TMPDIRS:
        shutil.rmtree(d, ignore_errors=True)


def on_signal(sig, _frm):
    kill_all()
    sys.exit(128 + sig)


atexit.register(kill_all)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, on_signal)


def spawn(argv, log, env=None):
    f = open(log, "ab")
    p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         preexec_fn=_pdeathsig, env=env)
    f.close()
    CHILDREN.append(p)
    return p


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def now():
    return time.monotonic()


def loadavg():
    return "%.2f %.2f %.2f" % os.getloadavg()


# ------------------------------------------------------------ /proc figures

def cpu_ticks(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
        fields = s[s.rindex(")") + 2:].split()
        return int(fields[11]) + int(fields[12])   # utime + stime
    except (OSError, ValueError):
        return None


def per_thread(pids, path, value):
    """value(text of /proc/PID/task/TID/<path>) summed by thread name (digits
    at the end of a name folded into #) over the threads of pids."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir("/proc/%d/task" % pid)
        except OSError:
            continue
        for tid in tids:
            try:
                with open("/proc/%d/task/%s/%s" % (pid, tid, path)) as f:
                    text = f.read()
                with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                    name = re.sub(r"\d+$", "#", f.read().strip())
            except OSError:
                continue
            out[name] = out.get(name, 0) + value(text)
    return out


def _ticks(st):
    fields = st[st.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def _switches(status):
    st = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
    return int(st["voluntary_ctxt_switches"]) + int(st["nonvoluntary_ctxt_switches"])


def thread_ticks(pids):
    """utime + stime by thread name over the threads of pids."""
    return per_thread(pids, "stat", _ticks)


def thread_switches(pids):
    """Context switches (voluntary + not) by thread name over the threads of
    pids: how often each thread woke, whatever the load."""
    return per_thread(pids, "status", _switches)


def rss_kib(pid):
    try:
        with open("/proc/%d/statm" % pid) as f:
            return int(f.read().split()[1]) * PAGE // 1024
    except (OSError, ValueError):
        return None


def n_fds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return None


def n_threads(pid):
    try:
        return len(os.listdir("/proc/%d/task" % pid))
    except OSError:
        return None


# ----------------------------------------------------------------- metrics

METRIC = re.compile(r'^(kvtier_peers|kvtier_cluster_membership_(?:messages|bytes)_total|'
                    r'kvtier_cluster_(?:suspicions|refutations|false_deaths)_total|'
                    r'kvtier_index_entries_moved_total)'
                    r'(?:\{([^}]*)\})? (\d+)$', re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(port, timeout=2.0):
    """{'peers': {state: n}, 'msgs': {(type, dir): n}, 'bytes': ..., ...} or None."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
    except (OSError, http.client.HTTPException):
        return None
    out = {"peers": {}, "msgs": {}, "bytes": {}, "t": now()}
    for name, labels, val in METRIC.findall(text):
        lab = dict(LABEL.findall(labels or ""))
        v = int(val)
        if name == "kvtier_peers":
            out["peers"][lab["state"]] = v
        elif name.endswith("messages_total"):
            out["msgs"][(lab["type"], lab["dir"])] = v
        elif name.endswith("bytes_total"):
            out["bytes"][(lab["type"], lab["dir"])] = v
        else:
            out[name.split("_")[2]] = v
    return out


def live(m):
    return m["peers"].get("alive", 0) + m["peers"].get("suspect", 0)


# ----------------------------------------------------------------- daemons

class Node:
    def __init__(self, fleet, nid):
        self.id = nid
        self.dir = os.path.join(fleet.dir, "n%d" % nid)
        os.makedirs(self.dir, exist_ok=True)
        self.log = os.path.join(self.dir, "log")
        self.sock = os.path.join(self.dir, "s")
        self.url = "tcp://127.0.0.1:%d" % (fleet.base + nid)
        self.port = None
        self.proc = None
        self.exit = None


class Fleet:
    def __init__(self, args, backend, etcd_url=None):
        self.a = args
        self.backend = backend
        self.etcd_url = etcd_url
        self.dir = tempfile.mkdtemp(prefix="kvt-fleet.")
        TMPDIRS.append(self.dir)
        # below the ephemeral range: a listen port there can be taken by one
        # of the thousands of connections the daemons dial (bind fails, the
        # daemon exits 1)
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
                low = int(fh.read().split()[0])
        except (OSError, ValueError):
            low = 32768
        self.base = 10000 + random.randrange(max(1, low - 10000 - 2 * args.max_id))
        self.nodes = {}
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.prefix = "/kvt-bench/%s/" % os.path.basename(self.dir)
        self.told = set()       # ids killed or stopped on purpose
        self.reported = set()
        self.n_unexpected = 0

    def start(self, nid, seed):
        n = Node(self, nid)
        argv = [self.a.kvtierd, "--socket", "ipc://" + n.sock, "--state-dir", n.dir,
                "--pool-path", os.path.join(n.dir, "pool"), "--pool-bytes", "16M",
                "--metrics.listen", "127.0.0.1:0", "--cluster.node_id", str(nid),
                "--cluster.listen", n.url, "--cluster.insecure", "1"]
        if self.backend == "etcd":
            argv += ["--cluster.membership", "etcd", "--cluster.etcd_endpoints", self.etcd_url,
                     "--cluster.etcd_prefix", self.prefix]
        else:
            argv += ["--cluster.seeds", seed]
        n.proc = spawn(argv, n.log)
        n.t_spawn = now()
        self.nodes[nid] = n
        return n

    def find_port(self, n, deadline):
        pat = re.compile(rb"serving http://127\.0\.0\.1:(\d+)/metrics")
        while now() < deadline:
            try:
                with open(n.log, "rb") as f:
                    m = pat.search(f.read())
                if m:
                    n.port = int(m.group(1))
                    return True
            except OSError:
                pass
            if n.proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False

    def unexpected_exits(self, what):
        """Print every daemon that exited without being told to (once each)."""
        n_bad = 0
        for n in self.nodes.values():
            if n.proc.poll() is None or n.id in self.told or n.id in self.reported:
                continue
            self.reported.add(n.id)
            n_bad += 1
            tail = open(n.log, errors="replace").read().strip().splitlines()[-3:]
            print("  UNEXPECTED by the end of %s: node %d exited, status %s; log ends: %s" % (
                what, n.id, n.proc.returncode, " | ".join(tail)))
        self.n_unexpected += n_bad
        return n_bad

    def running(self):
        return [n for n in self.nodes.values() if n.proc.poll() is None]

    def scrape_all(self, nodes):
        return list(self.pool.map(lambda n: (n, scrape(n.port)), nodes))

    def wait_views(self, pred, nodes_fn, limit, poll):
        """Poll until pred(node, metrics) holds for every node of nodes_fn();
        returns ({id: first time it held and kept holding}, done_at or None)."""
        first = {}
        t_end = now() + limit
        while now() < t_end:
            nodes = nodes_fn()
            ok = True
            for n, m in self.scrape_all(nodes):
                if m is not None and pred(n, m):
                    first.setdefault(n.id, m["t"])
                else:
                    first.pop(n.id, None)
                    ok = False
            if ok and nodes:
                return first, max(first[n.id] for n in nodes)
            time.sleep(poll)
        return first, None

    def peers_json(self, n):
        try:
            r = subprocess.run([self.a.kvtierctl, "--socket", "ipc://" + n.sock, "peers",
                                "--json"], capture_output=True, timeout=10, text=True)
            return json.loads(r.stdout) if r.returncode == 0 else None
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None

    def mismatches(self, truth):
        """Every running node's kvtierctl peers against truth {id: state};
        ids missing from truth must be absent or not alive/suspect."""
        bad = []
        nodes = self.running()
        self.unproven = 0
        for n, p in zip(nodes, self.pool.map(self.peers_json, nodes)):
            if p is None:
                bad.append("%d: no answer" % n.id)
                continue
            self.unproven += p.get("unproven", 0)
            seen = {q["node_id"]: q["state"] for q in p["peers"]}
            for nid, st in truth.items():
                if nid == n.id:
                    continue
                got = seen.get(nid, "absent")
                want = st.split("|")
                if got not in want and not ("absent" in want and got == "absent"):
                    bad.append("%d sees %d %s (want %s)" % (n.id, nid, got, st))
            for nid, st in seen.items():
                if nid not in truth and st in ("alive", "suspect"):
                    bad.append("%d sees unknown %d %s" % (n.id, nid, st))
        return bad

    def wait_exact(self, truth, limit):
        """Poll kvtierctl peers until every view matches truth: when, or None."""
        end = now() + limit
        while now() < end:
            if not self.mismatches(truth):
                return now()
        return None

    def check_exact(self, truth, what):
        bad = self.mismatches(truth)
        if bad:
            print("  exact check after %s: %d mismatches: %s" % (what, len(bad),
                  "; ".join(bad[:8])))
        else:
            print("  exact check after %s: every view (kvtierctl peers) matches; messages "
                  "refused from unproven senders so far, all daemons: %d" % (what, self.unproven))
        return len(bad)


def pct(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    i = min(len(v) - 1, max(0, int(round(q / 100.0 * (len(v) - 1)))))
    return v[i]


def counters_sum(m, key, direction="tx"):
    return sum(v for (t, d), v in m[key].items() if d == direction)


def by_type(m0, m1, key, secs, n):
    out = {}
    for (t, d), v in m1[key].items():
        if d != "tx":
            continue
        dv = v - m0[key].get((t, d), 0)
        if dv:
            out[t] = dv / secs / n
    return out


# ------------------------------------------------------------------ phases

def load_keys(f, nodes, k):
    """k chunks of 4 KiB put on each node (the Python client over the build's
    libkvtier): what the global index then publishes to their owners."""
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(top, "client", "python"))
    os.environ.setdefault("KVTIER_LIB", os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(f.a.kvtierd))), "lib", "libkvtier.so"))
    import kvtier  # noqa: E402 -- only when keys are asked for
    for n in nodes:
        with kvtier.Client("ipc://" + n.sock, timeout_ms=10000) as c:
            for b in range(0, k, 32):
                keys = [os.urandom(32) for _ in range(min(32, k - b))]
                c.put("bench/fleet", keys, [os.urandom(4096) for _ in keys])


def moved(f, nodes):
    """kvtier_index_entries_moved_total summed over nodes (None if any is
    missing)."""
    tot = 0
    for _, m in f.scrape_all(nodes):
        if m is None or "entries" not in m:
            return None
        tot += m["entries"]
    return tot


def settle_moves(f, nodes_fn, limit):
    """The moved total once it has not changed for 2 s (the planner's passes
    are debounced), or the last seen after limit s."""
    last, since, t0 = moved(f, nodes_fn()), now(), now()
    while now() - t0 < limit:
        time.sleep(0.25)
        v = moved(f, nodes_fn())
        if v != last:
            last, since = v, now()
        elif now() - since >= 2:
            break
    return last


def run_one(args, N, backend, etcd=None):
    print("\n== %s, N = %d (load average %s, %s UTC)" % (
        backend, N, loadavg(), time.strftime("%H:%M:%S", time.gmtime())))
    res = {"N": N, "backend": backend}
    f = Fleet(args, backend, etcd and etcd["url"])
    seed = "tcp://127.0.0.1:%d" % (f.base + 1)
    t0 = now()
    for i in range(1, N + 1):
        f.start(i, seed if i > 1 else "")
        time.sleep(args.stagger)
    for n in list(f.nodes.values()):
        if not f.find_port(n, now() + 30):
            print("  node %d did not come up; log %s:" % (n.id, n.log))
            print(open(n.log, errors="replace").read()[-2000:])
            return None
    all_ids = set(f.nodes)
    print("  all %d daemons' metrics answered %.1f s after the first start" % (N, now() - t0))

    def converged(n, m):
        return live(m) == len(f.running()) - 1 and m["peers"].get("dead", 0) == 0
    first, done = f.wait_views(converged, f.running, args.converge_limit, args.poll)
    late = sorted((t - t0, i) for i, t in first.items())
    if late:
        print("  forming: half the views complete %.1f s after the first start, the last "
              "three (node, s): %s" % (late[len(late) // 2][0], ", ".join(
                  "%d %.1f" % (i, t) for t, i in late[-3:])))
    if done is None:
        print("  did not converge within %d s" % args.converge_limit)
        res["formed"] = None
    else:
        res["formed"] = done - t0
        print("  formed: every view counts %d live %.1f s after the first start" %
              (N - 1, done - t0))
    time.sleep(args.settle)
    f.unexpected_exits("forming")
    f.check_exact({i: "alive" for i in all_ids}, "forming")
    if args.form_only:
        for n in f.running():
            n.proc.kill()
            n.proc.wait()
        f.pool.shutdown()
        return res

    # ---- idle
    nodes = f.running()
    la0 = loadavg()
    p0 = dict(zip([n.id for n in nodes], f.pool.map(f.peers_json, nodes)))
    m0 = dict((n.id, m) for n, m in f.scrape_all(nodes))
    c0 = {n.id: cpu_ticks(n.proc.pid) for n in nodes}
    th0 = thread_ticks([n.proc.pid for n in nodes])
    sw0 = thread_switches([n.proc.pid for n in nodes])
    e0 = cpu_ticks(etcd["proc"].pid) if etcd else None
    ec0 = etcd_counters(etcd["url"]) if etcd else None
    w0 = now()
    time.sleep(args.idle)
    w1 = now()
    c1 = {n.id: cpu_ticks(n.proc.pid) for n in nodes}
    th1 = thread_ticks([n.proc.pid for n in nodes])
    sw1 = thread_switches([n.proc.pid for n in nodes])
    e1 = cpu_ticks(etcd["proc"].pid) if etcd else None
    ec1 = etcd_counters(etcd["url"]) if etcd else None
    m1 = dict((n.id, m) for n, m in f.scrape_all(nodes))
    p1 = dict(zip([n.id for n in nodes], f.pool.map(f.peers_json, nodes)))
    secs = w1 - w0
    ok = [n.id for n in nodes if m0.get(n.id) and m1.get(n.id) and c0[n.id] is not None
          and c1[n.id] is not None]
    cpu = [(c1[i] - c0[i]) / HZ for i in ok]
    tot_cpu = sum(cpu)
    msgs = [(counters_sum(m1[i], "msgs") - counters_sum(m0[i], "msgs")) / secs for i in ok]
    byts = [(counters_sum(m1[i], "bytes") - counters_sum(m0[i], "bytes")) / secs for i in ok]
    rx = [(counters_sum(m1[i], "msgs", "rx") - counters_sum(m0[i], "msgs", "rx")) / secs
          for i in ok]
    types = {}
    for i in ok:
        for t, v in by_type(m0[i], m1[i], "msgs", secs, len(ok)).items():
            types[t] = types.get(t, 0) + v
    btypes = {}
    for i in ok:
        for t, v in by_type(m0[i], m1[i], "bytes", secs, len(ok)).items():
            btypes[t] = btypes.get(t, 0) + v
    susp = sum(m1[i].get("suspicions", 0) - m0[i].get("suspicions", 0) for i in ok)
    fds = [n_fds(n.proc.pid) for n in nodes]
    rss = [rss_kib(n.proc.pid) for n in nodes]
    thr = [n_threads(n.proc.pid) for n in nodes]
    res.update(msgs=sum(msgs) / len(ok), bytes=sum(byts) / len(ok), cores=tot_cpu / secs,
               cpu_per=tot_cpu / secs / len(ok), fds=sum(fds) / len(fds),
               rss=sum(rss) / len(rss) / 1024.0, idle_s=secs)
    print("  idle %.0f s (load average %s -> %s): per node %.2f msgs/s sent (%.2f received), "
          "%.0f B/s sent; by type msgs/s %s; B/s %s; suspicions %d" % (
              secs, la0, loadavg(), res["msgs"], sum(rx) / len(ok), res["bytes"],
              ", ".join("%s %.2f" % kv for kv in sorted(types.items())),
              ", ".join("%s %.0f" % kv for kv in sorted(btypes.items())), susp))
    wire = []
    heavy = 0
    for i in ok:
        if p0.get(i) and p1.get(i):
            out0 = {q["node_id"]: q["bytes_out"] for q in p0[i]["peers"]}
            for q in p1[i]["peers"]:
                if (q["bytes_out"] - out0.get(q["node_id"], q["bytes_out"])) / secs > 400:
                    heavy += 1
            b0 = sum(q["bytes_out"] for q in p0[i]["peers"])
            b1 = sum(q["bytes_out"] for q in p1[i]["peers"])
            wire.append((b1 - b0) / secs)
    if wire:
        res["wire"] = sum(wire) / len(wire)
        res["heavy_pairs"] = heavy
        print("  idle: per node %.0f B/s sent on the daemon-to-daemon channel, every message "
              "(kvtierctl peers bytes_out: membership, hello, index); %d directed pairs sent "
              "more than 400 B/s (hello Heartbeats still going)" % (res["wire"], heavy))
    print("  idle CPU: cluster %.3f cores (%.2f CPU-s per 10 s), per daemon %.2f%% of a core "
          "(min %.2f%%, max %.2f%%)" % (
              tot_cpu / secs, tot_cpu / secs * 10, 100 * res["cpu_per"],
              100 * min(cpu) / secs, 100 * max(cpu) / secs))
    th = sorted(((v - th0.get(k, 0), k) for k, v in th1.items()), reverse=True)
    print("  idle CPU by thread name, all daemons, %% of a core: %s" % ", ".join(
        "%s %.2f" % (k, 100.0 * v / HZ / secs) for v, k in th[:6] if v > 0))
    sw = sorted(((v - sw0.get(k, 0), k) for k, v in sw1.items()), reverse=True)
    res["wakes"] = dict((k, v / secs / len(ok)) for v, k in sw)
    print("  idle wakeups by thread name, per daemon per second: %s" % ", ".join(
        "%s %.1f" % (k, v / secs / len(ok)) for v, k in sw[:6] if v > 0))
    print("  per daemon: fds %.1f (max %d), RSS %.1f MiB (max %.1f), threads %.1f" % (
        res["fds"], max(fds), res["rss"], max(rss) / 1024.0, sum(thr) / len(thr)))
    if etcd:
        res["etcd_cores"] = (e1 - e0) / HZ / secs
        res["etcd_rss"] = rss_kib(etcd["proc"].pid) / 1024.0
        print("  etcd: %.3f cores (%.2f CPU-s per 10 s), RSS %.1f MiB" % (
            res["etcd_cores"], res["etcd_cores"] * 10, res["etcd_rss"]))
        if ec0 and ec1:
            k = secs * len(ok)
            res["etcd_rpcs"] = (ec1["rpcs"] - ec0["rpcs"]) / k
            res["etcd_bytes"] = (ec1["rx"] + ec1["tx"] - ec0["rx"] - ec0["tx"]) / k
            print("  etcd per daemon: %.2f unary requests/s finished, %.0f B/s gRPC client "
                  "bytes (both ways; the JSON gateway's requests reach etcd as gRPC)" % (
                      res["etcd_rpcs"], res["etcd_bytes"]))

    # ---- the global index: K chunks a node, then entries moved per change
    moves = {}
    if args.keys:
        load_keys(f, f.running(), args.keys)
        mv0 = settle_moves(f, f.running, 20)
        print("  index: %d chunks put on each of %d daemons (R = %d); entries moved so far %s" % (
            args.keys, len(f.running()), args.replicas, mv0))

    # ---- crash
    victim = f.nodes[max(2, N // 2)]
    others = lambda: [n for n in f.running() if n is not victim]  # noqa: E731
    f.unexpected_exits("the idle window")
    f.told.add(victim.id)
    victim.proc.kill()
    tk = now()
    victim.proc.wait()
    first, done = f.wait_views(lambda n, m: live(m) == len(others()) - 1, others,
                               args.detect_limit, args.poll)
    det = [t - tk for t in first.values()]
    res["det_first"] = min(det) if det else None
    res["det_all"] = done - tk if done else None
    res["det50"] = pct(det, 50) if det else None
    if done:
        print("  crash (kill -9 of node %d): first view drops it (dead) %.2f s, "
              "median observer %.2f s, every observer %.2f s" % (victim.id, res["det_first"], res["det50"],
                                         res["det_all"]))
    else:
        print("  crash (kill -9 of node %d): %d of %d observers saw it dead within %d s" % (
            victim.id, len(first), len(others()), args.detect_limit))
    truth = {i: "alive" for i in all_ids}
    truth[victim.id] = "dead|absent"
    f.unexpected_exits("the crash")
    f.check_exact(truth, "the crash")
    if args.keys:
        mv1 = settle_moves(f, others, 20)
        moves["crash"] = (mv1 - mv0) if None not in (mv0, mv1) else None
        mv0 = mv1

    # ---- join
    jid = N + 1
    tj = now()
    newbie = f.start(jid, seed)
    if not f.find_port(newbie, now() + 30):
        print("  joiner did not come up")
        return res
    tup = now()
    all_ids.add(jid)
    _, done = f.wait_views(lambda n, m: live(m) == len(others()) - 1, others,
                           args.detect_limit, args.poll)
    res["join"] = done - tj if done else None
    res["join_up"] = done - tup if done else None
    if done:
        print("  join (node %d started): every view counts it %.2f s after the spawn "
              "(%.2f s after its metrics answered)" % (jid, res["join"], res["join_up"]))
    else:
        print("  join: not converged within %d s" % args.detect_limit)
    truth[jid] = "alive"
    done = f.wait_exact(truth, args.detect_limit)
    res["join_hello"] = done - tj if done else None
    print("  join: every daemon's own table (kvtierctl peers, hello done) has it alive "
          "%s s after the spawn" % fmt(res["join_hello"]))
    if args.keys:
        mv1 = settle_moves(f, others, 20)
        moves["join"] = (mv1 - mv0) if None not in (mv0, mv1) else None
        mv0 = mv1

    # ---- leave
    leaver = f.nodes[N]
    gone = {victim.id, leaver.id}
    rest = lambda: [n for n in f.running() if n.id not in gone]  # noqa: E731
    base_dead = {n.id: m["peers"].get("dead", 0) for n, m in f.scrape_all(rest())
                 if m is not None}
    f.unexpected_exits("the join")
    f.told.add(leaver.id)
    leaver.proc.send_signal(signal.SIGTERM)
    tl = now()
    _, done = f.wait_views(lambda n, m: live(m) == len(rest()) - 1, rest, args.detect_limit,
                           args.poll)
    res["leave"] = done - tl if done else None
    try:
        leaver.exit = leaver.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        leaver.proc.kill()
        leaver.exit = "killed"
    t_exit = now() - tl
    dead_more = sum(1 for n, m in f.scrape_all(rest()) if m is not None and
                    m["peers"].get("dead", 0) > base_dead.get(n.id, 0))
    if done:
        print("  leave (SIGTERM to node %d): every view drops it %.2f s after the "
              "signal; it exited %s after %.2f s; %d views count it dead" % (
                  leaver.id, res["leave"], leaver.exit, t_exit, dead_more))
    else:
        print("  leave: not converged within %d s" % args.detect_limit)
    truth[leaver.id] = "left|absent"
    f.check_exact(truth, "the leave")
    if args.keys:
        mv1 = settle_moves(f, rest, 20)
        # the leaver's own hand-off is counted by it and gone with it
        moves["leave"] = (mv1 - mv0) if None not in (mv0, mv1) else None
        # Each change leaves N - 1 holders of K keys (the crashed or leaving
        # node's own keys go with it; the joiner holds none), and a key's
        # owner set held (crash, leave) or now holds (join) the member that
        # changed with probability R / N: the keys whose owners changed.
        ideal = args.replicas * args.keys * (N - 1) / N
        res["moves"] = moves
        res["moves_ideal"] = ideal
        print("  index entries moved per change (sum of the daemons' "
              "kvtier_index_entries_moved_total), against the keys whose owners changed "
              "(R K (N-1) / N = %.0f): %s" % (ideal, ", ".join(
                  "%s %s (%s x)" % (k, moves.get(k), fmt(moves[k] / ideal if moves.get(k)
                                                         is not None else None))
                  for k in ("crash", "join", "leave"))))

    f.unexpected_exits("the leave")
    res["unexpected"] = f.n_unexpected

    # ---- stop
    nodes = f.running()
    ts = now()
    for n in nodes:
        n.proc.send_signal(signal.SIGTERM)
    pending = set(nodes)
    while pending and now() - ts < args.stop_bound:
        for n in list(pending):
            if n.proc.poll() is not None:
                n.exit = n.proc.returncode
                n.t_exit = now() - ts
                pending.discard(n)
        time.sleep(0.05)
    hung = len(pending)
    for n in pending:
        n.proc.kill()
        n.proc.wait()
        n.exit = "killed"
    ex = [n for n in nodes if n not in pending]
    res["stop"] = max(n.t_exit for n in ex) if ex else None
    res["stop_hung"] = hung
    zero = sum(1 for n in ex if n.exit == 0)
    cb = sum(1 for n in nodes if b"did not close within" in open(n.log, "rb").read())
    gd = sum(1 for n in nodes if b"stop did not finish" in open(n.log, "rb").read())
    print("  stop (SIGTERM to %d at once): all exited in %.2f s (median %.2f s), %d exited 0, "
          "%d needed SIGKILL after %d s; close bound hit by %d, stop guard by %d" % (
              len(nodes), res["stop"] or -1, pct([n.t_exit for n in ex], 50) if ex else -1,
              zero, hung, args.stop_bound, cb, gd))
    if args.keep_logs:
        print("  logs kept in %s" % f.dir)
        TMPDIRS.remove(f.dir)
    f.pool.shutdown()
    return res


def start_etcd():
    if not shutil.which("etcd"):
        return None
    d = tempfile.mkdtemp(prefix="kvt-fleet-etcd.")
    TMPDIRS.append(d)
    url = "http://127.0.0.1:%d" % free_port()
    peer = "http://127.0.0.1:%d" % free_port()
    p = spawn(["etcd", "--data-dir", os.path.join(d, "data"), "--listen-client-urls", url,
               "--advertise-client-urls", url, "--listen-peer-urls", peer,
               "--initial-advertise-peer-urls", peer, "--initial-cluster", "default=" + peer],
              os.path.join(d, "etcd.log"))
    end = now() + 20
    while now() < end:
        try:
            c = http.client.HTTPConnection(url[7:].split(":")[0], int(url.rsplit(":", 1)[1]),
                                           timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return {"proc": p, "url": url, "dir": d}
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.2)
    p.kill()
    return None


def etcd_counters(url):
    """etcd's own count of requests handled and client bytes, from its /metrics."""
    host, port = url[7:].rsplit(":", 1)
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=2)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode("utf-8", "replace")
        c.close()
    except (OSError, http.client.HTTPException):
        return None
    out = {"rpcs": 0.0, "rx": 0.0, "tx": 0.0}
    for line in text.splitlines():
        w = line.split()
        if len(w) != 2:
            continue
        if w[0].startswith("grpc_server_handled_total{"):
            out["rpcs"] += float(w[1])
        elif w[0] == "etcd_network_client_grpc_received_bytes_total":
            out["rx"] += float(w[1])
        elif w[0] == "etcd_network_client_grpc_sent_bytes_total":
            out["tx"] += float(w[1])
    return out


def stop_etcd(e):
    e["proc"].kill()
    e["proc"].wait()


# -------------------------------------------------------------- simulator

def run_sim(args, sizes):
    cmd = [args.swimsim, "--bench", "--only", "clean,crash1%,join,leave"] + [str(n) for n in sizes]
    print("\n== %s (load average %s)" % (" ".join(cmd), loadavg()))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.sim_limit)
    print(r.stdout, end="")
    rows = {}
    head = None
    for line in r.stdout.splitlines():
        w = line.split()
        if w and w[0] == "scenario":
            head = w
        elif head and len(w) == len(head):
            rows[(w[0], int(w[1]))] = dict(zip(head, w))
    return rows


def secs(v):
    v = v.rstrip("s")
    try:
        return float(v.split("/")[0])
    except ValueError:
        return None


def fmt(v, f="%.2f"):
    return "-" if v is None else f % v


def side_by_side(real, sim):
    print("\n== real daemons (swim) against swimsim, same N")
    print("%-5s %-24s %10s %10s %8s" % ("N", "figure", "real", "sim", "real/sim"))
    for r in real:
        if r is None or r["backend"] != "swim":
            continue
        N = r["N"]
        c = sim.get(("clean", N), {})
        k = sim.get(("crash1%", N), {})
        j = sim.get(("join", N), {})
        lv = sim.get(("leave", N), {})
        pairs = [("msgs/s per node (idle)", r.get("msgs"), c.get("msg/n/s") and float(c["msg/n/s"])),
                 ("B/s per node (idle)", r.get("bytes"), c.get("B/n/s") and float(c["B/n/s"])),
                 ("crash: first view s", r.get("det_first"), k.get("det50/99") and secs(k["det50/99"])),
                 ("crash: every view s", r.get("det_all"),
                  k.get("all50/99") and float(k["all50/99"].split("/")[1])),
                 ("join converge s", r.get("join"), j.get("converge") and secs(j["converge"])),
                 ("leave converge s", r.get("leave"), lv.get("converge") and secs(lv["converge"]))]
        for name, a, b in pairs:
            ratio = "%.2f" % (a / b) if a is not None and b else "-"
            print("%-5d %-24s %10s %10s %8s" % (N, name, fmt(a), fmt(b), ratio))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", type=int, default=[20, 60])
    ap.add_argument("--kvtierd", default=os.environ.get("KVTIERD", "build/bin/kvtierd"))
    ap.add_argument("--kvtierctl", default=None)
    ap.add_argument("--swimsim", default=None)
    ap.add_argument("--backends", default="swim,etcd")
    ap.add_argument("--idle", type=float, default=60, help="idle window, s")
    ap.add_argument("--settle", type=float, default=5, help="after convergence, s")
    ap.add_argument("--stagger", type=float, default=0.02, help="between starts, s")
    ap.add_argument("--poll", type=float, default=0.1)
    ap.add_argument("--converge-limit", type=int, default=120)
    ap.add_argument("--detect-limit", type=int, default=90)
    ap.add_argument("--stop-bound", type=int, default=30)
    ap.add_argument("--sim-limit", type=int, default=1200)
    ap.add_argument("--no-sim", action="store_true")
    ap.add_argument("--form-only", action="store_true",
                    help="only form the cluster (how long until every view is complete)")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--keys", type=int, default=100,
                    help="chunks put on each daemon for the index moves (0: none)")
    ap.add_argument("--replicas", type=int, default=2, help="the daemons' cluster.replicas")
    a = ap.parse_args()
    a.max_id = max(a.sizes) + 2
    a.kvtierd = os.path.realpath(a.kvtierd)
    bdir = os.path.dirname(os.path.dirname(a.kvtierd))
    a.kvtierctl = a.kvtierctl or os.path.join(bdir, "bin", "kvtierctl")
    a.swimsim = a.swimsim or os.path.join(bdir, "tests", "sim", "swimsim")
    if not os.access(a.kvtierd, os.X_OK):
        print("bench_fleet: no kvtierd at %s" % a.kvtierd, file=sys.stderr)
        return 2
    cfg = subprocess.run([a.kvtierd, "--print-config"], capture_output=True, text=True).stdout
    sec = cfg.split("[cluster]", 1)[-1].split("\n[", 1)[0]
    knobs = re.findall(r"^#(probe_ms|probe_timeout_ms|suspicion_mult|reap_ms|max_conns|"
                       r"etcd_lease_s|rx_queue_max|heartbeat_ms) = (\S+)", sec, re.M)
    print("kvtierd %s; membership defaults: %s" % (a.kvtierd, ", ".join("%s %s" % k for k in knobs)))
    print("machine: %d CPUs, load average %s" % (os.cpu_count(), loadavg()))
    results = []
    for backend in a.backends.split(","):
        etcd = None
        if backend == "etcd":
            etcd = start_etcd()
            if etcd is None:
                print("\n== etcd: not installed or did not start; etcd runs skipped")
                continue
        for N in a.sizes:
            results.append(run_one(a, N, backend, etcd))
        if etcd:
            stop_etcd(etcd)
    left = [p for p in CHILDREN if p.poll() is None]
    if left:
        print("bench_fleet: %d processes still running at the end (killed)" % len(left))
    if not a.no_sim and os.access(a.swimsim, os.X_OK):
        side_by_side(results, run_sim(a, a.sizes))
    bad = [r for r in results if r is None or r.get("unexpected")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
