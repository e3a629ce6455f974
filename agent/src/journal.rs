//! Events as journal entries with fields of their own, so that
//! `journalctl -u writebehindd WRITER_UNIT=backup.service` finds a unit's
//! streams: when stderr is the journal's stream (systemd sets
//! $JOURNAL_STREAM to its "dev:ino"), each event goes to journald's native
//! socket as one datagram of `KEY=value` lines.  Fields are the event's,
//! upper-cased; a writer's are WRITER_PID, WRITER_COMM, WRITER_UNIT and
//! WRITER_CGROUP (FIELDS); the device's BDI.  MESSAGE holds the same text
//! as stderr would, PRIORITY the level.
//!
//! Never blocks: the socket is non-blocking, and a datagram the journal
//! has no room for is dropped and counted (DROPPED).  Any other failure
//! (no socket, a datagram too big) writes the line to stderr instead.

use std::{
    fmt::Write as _,
    io::Write as _,
    os::unix::net::UnixDatagram,
    sync::atomic::{AtomicU64, Ordering},
};

use tracing::{Event, Level, Subscriber, field::Field, span};
use tracing_subscriber::{Layer, layer::Context, registry::LookupSpan};

pub const SOCKET: &str = "/run/systemd/journal/socket";

/// Entries dropped because the journal's socket was full.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Event fields whose journal name is not merely upper-cased: the writer's.
pub const FIELDS: [(&str, &str); 4] =
    [("pid", "WRITER_PID"), ("comm", "WRITER_COMM"), ("unit", "WRITER_UNIT"), ("cgroup", "WRITER_CGROUP")];

/// Whether stderr is the journal's stream: `journal_stream` ($JOURNAL_STREAM,
/// "dev:ino") names the device and inode of fd 2 (`stderr`).
pub fn is_journal(journal_stream: Option<&str>, stderr: Option<(u64, u64)>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|s| s.split_once(':')) else { return false };
    match (dev.parse::<u64>(), ino.parse::<u64>(), stderr) {
        (Ok(d), Ok(i), Some(fd2)) => (d, i) == fd2,
        _ => false,
    }
}

/// The journal field an event field `name` is sent as: FIELDS, else upper
/// case with anything but [A-Z0-9_] as `_`, never starting with `_` (the
/// journal's trusted fields) or a digit, at most 64 bytes.
pub fn field_name(name: &str) -> String {
    if let Some((_, f)) = FIELDS.iter().find(|(k, _)| *k == name) {
        return (*f).to_owned();
    }
    let mut n: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    if n.is_empty() || n.starts_with(|c: char| c == '_' || c.is_ascii_digit()) {
        n.insert(0, 'F');
    }
    n.truncate(64);
    n
}

/// journald's native form of one entry: `KEY=value\n`, or for a value with
/// a newline `KEY\n`, its length as 64-bit little endian, the value, `\n`.
pub fn encode(fields: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in fields {
        out.extend_from_slice(k.as_bytes());
        if v.contains('\n') {
            out.push(b'\n');
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        } else {
            out.push(b'=');
        }
        out.extend_from_slice(v.as_bytes());
        out.push(b'\n');
    }
    out
}

/// syslog's priority of a level.
pub fn priority(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "3",
        Level::WARN => "4",
        Level::INFO => "6",
        _ => "7",
    }
}

/// Sends events to the journal (see the module's comment).
pub struct JournalLayer {
    socket: UnixDatagram,
    to: std::path::PathBuf,
}

impl JournalLayer {
    /// The layer when stderr is the journal's stream; None otherwise.
    pub fn if_connected() -> Option<Self> {
        let stderr = fstat_stderr();
        if !is_journal(std::env::var("JOURNAL_STREAM").ok().as_deref(), stderr) {
            return None;
        }
        Self::to(SOCKET.as_ref())
    }

    /// The layer sending to the socket at `to`.
    pub fn to(to: &std::path::Path) -> Option<Self> {
        let socket = UnixDatagram::unbound().ok()?;
        socket.set_nonblocking(true).ok()?;
        Some(Self { socket, to: to.to_owned() })
    }
}

