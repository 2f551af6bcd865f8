#!/usr/bin/env bash
# A real Prometheus scrapes a real kvtierd on loopback (1 s interval, a
# throw-away TSDB); after known traffic through kvtierctl the series read
# back through Prometheus's query API hold exactly that traffic, and every
# expression of the Grafana dashboard evaluates without error.
set -u
command -v prometheus >/dev/null || { echo "prometheus is not installed (scripts/deps.sh installs it)"; exit 77; }
tmp=$(mktemp -d /tmp/kvt-prom-XXXXXX)
pool=/dev/shm/kvt-prom-$$.pool
sock=$tmp/kvtierd.sock
dpid= ppid=
cleanup() {
    [ -n "$ppid" ] && kill "$ppid" 2>/dev/null && wait "$ppid" 2>/dev/null
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    rm -rf "$tmp" "$pool"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -n 20 "$tmp/kvtierd.log" "$tmp/prometheus.log"; exit 1; }
wait_for() { for _ in $(seq 300); do "$@" && return 0; sleep 0.1; done; return 1; }

"$KVTIERD" --socket "ipc://$sock" --state-dir "$tmp" --pool-path "$pool" \
    --pool-bytes 64M --metrics.listen 127.0.0.1:0 2>"$tmp/kvtierd.log" &
dpid=$!
wait_for grep -q "metrics: serving" "$tmp/kvtierd.log" || fail "kvtierd did not start"
target=$(grep -o 'http://[0-9.:]*/metrics' "$tmp/kvtierd.log" | head -1 | sed 's|http://||; s|/metrics||')

# Traffic: 5 puts in ns "prom", one 3-key lookup with 2 hits, one get.
for i in 1 2 3 4 5; do
    head -c $((1000 * i)) /dev/urandom > "$tmp/c$i"
    k=$(printf '%064x' $i)
    "$KVTIERCTL" --socket "$sock" put --ns prom --key "$k" "$tmp/c$i" >/dev/null || fail "put $i"
done
"$KVTIERCTL" --socket "$sock" lookup --ns prom "$(printf '%064x' 1)" "$(printf '%064x' 2)" \
    "$(printf '%064x' 99)" >/dev/null || fail "lookup"
"$KVTIERCTL" --socket "$sock" get --ns prom --key "$(printf '%064x' 3)" -o "$tmp/out" || fail "get"

pport=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: kvtier
    static_configs:
      - targets: ["$target"]
YML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
    --web.listen-address="127.0.0.1:$pport" >"$tmp/prometheus.log" 2>&1 &
ppid=$!
api=http://127.0.0.1:$pport
up() { /usr/bin/python3 - "$api" <<'PY'
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/-/ready", timeout=2).read()
PY
}
if ! wait_for up 2>/dev/null; then
    kill -0 "$ppid" 2>/dev/null || { echo "prometheus cannot run here: $(tail -n 1 "$tmp/prometheus.log")"; exit 77; }
    fail "prometheus did not become ready"
fi

/usr/bin/python3 - "$api" "$tmp/kvtierd.log" deploy/grafana/kvtier-dashboard.json <<'PY' || fail "query checks"
import json, sys, time, urllib.parse, urllib.request
api, dash = sys.argv[1], sys.argv[3]

def query(q):
    url = api + "/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        d = json.load(r)
    if d["status"] != "success":
        raise SystemExit("query failed: %s: %s" % (q, d))
    return d["data"]["result"]

def value(q):
    r = query(q)
    return float(r[0]["value"][1]) if r else None

# Wait (up to 30 s) until a scrape after the traffic is in.
deadline = time.time() + 30
while time.time() < deadline and value('kvtier_puts_total{job="kvtier"}') != 5:
    time.sleep(0.5)
checks = {
    'up{job="kvtier"}': 1,
    'kvtier_puts_total': 5,
    'kvtier_tier_chunks{tier="dram"}': 5,
    'kvtier_tier_bytes_in_total{tier="dram"}': 15000,
    'kvtier_hit_chunks_total{ns="prom",op="lookup",tier="dram"}': 2,
    'kvtier_miss_chunks_total{ns="prom",op="lookup"}': 1,
    # kvtierctl get asks twice: once for the size, once for the bytes
    'kvtier_hit_chunks_total{ns="prom",op="get",tier="dram"}': 2,
    'kvtier_hit_bytes_total{ns="prom",op="get",tier="dram"}': 6000,
    'kvtier_namespace_bytes{ns="prom"}': 15000,
    'kvtier_tier_capacity_bytes{tier="dram"}': 64 << 20,
    'sum(kvtier_errors_total)': 0,
    'kvtier_request_duration_seconds_count{kind="lookup"}': 1,
    'kvtier_request_duration_seconds_bucket{kind="lookup",le="+Inf"}': 1,
}
bad = []
for q, want in checks.items():
    got = value(q)
    print("%-70s %s" % (q, got))
    if got != want:
        bad.append("%s = %s, want %s" % (q, got, want))
# A quantile over the histogram is a number of seconds.
q = value('histogram_quantile(0.99, sum by (le) (kvtier_request_duration_seconds_bucket{kind="put_begin"}))')
print("p99 put_begin", q)
if q is None or not (0 < q <= 2.5):
    bad.append("histogram_quantile gave %s" % q)
# Every dashboard expression is valid PromQL over these series.
for p in json.load(open(dash))["panels"]:
    for t in p["targets"]:
        e = (t["expr"].replace("$__rate_interval", "1m")
             .replace("$instance", ".*").replace("$ns", ".*"))
        query(e)  # raises on a parse or evaluation error
if bad:
    raise SystemExit("\n".join(bad))
print("prometheus test passed")
PY
