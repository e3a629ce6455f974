//! Programs a test runs in the background, stopped with the test.

use std::{
    os::unix::process::CommandExt,
    process::{Child, Command, ExitStatus, Stdio},
};

use anyhow::Result;

/// A command (often a shell pipeline) in a process group of its own, so that
/// dropping it kills the whole pipeline, also when the test fails.
pub struct Background(pub Child);

impl Background {
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        Ok(Self(cmd.stdin(Stdio::null()).process_group(0).spawn()?))
    }

    /// `sh -c script`.
    pub fn sh(script: &str) -> Result<Self> {
        Self::spawn(Command::new("sh").arg("-c").arg(script))
    }

    pub fn wait(&mut self) -> Result<ExitStatus> {
        Ok(self.0.wait()?)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
}
