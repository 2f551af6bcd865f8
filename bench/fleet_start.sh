# fleet_start.sh -- sourced by the benches that start a cluster of real
# daemons (bench_conns.sh, bench_shutdown.sh).
#
# fleet_start N BIN DIR [daemon args...]: N kvtierd in one insecure
# cluster on loopback, node i in DIR/ni (its pool, state and log), all
# seeded through node 1, listen ports below the ephemeral range
# (32768-) the daemons dial from; each pid is appended to the caller's
# pids array. The caller kills them (a trap) whatever happens.
fleet_start() {
    local n=$1 bin=$2 dir=$3 base=$((10000 + RANDOM % 20000)) i d seed
    shift 3
    for i in $(seq 1 "$n"); do
        d=$dir/n$i
        mkdir -p "$d"
        seed=""
        [ "$i" -gt 1 ] && seed="tcp://127.0.0.1:$((base + 1))"
        "$bin" --socket "ipc://$d/s" --state-dir "$d" --pool-path "$d/pool" --pool-bytes 16M \
            --metrics.listen 127.0.0.1:0 --cluster.node_id "$i" \
            --cluster.listen "tcp://127.0.0.1:$((base + i))" --cluster.seeds "$seed" \
            --cluster.insecure 1 "$@" >"$d/log" 2>&1 &
        pids+=($!)
    done
}
