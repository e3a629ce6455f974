//! Are we on battery?  Read from /sys/class/power_supply, as upower does:
//! on battery when no mains (or USB) supply is online and a battery is
//! discharging.  No supplies at all (servers, VMs) means mains.  Only the
//! machine's own supplies count: a Bluetooth mouse, a gamepad or a UPS's
//! HID battery reports `scope` "Device" (the kernel's
//! POWER_SUPPLY_SCOPE_DEVICE) and discharges on any desktop, which made it
//! "on battery", with longer windows and budgets.

use std::{fs, path::Path};

pub const POWER_SUPPLY: &str = "/sys/class/power_supply";

pub fn on_battery(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    let read = |p: &Path, f: &str| fs::read_to_string(p.join(f)).map(|s| s.trim().to_owned()).unwrap_or_default();
    let mut discharging = false;
    for e in entries.flatten() {
        let p = e.path();
        if read(&p, "scope") == "Device" {
            continue;
        }
        match read(&p, "type").as_str() {
            "Mains" | "USB" if read(&p, "online") == "1" => return false,
            "Battery" if read(&p, "status") == "Discharging" => discharging = true,
            _ => {}
        }
    }
    discharging
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supply(dir: &Path, name: &str, files: &[(&str, &str)]) {
        let p = dir.join(name);
        fs::create_dir_all(&p).unwrap();
        for (f, v) in files {
            fs::write(p.join(f), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn laptop_states() {
        let dir = std::env::temp_dir().join(format!("wb-power-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        assert!(!on_battery(&dir), "no power_supply directory: mains");
        supply(&dir, "BAT0", &[("type", "Battery"), ("status", "Discharging")]);
        assert!(on_battery(&dir));
        supply(&dir, "AC", &[("type", "Mains"), ("online", "0")]);
        assert!(on_battery(&dir));
        supply(&dir, "AC", &[("type", "Mains"), ("online", "1")]);
        assert!(!on_battery(&dir));
        supply(&dir, "AC", &[("type", "Mains"), ("online", "0")]);
        supply(&dir, "BAT0", &[("type", "Battery"), ("status", "Full")]);
        assert!(!on_battery(&dir));
        // A desktop's Bluetooth mouse (hid-generic names it hid-<mac>-battery).
        supply(
            &dir,
            "hid-00:11:22:33:44:55-battery",
            &[("type", "Battery"), ("scope", "Device"), ("status", "Discharging")],
        );
        assert!(!on_battery(&dir), "a peripheral's battery is not the machine's");
        supply(&dir, "BAT0", &[("type", "Battery"), ("scope", "System"), ("status", "Discharging")]);
        assert!(on_battery(&dir));
        fs::remove_dir_all(&dir).unwrap();
    }
}
