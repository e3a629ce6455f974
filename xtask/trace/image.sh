#!/usr/bin/env bash
# Writes an image to a block device through its node with a real program
# and says how long its close took: the time from the return of its last
# large write (strace -ttt -T) to its exit, where the device's last close
# writes it back.  Also the peak of the device's dirty + writeback pages
# (debugfs, every 0.1 s) and what the device had written (its own sectors
# counter) when the program exited.  As root, on a device nothing is
# mounted on; the image is made once in /dev/shm.
#
#   xtask/trace/image.sh DEV MIB dd|dd-progress|cat|pv|cp
#
# prints: TOOL total=S close=S peak_mib=N at_exit_mib=N
set -euo pipefail
dev=$1 mib=$2 tool=$3
src=/dev/shm/wb-image-$mib.img
name=$(basename "$(readlink -f "$dev")")
bdi=$(cat "/sys/class/block/$name/dev")
# A partition's pages are on its disk's bdi.
[[ -e /sys/class/block/$name/partition ]] && bdi=$(cat "/sys/class/block/$name/../dev")
[[ -f $src && $(stat -c %s "$src") -eq $((mib << 20)) ]] || head -c "${mib}M" /dev/urandom >"$src"
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug
written() { awk '{printf "%.0f\n", $7 * 512}' "/sys/class/block/$name/stat"; }
peak=$(mktemp) trace=$(mktemp)
trap 'rm -f "$peak" "$trace"' EXIT
(
    top=0
    while :; do
        kb=$(awk '/^BdiReclaimable:|^BdiWriteback:/ {t += $2} END {print t + 0}' "/sys/kernel/debug/bdi/$bdi/stats")
        ((kb > top)) && top=$kb && echo "$top" >"$peak"
        sleep 0.1
    done
) &
sampler=$!
sync
before=$(written)
st=(strace -qq -f -ttt -T -e trace=write -o "$trace")
t0=$(date +%s.%N)
case $tool in
dd) "${st[@]}" dd if="$src" of="$dev" bs=4M status=none ;;
dd-progress) "${st[@]}" dd if="$src" of="$dev" bs=4M status=progress 2>/dev/null ;;
cat) "${st[@]}" sh -c "cat '$src' > '$dev'" ;;
pv) "${st[@]}" sh -c "pv -q '$src' > '$dev'" ;;
cp) "${st[@]}" cp "$src" "$dev" ;;
*) echo "image.sh: unknown tool $tool" >&2; exit 2 ;;
esac
t1=$(date +%s.%N)
after=$(written)
kill "$sampler"
wait "$sampler" 2>/dev/null || true
# The end of the last write of 64 KiB or more (dd's progress lines are not).
last=$(awk '/ write\(/ { n = split($0, a, " = "); split(a[n], r, " ");
    if (r[1] + 0 >= 65536) { d = $NF; gsub("[<>]", "", d); e = $2 + d; if (e > m) m = e } }
    END { printf "%.3f", m }' "$trace")
printf '%s total=%.2f close=%.2f peak_mib=%d at_exit_mib=%d\n' "$tool" "$(echo "$t1 - $t0" | bc)" \
    "$(echo "$t1 - $last" | bc)" $(($(cat "$peak" 2>/dev/null || echo 0) / 1024)) $(((after - before) >> 20))
