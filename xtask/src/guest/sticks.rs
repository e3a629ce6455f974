//! USB sticks for the guest: qemu's xHCI controller with usb-storage
//! devices on raw images, their writes throttled by qemu to a stick's
//! bandwidth, and a monitor through which the guest's test pulls a stick
//! out (surprise removal) or plugs one in (hotplug).
//!
//! The guest asks by printing `systest: QEMU <monitor command>` on the
//! serial console; `boot` hands such lines to `Sticks::relay`, which sends
//! the command to qemu's human monitor.  Only the commands a stick test
//! needs are relayed.

use std::{
    fs,
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result};

/// Monitor commands a guest may ask for.
const RELAYED: &[&str] = &["device_add usb-storage,", "device_del ", "block_set_io_throttle "];

pub struct Sticks {
    /// stick0 is plugged in at boot (device usb0); stick1 is only a drive
    /// until the guest asks for `device_add usb-storage,bus=xhci.0,drive=stick1,id=usb1`.
    images: Vec<PathBuf>,
    /// Write throttle of each stick, bytes per second.
    bps_write: u64,
    monitor: PathBuf,
}

impl Sticks {
    /// Two empty (sparse) sticks of `size` bytes in `dir`.
    pub fn new(dir: &Path, size: u64, bps_write: u64) -> Result<Self> {
        fs::create_dir_all(dir)?;
        let mut images = Vec::new();
        for i in 0..2 {
            let image = dir.join(format!("stick{i}.img"));
            let _ = fs::remove_file(&image);
            fs::File::create(&image)?.set_len(size)?;
            images.push(image);
        }
        let monitor = dir.join("monitor.sock");
        let _ = fs::remove_file(&monitor);
        Ok(Self { images, bps_write, monitor })
    }

    /// cache.no-flush: a guest's flush (umount, sync) is not passed on as
    /// an fsync of the image on the host, which took 0.3-0.8 s of the
    /// guest's umount time here (the host disk's speed, not the stick's).
    /// cache.direct: the images are written with O_DIRECT, not through the
    /// host's page cache: through it, a host test's daemon beside the guest
    /// streamed qemu (bdi 254:0) and paced the root disk.
    pub fn qemu_args(&self) -> Vec<String> {
        let mut args = vec![
            "-monitor".into(),
            format!("unix:{},server=on,wait=off", self.monitor.display()),
            "-device".into(),
            "qemu-xhci,id=xhci".into(),
        ];
        for (i, image) in self.images.iter().enumerate() {
            args.push("-drive".into());
            args.push(format!(
                "file={},if=none,id=stick{i},format=raw,cache.direct=on,cache.no-flush=on,throttling.bps-write={}",
                image.display(),
                self.bps_write
            ));
        }
        args.push("-device".into());
        args.push("usb-storage,bus=xhci.0,drive=stick0,id=usb0,removable=on".into());
        args
    }

    /// Sends the guest's request in `line` (a serial console line) to the
    /// monitor, if it is one; its answer is echoed.
    pub fn relay(&self, line: &str) -> Result<()> {
        let Some((_, cmd)) = line.split_once("systest: QEMU ") else { return Ok(()) };
        let cmd = cmd.trim();
        if !RELAYED.iter().any(|p| cmd.starts_with(p)) {
            println!("sticks: not relayed: {cmd}");
            return Ok(());
        }
        let mut mon = UnixStream::connect(&self.monitor).context("qemu monitor")?;
        mon.set_read_timeout(Some(Duration::from_secs(2)))?;
        mon.write_all(format!("{cmd}\n").as_bytes())?;
        // The banner, the echo and any error; the monitor has no end marker
        // but its next prompt, so read until the timeout.
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = mon.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            if out.ends_with(b"(qemu) ") && out.windows(cmd.len()).any(|w| w == cmd.as_bytes()) {
                break;
            }
        }
        println!("sticks: {cmd}: {}", answer(&String::from_utf8_lossy(&out), cmd));
        Ok(())
    }
}

/// What the monitor said after echoing `cmd`, without its line editing
/// (each typed character is echoed with cursor moves) and prompts.
fn answer(raw: &str, cmd: &str) -> String {
    let mut text = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else if !c.is_control() || c == '\n' {
            text.push(c);
        }
    }
    let after = text.rfind(cmd).map_or(&text[..], |i| &text[i + cmd.len()..]);
    let said = after.replace("(qemu)", "").split_whitespace().collect::<Vec<_>>().join(" ");
    if said.is_empty() { "done".into() } else { said }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_monitors_answer_without_its_echo() {
        let raw = "QEMU 7.2.22 monitor\r\n(qemu) d\x1b[K\x1b[Dde\x1b[K\x1b[D\x1b[Ddevice_del usb0\x1b[K\r\n(qemu) ";
        assert_eq!(super::answer(raw, "device_del usb0"), "done");
        let raw = "(qemu) device_del usb9\r\nError: Device 'usb9' not found\r\n(qemu) ";
        assert_eq!(super::answer(raw, "device_del usb9"), "Error: Device 'usb9' not found");
    }
}
