//! writebehindd: BPF programs notice streaming writers (bpf/), this agent
//! starts writeback of what they wrote, one window at a time.
//!
//! Modules by responsibility: `loader` (load and attach BPF), `intake` (ring
//! buffer), `streams` (stream table), `flusher` (per-device submitters),
//! `handles` (closed files by file handle), `policy`, `counters`, `sys`
//! (syscall wrappers), `abi` (generated).

pub mod abi;
pub mod counters;
pub mod flusher;
pub mod handles;
pub mod intake;
pub mod loader;
pub mod policy;
pub mod streams;
pub mod sys;
