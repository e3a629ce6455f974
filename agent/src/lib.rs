//! writebehindd: BPF programs notice streaming writers (bpf/), this agent
//! starts writeback of what they wrote, one window at a time.
//!
//! Modules by responsibility: `daemon` (a run: what it loads, binds and
//! owns, and its loop, `daemon::intake`, which drains the ring buffer),
//! `loader` (load and attach BPF), `streams` (stream table), `flusher`
//! (per-device submitters, which also close the files they open),
//! `admission` (what may wait for a device's thread),
//! `devices` (per-device windows and pacing), `backing` (who sets a
//! device's speed), `bandwidth` (the estimator and
//! window arithmetic), `pacing` (bdi dirty limits), `power`, `handles`
//! (closed files by file handle), `policy` (keys), `policies` (files, per
//! cgroup), `cgroups` (policies to BPF by cgroup id), `control` (the socket),
//! `status` (what it reports, and the protocol), `counters`, `shares` (each
//! owner's half of BPF's stream map), `sys` (syscall wrappers), `abi`
//! (generated).
//!
//! Public are the modules the binaries (main.rs, wbctl) and the tests
//! (tests/, agent/tests/) use; the rest is the daemon's alone.

pub mod abi;
mod admission;
mod backing;
mod bandwidth;
mod bdis;
mod cgroups;
#[cfg(test)]
mod cli_tests;
pub mod control;
mod counters;
pub mod daemon;
mod devices;
mod flusher;
pub mod handles;
pub mod journal;
pub mod loader;
mod metrics;
mod names;
pub mod pacing;
pub mod policies;
mod policy;
mod power;
mod shares;
pub mod status;
pub mod streams;
pub mod sys;
pub mod units;
