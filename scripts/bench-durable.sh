#!/usr/bin/env bash
# A durable ftlab device against qemu-nbd serving a qcow2 image (--cache=writeback), on the same
# disk, with the same fio jobs over NBD (Unix sockets), alternating which goes first:
#   1. sequential 1 MiB writes, QD 8, the whole device (also fills both before the rest);
#   2. 4 KiB random writes, QD 32, a FLUSH every 64 writes (fio --fsync=64), 20 s;
#   3. 4 KiB random reads, QD 32, 20 s;
#   4. (EXT4=1, root, /dev/fuse) ext4 on the export through nbdfuse and a loop device, a copy
#      of /usr/share and /usr/lib, then the bytes each keeps on the host disk (du) after a clean
#      stop.
#   5. (MODES=1) ftlab's job 2 under each --durability: flush, always, never.
# Prints each figure and ftlab's ratio to qemu-nbd. Usage:
#   scripts/bench-durable.sh            # SIZE=2G, ROUNDS=1, EXT4=0
#   SIZE=4G ROUNDS=2 EXT4=1 scripts/bench-durable.sh
set -euo pipefail
cd "$(dirname "$0")/.."
size="${SIZE:-2G}"
rounds="${ROUNDS:-1}"
ext4="${EXT4:-0}"
work="${BENCH_DIR:-target/bench-durable}"
cargo build --release -q -p ftlab
ftlab="$PWD/target/release/ftlab"
bytes=$(numfmt --from=iec "$size")
rm -rf "$work"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

wait_socket() {
    for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
    echo "no socket $1" >&2
    exit 1
}

start() { # start ftlab|qemu
    case "$1" in
    ftlab)
        rm -rf "$work/data" "$work/ftlab.sock"
        "$ftlab" serve --no-tcp --unix "$work/ftlab.sock" --data "$work/data" \
            --durability "${durability:-flush}" \
            --set capacity.logical_bytes="$bytes" 2>"$work/ftlab.log" &
        pid=$!
        wait_socket "$work/ftlab.sock"
        uri="nbd+unix:///ftlab?socket=$work/ftlab.sock"
        ;;
    qemu)
        rm -f "$work/disk.qcow2" "$work/qemu.sock"
        qemu-img create -q -f qcow2 "$work/disk.qcow2" "$size"
        qemu-nbd --cache=writeback --discard=unmap -f qcow2 -t -e 8 -x ftlab \
            -k "$work/qemu.sock" "$work/disk.qcow2" 2>"$work/qemu.log" &
        pid=$!
        wait_socket "$work/qemu.sock"
        uri="nbd+unix:///ftlab?socket=$work/qemu.sock"
        ;;
    esac
}

stop() {
    kill -INT "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

fio_job() { # fio_job NAME ARGS... -> prints IOPS and MiB/s of the job's main direction
    local name="$1"
    shift
    fio --name="$name" --ioengine=nbd --uri="$uri" --output-format=json --output="$work/$name.json" "$@" >/dev/null
    jq -r '.jobs[0] | if .write.io_bytes > 0 then .write else .read end
        | "\(.iops) \(.bw_bytes / 1048576)"' "$work/$name.json"
}

declare -A iops mibs disk
for round in $(seq "$rounds"); do
    order="ftlab qemu"
    [ $((round % 2)) -eq 0 ] && order="qemu ftlab"
    for server in $order; do
        start "$server"
        read -r i m < <(fio_job seq --rw=write --bs=1M --iodepth=8 --size="$size")
        mibs[seq_$server]+="$m "
        read -r i m < <(fio_job randwrite --rw=randwrite --bs=4k --iodepth=32 --fsync=64 \
            --size="$size" --time_based --runtime=20 --norandommap --randrepeat=0)
        iops[randwrite_$server]+="$i "
        read -r i m < <(fio_job randread --rw=randread --bs=4k --iodepth=32 \
            --size="$size" --time_based --runtime=20 --norandommap --randrepeat=0)
        iops[randread_$server]+="$i "
        stop
        echo "round $round $server: seq ${mibs[seq_$server]}MiB/s; randwrite ${iops[randwrite_$server]}IOPS; randread ${iops[randread_$server]}IOPS"
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
[ "$rounds" -gt 0 ] && echo && printf "%-34s %14s %14s %8s\n" "job (median of $rounds)" ftlab qemu-nbd ratio
for job in seq:mibs randwrite:iops randread:iops; do
    [ "$rounds" -gt 0 ] || break
    name="${job%%:*}"
    if [ "${job##*:}" = mibs ]; then
        a=$(echo "${mibs[${name}_ftlab]}" | median); b=$(echo "${mibs[${name}_qemu]}" | median); unit="MiB/s"
    else
        a=$(echo "${iops[${name}_ftlab]}" | median); b=$(echo "${iops[${name}_qemu]}" | median); unit="IOPS"
    fi
    printf "%-34s %14.0f %14.0f %8s\n" "$name ($unit)" "$a" "$b" "$(ratio "$a" "$b")x"
done

if [ "$ext4" = 1 ]; then
    for server in ftlab qemu; do
        start "$server"
        mkdir -p "$work/fuse" "$work/mnt"
        nbdfuse "$work/fuse" "$uri" &
        fuse=$!
        for _ in $(seq 200); do [ -e "$work/fuse/nbd" ] && break; sleep 0.05; done
        dev=$(losetup --direct-io=on -f --show "$work/fuse/nbd")
        mkfs.ext4 -q -E nodiscard "$dev"
        mount "$dev" "$work/mnt"
        started=$(date +%s)
        cp -a /usr/share /usr/lib "$work/mnt/"
        sync
        umount "$work/mnt"
        e2fsck -fn "$dev" >"$work/fsck-$server.log" 2>&1 || { echo "e2fsck found errors on $server" >&2; cat "$work/fsck-$server.log" >&2; }
        losetup -d "$dev"
        fusermount3 -u "$work/fuse"
        wait "$fuse" || true
        stop
        if [ "$server" = ftlab ]; then
            disk[$server]=$(du -s --block-size=1 "$work/data" | cut -f1)
        else
            disk[$server]=$(du -s --block-size=1 "$work/disk.qcow2" | cut -f1)
        fi
        echo "ext4 copy on $server: $(( $(date +%s) - started )) s, ${disk[$server]} bytes on the host disk"
    done
    printf "%-34s %14s %14s %8s\n" "host disk bytes, ext4 + /usr copy" "${disk[ftlab]}" "${disk[qemu]}" \
        "$(ratio "${disk[ftlab]}" "${disk[qemu]}")x"
fi

if [ "${MODES:-0}" = 1 ]; then
    for durability in flush always never; do
        start ftlab
        read -r i m < <(fio_job randwrite --rw=randwrite --bs=4k --iodepth=32 --fsync=64 \
            --size="$size" --time_based --runtime=10 --norandommap --randrepeat=0)
        stop
        printf "%-34s %14.0f\n" "randwrite IOPS, --durability $durability" "$i"
    done
fi
