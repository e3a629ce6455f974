# A real database beside a copy on the same paced device, sourced by
# systest.sh in the second boot (the full run, or --only db): the service is
# installed and running, the USB stick is present, the image has Debian's
# postgresql (guest.rs builds it only for this test).
#
# PostgreSQL gets a cluster of its own on the stick, ext4, run by systemd as
# postgresql@<version>-stick.service, as Debian runs every cluster.  pgbench
# (TPC-B-like, 4 clients) runs for DB_SECS while carol copies 192 MiB to
# the same stick, three ways: the kernel default (service stopped), the
# daemon's root policy, and the database's cgroup under `mode = "off"` (what
# policies/examples/ advise for a database): the daemon leaves PostgreSQL's
# writes alone and still paces the stick for the copy.  The figures (TPS,
# latency p50/p99/max from pgbench's per-transaction log) are measured, not
# checked: under TCG the guest's CPU, not the stick, sets much of them.
# Checked: the database works beside the paced copy, the copy is streamed
# and the stick paced with the database on it, and under `mode = "off"` no
# PostgreSQL process is streamed.
DB_SECS=12
DB_PORT=5440
DB_STICK=/mnt/stick
db_ver=$(find /usr/lib/postgresql -maxdepth 1 -mindepth 1 -printf '%f\n' | sort -n | tail -1)
db_unit=postgresql@$db_ver-stick
db_bin=/usr/lib/postgresql/$db_ver/bin
db_policy=/etc/writebehindd/policies.d/50-db.toml
db_disk=$(first_usb_disk)
id carol >/dev/null 2>&1 || useradd -M carol

# pgbench's per-transaction log (-l): the 3rd field is the latency in µs.
# Prints "p50 p99 max" in ms.
db_latencies() {
    cat "$@" | awk '{ print $3 }' | sort -n | awk '
        { v[NR] = $1 }
        END {
            if (NR == 0) { print "- - -"; exit }
            p50 = v[int((NR - 1) * 0.50) + 1]; p99 = v[int((NR - 1) * 0.99) + 1]
            printf "%.0f %.0f %.0f\n", p50 / 1000, p99 / 1000, v[NR] / 1000
        }'
}

db_unpaced() { ! paced /sys/class/bdi/$db_bdi; }

# db_run <default|daemon|off>: pgbench beside the copy; MEASUREs and checks.
db_run() {
    local mode=$1 t logs=/var/tmp/pgbench-$1 tps lat rc copy_rc t0 t1 pgb
    case $mode in
    default) systemctl stop writebehindd ;;
    daemon) rm -f $db_policy && systemctl start writebehindd && systemctl reload writebehindd ;;
    off)
        mkdir -p "${db_policy%/*}"
        printf '[[policy]]\ncgroup = "/system.slice/system-postgresql.slice/**"\nmode = "off"\n' >$db_policy
        t=$(date +%s)
        systemctl reload writebehindd
        wait_for 20 logged_since "$t" "policies reloaded.*50-db.toml"
        ;;
    esac
    # The run before may still hold the stick paced (it lingers between
    # writers): this run's copy must start pacing anew.
    wait_for 30 db_unpaced
    rm -rf $DB_STICK/dst $logs
    mkdir -p $DB_STICK/dst $logs && chown carol $DB_STICK/dst && chown postgres $logs
    runuser -u postgres -- psql -q -p $DB_PORT -c CHECKPOINT
    sync
    t=$(date +%s)
    # pgbench starts first, then the copy (twice the 96 MiB file, 6.4 s of
    # the stick), then `sync`; pgbench runs on past them.
    (cd $logs && runuser -u postgres -- "$db_bin/pgbench" -p $DB_PORT -c 4 -j 2 -T $DB_SECS -l postgres >out 2>&1) &
    pgb=$!
    sleep 1
    t0=$(date +%s%N)
    runuser -u carol -- sh -c "cp $SRC_FILE $DB_STICK/dst/a && cp $SRC_FILE $DB_STICK/dst/b"
    copy_rc=$?
    sync -f $DB_STICK
    t1=$(date +%s%N)
    wait $pgb
    rc=$?
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' $logs/out | tail -1)
    lat=$(db_latencies $logs/pgbench_log.*)
    measure "db-beside-copy-$mode" "tps ${tps:-none}, latency p50/p99/max ${lat// //} ms, copy + sync $(secs "$t0" "$t1") s"
    check "db-$mode-pgbench-ran" [ "$rc" = 0 -a -n "$tps" ]
    ((rc)) && sed 's/^/systest:   /' $logs/out | tail -5
    check "db-$mode-copy-exit-0" [ "$copy_rc" = 0 ]
    [ "$mode" = default ] && return 0
    local ino
    ino=$(stat -c %i $DB_STICK/dst/a)
    check "db-$mode-copy-streamed" wait_for 20 logged_since "$t" "stream started.*ino=$ino "
    # (a &str field: the log quotes it, bdi="8:0")
    if ! logged_since "$t" "pacing on.*bdi=\"\?$db_bdi\b"; then
        fail "db-$mode-stick-paced"
        log_since "$t" | grep -E "pacing|stream" | sed 's/^/systest:   /' | tail -8
    else
        pass "db-$mode-stick-paced"
    fi
    local pg_streams
    pg_streams=$(log_since "$t" | grep -c "stream started.*comm=postgres")
    if [ "$mode" = off ]; then
        check "db-off-postgres-left-alone" [ "$pg_streams" = 0 ]
    else
        measure "db-daemon-postgres-streams" "$pg_streams"
    fi
}

if [ -z "$db_disk" ] || [ -z "$db_ver" ]; then
    fail "db-setup" "stick: ${db_disk:-none}, postgresql: ${db_ver:-none}"
else
    db_bdi=$(basename "$(readlink /sys/block/$db_disk/bdi)")
    mkdir -p $DB_STICK
    mkfs.ext4 -q -F /dev/$db_disk
    mount /dev/$db_disk $DB_STICK
    mkdir -p $DB_STICK/pg && chown postgres: $DB_STICK/pg
    # Debian's own way: pg_createcluster, then the cluster's template unit.
    pg_createcluster -q "$db_ver" stick -d $DB_STICK/pg/data -p $DB_PORT >/dev/null
    systemctl start "$db_unit"
    check "db-cluster-under-systemd" [ "$(systemctl show -p ActiveState --value "$db_unit")" = active ]
    echo "systest:   $db_unit in $(systemctl show -p ControlGroup --value "$db_unit")"
    runuser -u postgres -- "$db_bin/pgbench" -q -p $DB_PORT -i -s 2 postgres >/dev/null 2>&1
    check "db-initialized" [ $? = 0 ]
    for mode in default daemon off; do db_run $mode; done
    rm -f $db_policy
    systemctl start writebehindd
    systemctl reload writebehindd
    pg_dropcluster --stop "$db_ver" stick
    umount $DB_STICK
fi
