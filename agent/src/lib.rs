//! writebehindd: BPF programs notice streaming writers (bpf/), this agent
//! starts writeback of what they wrote, one window at a time.
//!
//! Modules by responsibility: `loader` (load and attach BPF), `intake` (ring
//! buffer), `streams` (stream table), `flusher` (per-device submitters),
//! `closer` (files whose close waits for a server, closed off the intake
//! thread),
//! `admission` (what may wait for a device's thread),
//! `devices` (per-device windows and pacing), `backing` (who sets a
//! device's speed), `bandwidth` (the estimator and
//! window arithmetic), `pacing` (bdi dirty limits), `power`, `handles`
//! (closed files by file handle), `policy` (keys), `policies` (files, per
//! cgroup), `cgroups` (policies to BPF by cgroup id), `control` (the socket),
//! `status` (what it reports, and the protocol), `counters`, `shares` (each
//! owner's half of BPF's stream map), `sys` (syscall wrappers), `abi`
//! (generated).

pub mod abi;
mod admission;
pub mod backing;
pub mod bandwidth;
pub mod cgroups;
#[cfg(test)]
mod cli_tests;
mod closer;
pub mod control;
pub mod counters;
pub mod daemon;
pub mod devices;
pub mod flusher;
pub mod handles;
pub mod loader;
pub mod pacing;
pub mod policies;
pub mod policy;
pub mod power;
pub mod shares;
pub mod status;
pub mod streams;
pub mod sys;