/// Device and inode of fd 2, as systemd compares them.
fn fstat_stderr() -> Option<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(2, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// An event's message and fields, as text and as journal fields.
#[derive(Default)]
struct Fields {
    message: String,
    text: String,
    journal: Vec<(String, String)>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field, value.to_owned(), format!("{value:?}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let v = format!("{value:?}");
        self.add(field, v.clone(), v);
    }
}

impl Fields {
    /// `value` is sent to the journal; `shown` is how the text line shows it.
    fn add(&mut self, field: &Field, value: String, shown: String) {
        if field.name() == "message" {
            self.message = value;
            return;
        }
        let _ = write!(self.text, " {}={shown}", field.name());
        self.journal.push((field_name(field.name()), value));
    }
}

/// A span's fields, kept in its extensions: the events inside it carry them
/// (`device{name=...}: pacing on`).
struct SpanFields {
    text: String,
    journal: Vec<(String, String)>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for JournalLayer {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut f = Fields::default();
        attrs.record(&mut f);
        let text = format!("{}{{{}}}", span.name(), f.text.trim_start());
        span.extensions_mut().insert(SpanFields { text, journal: f.journal });
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let level = event.metadata().level();
        let mut scope = String::new();
        for span in ctx.event_scope(event).into_iter().flat_map(|s| s.from_root()) {
            if let Some(sf) = span.extensions().get::<SpanFields>() {
                scope += &format!("{}: ", sf.text);
                f.journal.extend(sf.journal.iter().cloned());
            }
        }
        let text = format!("{scope}{}{}", f.message, f.text);
        let mut fields = vec![
            ("MESSAGE".to_owned(), text.clone()),
            ("PRIORITY".to_owned(), priority(level).to_owned()),
            ("SYSLOG_IDENTIFIER".to_owned(), "writebehindd".to_owned()),
        ];
        fields.append(&mut f.journal);
        match self.socket.send_to(&encode(&fields), &self.to) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                let _ = writeln!(std::io::stderr(), "{:>5} {text}", level.as_str());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_is_the_journal_only_when_its_stream_matches() {
        assert!(is_journal(Some("8:1234"), Some((8, 1234))));
        assert!(!is_journal(Some("8:1234"), Some((8, 1235))));
        assert!(!is_journal(None, Some((8, 1234))));
        assert!(!is_journal(Some("8"), Some((8, 1234))));
        assert!(!is_journal(Some("x:y"), Some((8, 1234))));
        assert!(!is_journal(Some("8:1234"), None));
    }

    #[test]
    fn fields_are_named_for_the_journal() {
        assert_eq!(field_name("unit"), "WRITER_UNIT");
        assert_eq!(field_name("cgroup"), "WRITER_CGROUP");
        assert_eq!(field_name("pid"), "WRITER_PID");
        assert_eq!(field_name("comm"), "WRITER_COMM");
        assert_eq!(field_name("bdi"), "BDI");
        assert_eq!(field_name("error.kind"), "ERROR_KIND");
        // Never one of journald's trusted fields.
        assert_eq!(field_name("_pid"), "F_PID");
        assert_eq!(field_name("1x"), "F1X");
        assert_eq!(field_name(&"a".repeat(100)).len(), 64);
    }

    #[test]
    fn values_with_newlines_are_sent_binary_safe() {
        let f = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        let bytes = encode(&[f("MESSAGE", "stream started"), f("WRITER_CGROUP", "/a\nFAKE=1")]);
        let mut want = b"MESSAGE=stream started\nWRITER_CGROUP\n".to_vec();
        want.extend_from_slice(&9u64.to_le_bytes());
        want.extend_from_slice(b"/a\nFAKE=1\n");
        assert_eq!(bytes, want);
    }

    /// The one datagram a JournalLayer sends for what `emit` logs, read on
    /// a socket of the test's own (`name` keeps the tests' directories apart).
    fn datagram_of(name: &str, emit: impl FnOnce()) -> String {
        use tracing_subscriber::layer::SubscriberExt;
        let dir = std::env::temp_dir().join(format!("wb-journal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("socket");
        let journal = UnixDatagram::bind(&path).unwrap();
        let subscriber = tracing_subscriber::registry().with(JournalLayer::to(&path).unwrap());
        tracing::subscriber::with_default(subscriber, emit);
        let mut buf = vec![0u8; 4096];
        let n = journal.recv(&mut buf).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn an_event_is_one_datagram_with_its_fields() {
        let got = datagram_of("event", || {
            let (unit, cgroup) = ("backup.service", "/system.slice/backup.service");
            tracing::info!(pid = 42, comm = "dd", unit = %unit, cgroup = %cgroup, bdi = "7:3", "stream started");
        });
        for want in [
            "MESSAGE=stream started pid=42 comm=\"dd\" unit=backup.service cgroup=/system.slice/backup.service bdi=\"7:3\"\n",
            "PRIORITY=6\n",
            "WRITER_PID=42\n",
            "WRITER_COMM=dd\n",
            "WRITER_UNIT=backup.service\n",
            "WRITER_CGROUP=/system.slice/backup.service\n",
            "BDI=7:3\n",
        ] {
            assert!(got.contains(want), "{want:?} not in {got:?}");
        }
    }

    #[test]
    fn an_events_spans_come_with_it() {
        let got = datagram_of("span", || {
            let _named = tracing::info_span!("device", name = "sdb1 /media/x").entered();
            tracing::warn!(bdi = "8:16", "pacing on");
        });
        assert!(got.contains("MESSAGE=device{name=\"sdb1 /media/x\"}: pacing on bdi=\"8:16\"\n"), "{got:?}");
        assert!(got.contains("NAME=sdb1 /media/x\n") && got.contains("PRIORITY=4\n"), "{got:?}");
    }

    #[test]
    fn priorities_are_syslogs() {
        assert_eq!((priority(&Level::ERROR), priority(&Level::WARN)), ("3", "4"));
        assert_eq!((priority(&Level::INFO), priority(&Level::DEBUG)), ("6", "7"));
    }
}
