//! The daemon's control socket, as the bench asks it: one `status`.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

use anyhow::{Context, Result};

/// `status` on the control socket (the protocol of agent/src/status.rs, v1):
/// its answer's `data`.
pub(super) fn status(socket: &Path) -> Result<serde_json::Value> {
    let mut s = UnixStream::connect(socket).with_context(|| format!("connecting {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"{\"v\":1,\"cmd\":\"status\"}\n")?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    let mut v: serde_json::Value = serde_json::from_str(&line)?;
    v.get_mut("data").map(serde_json::Value::take).with_context(|| format!("status refused: {line}"))
}
