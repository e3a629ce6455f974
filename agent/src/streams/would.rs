//! What an observing writer's events would have had the agent do (a
//! policy at mode "observe"): the act-or-record switch's record side.  The
//! stream table decides as it would for an acting writer, then, for an
//! observing one, counts the flush it would have submitted instead of
//! submitting it.  Nothing here opens a file or starts writeback.

use crate::counters::Counters;

/// A flush the agent would have handed to writeback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Would {
    /// A window of `bytes` (a stream's, or one reached by handle).
    Window { bytes: u64 },
    /// A closed file's tail of `bytes`.
    Close { bytes: u64 },
    /// A closed file left to a would-be paced device's kernel flusher.
    LeaveClose,
}

impl Would {
    /// What the agent would flush of [start, end) of a closed file, on a
    /// device it would pace at `would_budget` (0: it would not).  An empty
    /// tail is no flush.
    pub(super) fn close(start: u64, end: u64, would_budget: u64) -> Option<Would> {
        match end.saturating_sub(start) {
            0 => None,
            _ if would_budget != 0 => Some(Would::LeaveClose),
            bytes => Some(Would::Close { bytes }),
        }
    }

    /// Counted: would_windows, would_close_files, would_closed_files_left,
    /// and the bytes of the first two in would_write_bytes.
    pub(super) fn count(self, c: &Counters) {
        match self {
            Would::Window { bytes } => {
                c.add(&c.would_windows, 1);
                c.add(&c.would_write_bytes, bytes);
            }
            Would::Close { bytes } => {
                c.add(&c.would_close_files, 1);
                c.add(&c.would_write_bytes, bytes);
            }
            Would::LeaveClose => c.add(&c.would_closed_files_left, 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_would_flush_its_tail_unless_empty_or_its_device_would_be_paced() {
        assert_eq!(Would::close(4096, 4096, 0), None);
        assert_eq!(Would::close(0, 8192, 0), Some(Would::Close { bytes: 8192 }));
        assert_eq!(Would::close(0, 8192, 10 << 20), Some(Would::LeaveClose));
    }

    #[test]
    fn counts_name_what_would_have_been_done() {
        let c = Counters::default();
        for w in [Would::Window { bytes: 2 << 20 }, Would::Window { bytes: 1 << 20 }, Would::Close { bytes: 5 }] {
            w.count(&c);
        }
        Would::LeaveClose.count(&c);
        let m = c.snapshot();
        assert_eq!(m["would_windows"], 2);
        assert_eq!(m["would_close_files"], 1);
        assert_eq!(m["would_closed_files_left"], 1);
        assert_eq!(m["would_write_bytes"], (3 << 20) + 5);
        assert_eq!((m["bytes_flushed"], m["spans_flushed"]), (0, 0), "nothing was done");
    }
}
