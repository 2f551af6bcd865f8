#!/usr/bin/env bash
# Each tier's room keeps its internals (DESIGN §4, STYLE §2 and §16): a
# room's *_int.h is included only by files inside that room, and a room
# never includes another room's headers. White-box unit tests of one
# room (tests/unit) are the one exception to the first rule.
set -u
cd "$(dirname "$0")/../.."
bad=0
for room in tiers/*/; do
    room=${room%/}
    for h in "$room"/*_int.h; do
        [ -e "$h" ] || continue
        name=${h##*/}
        while IFS= read -r f; do
            case $f in "$room"/*|tests/unit/*) continue ;; esac
            echo "FAIL: $f includes $name, private to $room"; bad=1
        done < <(grep -rlE "#include \"([a-z]+/)?$name\"" --include='*.c' --include='*.h' \
                 client common cuda daemon tiers tests bench 2>/dev/null)
    done
    while IFS= read -r f; do
        echo "FAIL: $f (in $room) includes another room: $(grep -hE '#include "(nvme|peer|dram)/' "$f" | head -1)"
        bad=1
    done < <(grep -lE '#include "(nvme|peer|dram)/' "$room"/*.[ch] 2>/dev/null)
done
[ $bad -eq 0 ] && echo "rooms keep their internals"
exit $bad
