#!/usr/bin/env bash
# Deployment files, checked as a packager and an operator would meet them:
# `make install` (PREFIX and DESTDIR layouts, pkg-config, config kept on
# reinstall), the unit through `systemd-analyze verify` with no output
# allowed, deploy/kvtierd.conf equal to what the key table generates, the
# man pages covering every key and every metric family and rendering
# without warnings, and the DaemonSet YAML and Grafana JSON parsed, with
# the dashboard using only series the daemon exposes.
set -u
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d /tmp/kvt-deploy-XXXXXX)
pool=/dev/shm/kvt-deploy-$$.pool
dpid=
cleanup() {
    [ -n "$dpid" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
    rm -rf "$tmp" "$pool"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
py=/usr/bin/python3

# ------------------------------------------------------------ make install
build=$(dirname "$(dirname "$KVTIERD")")   # the build dir the suite runs from
case "$(cd "$build" && pwd)" in "$PWD"|"$PWD/") fail "KVTIERD=$KVTIERD is not inside a build directory";; esac
mk=(make -s --no-print-directory BUILD="$build")
[ -n "${KVT_SAN:-}" ] && mk+=(SAN=1 OPT=-O1)
"${mk[@]}" install PREFIX="$tmp/usr" >"$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; fail "make install PREFIX"; }
p=$tmp/usr
for f in bin/kvtierd bin/kvtierctl lib/libkvtier.so.0 lib/libkvtier.so lib/libkvtier.a \
         include/kvtier.h lib/pkgconfig/kvtier.pc lib/systemd/system/kvtierd.service \
         lib/sysusers.d/kvtier.conf etc/kvtier/kvtierd.conf share/man/man1/kvtierctl.1 \
         share/man/man5/kvtier.conf.5 share/man/man8/kvtierd.8; do
    [ -e "$p/$f" ] || fail "make install did not install $f"
done
grep -qx "prefix=$p" "$p/lib/pkgconfig/kvtier.pc" || fail "kvtier.pc prefix is not $p"
if command -v pkg-config >/dev/null; then
    PKG_CONFIG_PATH=$p/lib/pkgconfig pkg-config --libs kvtier | grep -q -- "-L$p/lib" ||
        fail "pkg-config --libs kvtier"
fi
grep -q "^ExecStart=$p/bin/kvtierd --config $p/etc/kvtier/kvtierd.conf$" \
    "$p/lib/systemd/system/kvtierd.service" || fail "unit paths not rewritten for PREFIX"

# Distro layout: DESTDIR + PREFIX=/usr puts the config in /etc; the unit is
# the committed one; a second install keeps an edited config.
d=$tmp/dest
"${mk[@]}" install DESTDIR="$d" PREFIX=/usr >"$tmp/make2.log" 2>&1 || { cat "$tmp/make2.log"; fail "make install DESTDIR"; }
cmp -s "$d/usr/lib/systemd/system/kvtierd.service" deploy/kvtierd.service ||
    fail "PREFIX=/usr unit differs from deploy/kvtierd.service"
[ -f "$d/etc/kvtier/kvtierd.conf" ] || fail "no $d/etc/kvtier/kvtierd.conf"
echo "# edited" >> "$d/etc/kvtier/kvtierd.conf"
"${mk[@]}" install DESTDIR="$d" PREFIX=/usr >/dev/null 2>&1 || fail "second install"
grep -q "^# edited" "$d/etc/kvtier/kvtierd.conf" || fail "reinstall overwrote the config"

# ------------------------------------------------------------ systemd unit
if ! command -v systemd-analyze >/dev/null; then
    echo "systemd-analyze not installed (scripts/deps.sh installs systemd)"; exit 77
fi
out=$(MANPATH=$p/share/man systemd-analyze verify "$p/lib/systemd/system/kvtierd.service" 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -qiE "not been booted with systemd|failed to (connect|initialize)"; then
    echo "systemd-analyze cannot run here: $(echo "$out" | head -n 1)"; exit 77
fi
[ $rc -eq 0 ] && [ -z "$out" ] || fail "systemd-analyze verify (rc $rc): $out"
for k in Type=notify User=kvtier LimitMEMLOCK=infinity ReadWritePaths=/dev/shm \
         "DeviceAllow=char-nvidia\* rw" StateDirectory=kvtier; do
    grep -q "^$k" deploy/kvtierd.service || fail "unit lacks $k"
done

# ------------------------------------------------------------ config file
deploy/gen-conf.sh "$KVTIERD" > "$tmp/gen.conf" || fail "gen-conf.sh"
diff -u deploy/kvtierd.conf "$tmp/gen.conf" ||
    fail "deploy/kvtierd.conf is stale: run deploy/gen-conf.sh build/bin/kvtierd > deploy/kvtierd.conf"
"$KVTIERD" --config deploy/kvtierd.conf --print-config >/dev/null || fail "deploy/kvtierd.conf does not load"

# ------------------------------------------------------------ man pages
for m in man/kvtierd.8 man/kvtierctl.1 man/kvtier.conf.5; do
    w=$(groff -man -Tutf8 -z -ww "$m" 2>&1)
    [ -z "$w" ] || fail "$m: groff warnings: $w"
done
"$KVTIERD" --print-config | $py -c '
import re, sys
man = open("man/kvtier.conf.5").read()
keys = re.findall(r"^#?(\w+) =(?: (.*))?$", sys.stdin.read(), re.M)
missing = [k for k, v in keys if ("\n.B %s\n" % k) not in man]
if missing: sys.exit("kvtier.conf(5) lacks keys %s: run man/update-keys.sh build/bin/kvtierd" % missing)
print(len(keys), "keys documented")' || fail "kvtier.conf.5 keys"

# --------------------------------------------------------- live metrics
"$KVTIERD" --socket "ipc://$tmp/s.sock" --state-dir "$tmp" --pool-path "$pool" \
    --pool-bytes 16M --metrics.listen 127.0.0.1:0 2>"$tmp/kvtierd.log" &
dpid=$!
for _ in $(seq 200); do grep -q "metrics: serving" "$tmp/kvtierd.log" && break; sleep 0.05; done
url=$(grep -o 'http://[0-9.:]*/metrics' "$tmp/kvtierd.log" | head -1)
[ -n "$url" ] || fail "no metrics url in the log"

$py - "$url" deploy/grafana/kvtier-dashboard.json deploy/k8s/kvtierd-daemonset.yaml <<'PY' || fail "metrics, dashboard or DaemonSet"
import json, re, sys, urllib.request, yaml
url, dash_path, ds_path = sys.argv[1:4]
text = urllib.request.urlopen(url, timeout=5).read().decode()
families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
man = open("man/kvtierd.8").read()
undocumented = sorted(f for f in families if f not in man)
if undocumented:
    sys.exit("kvtierd(8) METRICS lacks: %s" % undocumented)

dash = json.load(open(dash_path))
assert dash["panels"] and dash["title"], "dashboard without panels"
used = set()
for p in dash["panels"]:
    assert p["targets"], "panel %s has no targets" % p["title"]
    for t in p["targets"]:
        for m in re.findall(r"\bkvtier_\w+", t["expr"]):
            used.add(re.sub(r"_(bucket|sum|count)$", "", m) if "duration" in m else m)
unknown = sorted(used - families)
if unknown:
    sys.exit("dashboard uses series the daemon does not expose: %s" % unknown)
exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
for need in ("histogram_quantile", "kvtier_hit_chunks_total", "kvtier_miss_chunks_total",
             "kvtier_tier_bytes_in_total", "kvtier_tier_used_bytes"):
    assert need in exprs, "dashboard lacks " + need

docs = list(yaml.safe_load_all(open(ds_path)))
ds = [d for d in docs if d and d.get("kind") == "DaemonSet"]
assert len(ds) == 1, "want one DaemonSet"
spec = ds[0]["spec"]["template"]["spec"]
paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
for need in ("/dev/shm", "/run/kvtier", "/var/lib/kvtier"):
    assert need in paths, "no hostPath " + need
c = spec["containers"][0]
for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
    cmd = c[probe]["exec"]["command"]
    assert cmd[0] == "kvtierctl" and cmd[-1] == "status", probe + " does not run kvtierctl status"
assert c["resources"]["requests"] and c["resources"]["limits"], "no resources"
print("%d families, %d used by the dashboard, DaemonSet ok" % (len(families), len(used)))
PY
echo "deploy test passed"
