#!/usr/bin/env bash
# Each tier's room keeps its internals, and every tier is a leaf (DESIGN
# §4, STYLE §2 and §16):
#  - a room's *_int.h is included only by files inside that room, and a
#    room never includes another room's headers (white-box unit tests and
#    fuzz harnesses of one room, tests/unit and tests/fuzz, are the one
#    exception to the first rule);
#  - nothing under tiers/ includes the daemon's state (kvtierd.h) or names
#    struct kvtierd: a tier gets the core's services through tier_host.h;
#  - of the core's headers, tiers/ includes only the narrow ones that
#    declare one module each and take no daemon state (TIER_CORE_OK);
#  - in the core, the modules built from a narrow context (NARROW: the GPU
#    data path, adoption, parked requests, namespaces, events, ...) neither
#    name struct kvtierd nor include kvtierd.h; only the wiring modules
#    (WIDE_OK) may.
# Then each rule is shown to catch a breach, planted in a copy of the tree.
set -u
cd "$(dirname "$0")/../.."
TIER_CORE_OK="index.h workq.h fault.h"
# Core files that take the whole daemon: main.c builds every context; the
# request handlers (handlers.c), placement (store.c), the services lent to
# the tiers and the GPU data path (tierhost.c), the pool's choice (pool.c),
# and the daemon's own header. Every other core file is held to this rule.
WIDE_OK="main.c handlers.c handlers.h store.c store.h tierhost.c tierhost.h pool.c pool.h
 kvtierd.h"

# check ROOT: print each breach under ROOT; exit 1 if there is one.
check() {
    local root=$1 bad=0 room h name f inc
    for room in "$root"/tiers/*/; do
        room=${room%/}
        for h in "$room"/*_int.h; do
            [ -e "$h" ] || continue
            name=${h##*/}
            while IFS= read -r f; do
                case $f in "$room"/*|"$root"/tests/unit/*|"$root"/tests/fuzz/*) continue ;; esac
                echo "FAIL: $f includes $name, private to $room"; bad=1
            done < <(grep -rlE "#include \"([a-z]+/)?$name\"" --include='*.c' --include='*.h' \
                     "$root"/client "$root"/common "$root"/cuda "$root"/daemon "$root"/tiers \
                     "$root"/tests "$root"/bench 2>/dev/null)
        done
        while IFS= read -r f; do
            echo "FAIL: $f (in $room) includes another room: $(grep -hE '#include "(nvme|peer|dram)/' "$f" | head -1)"
            bad=1
        done < <(grep -lE '#include "(nvme|peer|dram)/' "$room"/*.[ch] 2>/dev/null)
    done
    while IFS=: read -r f line; do
        echo "FAIL: $f:$line: a tier includes the daemon's state (kvtierd.h)"; bad=1
    done < <(grep -rnE '#include "(daemon/)?kvtierd\.h"' --include='*.[ch]' "$root"/tiers | cut -d: -f1,2)
    while IFS=: read -r f line; do
        echo "FAIL: $f:$line: a tier names struct kvtierd"; bad=1
    done < <(grep -rnE '\bstruct[[:space:]]+kvtierd\b' --include='*.[ch]' "$root"/tiers | cut -d: -f1,2)
    while IFS=: read -r f line inc; do
        name=$(echo "$inc" | sed -E 's/.*#include "(daemon\/)?([a-z_]+\.h)".*/\2/')
        [ -e "$root/daemon/$name" ] || continue           # not a core header
        case " $TIER_CORE_OK " in *" $name "*) continue ;; esac
        echo "FAIL: $f:$line: a tier includes the core's $name (allowed: $TIER_CORE_OK)"; bad=1
    done < <(grep -rnE '#include "' --include='*.[ch]' "$root"/tiers)
    for f in "$root"/daemon/*.[ch]; do
        name=${f##*/}
        case " $(echo $WIDE_OK) " in *" $name "*) continue ;; esac
        while IFS=: read -r line _; do
            echo "FAIL: $f:$line: a narrow core module names struct kvtierd"; bad=1
        done < <(grep -nE '\bstruct[[:space:]]+kvtierd\b' "$f")
        while IFS=: read -r line _; do
            echo "FAIL: $f:$line: a narrow core module includes kvtierd.h"; bad=1
        done < <(grep -nE '#include "(daemon/)?kvtierd\.h"' "$f")
    done
    return $bad
}

check . || exit 1
echo "rooms keep their internals; the tiers are leaves; narrow core modules never see the daemon"

tmp=$(mktemp -d /tmp/kvt-rooms-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
rc=0
breach() { # description, file, text
    rm -rf "$tmp/t" && mkdir -p "$tmp/t" && cp -r daemon tiers "$tmp/t/"
    printf '%s\n' "$3" >>"$tmp/t/$2"
    if check "$tmp/t" >/dev/null; then echo "FAIL: not caught: $1"; rc=1
    else echo "caught: $1"; fi
}
breach "kvtierd.h in a tier" tiers/nvme/nvio.c '#include "kvtierd.h"'
breach "struct kvtierd in a tier" tiers/peer/pget.c 'static int f(struct kvtierd *d);'
breach "a wide core header in a tier" tiers/peer/gidx.c '#include "park.h"'
breach "kvcache.h in a tier" tiers/nvme/nvpark.c '#include "kvcache.h"'
breach "another room's header" tiers/peer/gidx.c '#include "nvme/nvstore.h"'
breach "a room's _int.h in the core" daemon/store.c '#include "nvme/nvstore_int.h"'
breach "struct kvtierd in the GPU data path" daemon/kvcache.c 'static int f(struct kvtierd *d);'
breach "struct kvtierd in a GPU path header" daemon/kvwait.h 'void kvc_x(struct kvtierd *d);'
breach "kvtierd.h in adoption" daemon/adopt.c '#include "kvtierd.h"'
breach "struct kvtierd in the parked requests" daemon/park.c 'struct kvtierd;'
breach "struct kvtierd in a new core module" daemon/newmod.c 'void nm(struct kvtierd *d);'
breach "kvtierd.h in the metrics" daemon/metrics.c '#include "kvtierd.h"'
exit $rc
