//! The maintainer scripts. Their systemd parts do what dh_installsystemd's
//! generated blocks do (enable through deb-systemd-helper, which works
//! without a running systemd; start, restart and stop through
//! deb-systemd-invoke, which honours policy-rc.d; systemctl only where
//! /run/systemd/system says systemd is PID 1), so the package behaves like
//! any Debian service in a chroot, a container or a booted system.
//!
//! Enabled and started on install. On upgrade the service is restarted, not
//! only reloaded: a reload (SIGHUP) re-reads policies but keeps the old
//! binary running; a restart is safe (the unit's stop restores the bdi
//! limits, every start recovers what a killed run left). Stopped on remove,
//! then `writebehindd --restore` while the binary is still there. Purge
//! forgets the enablement and removes /run/writebehindd (the bdi journal
//! and control socket the unit keeps across restarts).

use crate::layout::DEBIAN;

const UNIT: &str = "writebehindd.service";

/// (file name in DEBIAN/, text)
pub fn all() -> [(&'static str, String); 3] {
    [("postinst", postinst()), ("prerm", prerm()), ("postrm", postrm())]
}

fn postinst() -> String {
    format!(
        r#"#!/bin/sh
set -e

case "$1" in
configure|abort-upgrade|abort-deconfigure|abort-remove)
    # A mask left by a removal (postrm) goes; a unit never seen before, or
    # one that was enabled, is enabled (again: [Install] may have changed);
    # one the administrator disabled stays disabled.
    deb-systemd-helper unmask {UNIT} >/dev/null || true
    if deb-systemd-helper --quiet was-enabled {UNIT}; then
        deb-systemd-helper enable {UNIT} >/dev/null || true
    else
        deb-systemd-helper update-state {UNIT} >/dev/null || true
    fi
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        # $2 is the version configured before: an upgrade runs the new binary.
        if [ -n "$2" ]; then action=restart; else action=start; fi
        deb-systemd-invoke "$action" {UNIT} >/dev/null || true
    fi
    ;;
esac

exit 0
"#
    )
}

fn prerm() -> String {
    let daemon = format!("/{}/writebehindd", DEBIAN.daemon_dir);
    format!(
        r#"#!/bin/sh
set -e

if [ "$1" = remove ]; then
    if [ -d /run/systemd/system ]; then
        deb-systemd-invoke stop {UNIT} >/dev/null || true
    fi
    # Last chance to put back bdi limits a killed daemon left journaled: the
    # binary goes next. Refused (and harmless) while a daemon started by
    # hand still runs: it restores them itself when it stops.
    if [ -x {daemon} ]; then
        {daemon} --restore || echo "writebehindd: bdi limits not restored (see above)" >&2
    fi
fi

exit 0
"#
    )
}

fn postrm() -> String {
    format!(
        r#"#!/bin/sh
set -e

case "$1" in
remove)
    # The unit file is gone but its enablement is remembered for a
    # reinstall: masked meanwhile, so nothing starts a missing unit.
    # (deb-systemd-helper itself may be gone by now, hence the test.)
    if command -v deb-systemd-helper >/dev/null; then
        deb-systemd-helper mask {UNIT} >/dev/null || true
    fi
    ;;
purge)
    if command -v deb-systemd-helper >/dev/null; then
        deb-systemd-helper purge {UNIT} >/dev/null || true
        deb-systemd-helper unmask {UNIT} >/dev/null || true
    fi
    # RuntimeDirectoryPreserve=yes keeps it across stops; prerm restored
    # what its journal listed.
    rm -rf /run/writebehindd
    # Purging asks for the configuration to go too: the policy files the
    # administrator added beside the conffile (dpkg removes only its own).
    rm -rf /etc/writebehindd
    ;;
esac

if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi

exit 0
"#
    )
}
