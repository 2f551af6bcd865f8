#!/usr/bin/env bash
# Rewrite the KEYS section of man/kvtier.conf.5 from the key table
# (`kvtierd --print-config`), after a key is added or changed:
#   man/update-keys.sh build/bin/kvtierd
set -euo pipefail
kvtierd=${1:-${KVTIERD:-build/bin/kvtierd}}
page=$(dirname "$0")/kvtier.conf.5
"$kvtierd" --print-config | /usr/bin/python3 -c '
import sys
page = sys.argv[1]
out, helps, sec, meta = [], [], None, ""
for line in sys.stdin.read().splitlines():
    if line.startswith("["):
        sec = line[1:-1]
        out.append(".SS [%s]" % sec)
    elif not sec:
        continue
    elif line.startswith("# unit:"):
        meta = line[2:]
    elif line.startswith("# "):
        helps.append(line[2:])
    elif "=" in line:
        name = line.lstrip("#").split("=")[0].strip()
        text = " ".join(helps).replace("\\", "\\\\")
        out += [".TP", ".B " + name, text, ".br", meta.replace("-", "\\-")]
        helps = []
man = open(page).read()
a = man.index(".SH KEYS\n") + len(".SH KEYS\n")
b = man.index(".SH METRICS")
open(page, "w").write(man[:a] + "\n".join(out) + "\n" + man[b:])
' "$page"
