#!/usr/bin/env bash
# Cross-checks `ftlab bench store`'s zstd-dict gain with zstd's own command-line trainer, on the
# same pages: the first N (default 40000) 4 KiB pages of each corpus directory's files in path
# order (last page of a file zero-padded), as `ftlab bench store` cuts them. For each directory it
# prints per-page zstd -3, then with one dictionary trained on a 1-in-7 sample of all three
# directories (112640 and 1048576 bytes), a raw-content dictionary of every 16th page, and a
# dictionary trained on a third of that directory's own pages. Pages that do not compress below
# 4/5 of a page count as stored raw, as the store keeps them. Needs python3 and zstd; about 10 min.
set -euo pipefail
pages=${1:-40000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 - "$pages" <<'PY'
import os, sys
PAGE, limit = 4096, int(sys.argv[1])
def walk(d):
    out = []
    try:
        entries = sorted(os.scandir(d), key=lambda e: e.path)
    except OSError:
        return out
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False): out += walk(e.path)
            elif e.is_file(follow_symlinks=False): out.append(e.path)
        except OSError:
            pass
    return out
for tag, d in [("lib", "/usr/lib"), ("doc", "/usr/share/doc"), ("bin", "/usr/bin")]:
    os.makedirs(tag)
    n = 0
    for f in walk(d):
        if n >= limit: break
        try: b = open(f, "rb").read()
        except OSError: continue
        for i in range(0, min(len(b), (limit - n) * PAGE), PAGE):
            open(f"{tag}/{n:06d}", "wb").write(b[i:i + PAGE].ljust(PAGE, b"\0")); n += 1
PY
ratio() {  # ratio DIR: pages x 4096 / stored bytes
  python3 -c "
import os, sys
sizes = [e.stat().st_size for e in os.scandir(sys.argv[1])]
stored = sum(s if s < 4096 * 4 // 5 else 4096 for s in sizes)
print('%.3f' % (len(sizes) * 4096 / stored))" "$1"
}
compress() {  # compress TAG OUT [zstd options]
  local tag=$1 out=$2; shift 2
  mkdir "$out"; zstd -q -3 --no-check "$@" -r "$tag" --output-dir-flat "$out"; ratio "$out"; rm -rf "$out"
}
{ for t in lib doc bin; do ls "$t" | awk 'NR % 7 == 0' | sed "s|^|$t/|"; done; } > mixed.txt
{ for t in lib doc bin; do ls "$t" | awk 'NR % 16 == 0' | sed "s|^|$t/|"; done; } > raw.txt
zstd -q --train --maxdict=112640 -o small.dict $(cat mixed.txt)
zstd -q --train --maxdict=1048576 -o big.dict $(cat mixed.txt)
cat $(cat raw.txt) > raw.dict
echo "| dir | zstd -3 | dict 112640 B | dict 1 MiB | raw content $(($(stat -c %s raw.dict) >> 20)) MiB | own-dir dict 1 MiB |"
echo "|---|---|---|---|---|---|"
for t in lib doc bin; do
  ls "$t" | awk 'NR % 3 == 0' | sed "s|^|$t/|" > own.txt
  zstd -q --train --maxdict=1048576 -o own.dict $(cat own.txt)
  echo "| $t | $(compress $t z) | $(compress $t z -D small.dict) | $(compress $t z -D big.dict) | $(compress $t z -D raw.dict) | $(compress $t z -D own.dict) |"
done
