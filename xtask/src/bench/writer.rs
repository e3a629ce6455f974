//! The bench's own writers, for the modes that live in the application:
//! Linus's loop (2012) and RWF_DONTCACHE.  They run as child processes
//! (`xtask writer ...`) so that they are separate writers, like the cp or dd
//! they stand in for.

use std::{
    fs::{self, File, OpenOptions},
    io::Read,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

/// Linus's chunk: "write 8 MiB, start writeback of it, wait for the one before".
const CHUNK: usize = 8 << 20;
const RWF_DONTCACHE: libc::c_int = 0x80;

/// Whether the filesystem at `dir` takes RWF_DONTCACHE writes (btrfs did
/// not in 6.18: EOPNOTSUPP).
pub fn dontcache_supported(dir: &Path) -> Result<bool> {
    let path = dir.join(".dontcache-probe");
    let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let buf = [0u8; 4096];
    let iov = libc::iovec { iov_base: buf.as_ptr() as *mut _, iov_len: buf.len() };
    let n = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, 0, RWF_DONTCACHE) };
    let err = std::io::Error::last_os_error();
    drop(file);
    std::fs::remove_file(&path)?;
    match n {
        0.. => Ok(true),
        _ if err.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(false),
        _ => Err(err).context("pwritev2(RWF_DONTCACHE) probe"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Plain,
    Linus,
    DontCache,
}

impl Flavor {
    pub fn key(self) -> &'static str {
        match self {
            Flavor::Plain => "plain",
            Flavor::Linus => "linus",
            Flavor::DontCache => "dontcache",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "plain" => Flavor::Plain,
            "linus" => Flavor::Linus,
            "dontcache" => Flavor::DontCache,
            _ => bail!("unknown writer flavor {s:?}"),
        })
    }
}

/// A file being written sequentially in one of the flavors.
struct Sink {
    file: File,
    flavor: Flavor,
    pos: u64,
    /// Start of the chunk not yet handed to writeback (Linus).
    chunk_start: u64,
}

impl Sink {
    fn create(path: &Path, flavor: Flavor) -> Result<Self> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { file, flavor, pos: 0, chunk_start: 0 })
    }

    fn rewind(&mut self) {
        self.pos = 0;
        self.chunk_start = 0;
    }

    fn write(&mut self, mut buf: &[u8]) -> Result<()> {
        let fd = self.file.as_raw_fd();
        while !buf.is_empty() {
            let iov = libc::iovec { iov_base: buf.as_ptr() as *mut _, iov_len: buf.len() };
            let flags = if self.flavor == Flavor::DontCache { RWF_DONTCACHE } else { 0 };
            let n = unsafe { libc::pwritev2(fd, &iov, 1, self.pos as i64, flags) };
            if n < 0 {
                return Err(std::io::Error::last_os_error()).context("pwritev2");
            }
            self.pos += n as u64;
            buf = &buf[n as usize..];
            if self.flavor == Flavor::Linus {
                self.linus_step(false)?;
            }
        }
        Ok(())
    }

    fn linus_step(&mut self, finish: bool) -> Result<()> {
        let fd = self.file.as_raw_fd();
        while self.pos - self.chunk_start >= CHUNK as u64 || (finish && self.pos > self.chunk_start) {
            let len = (self.pos - self.chunk_start).min(CHUNK as u64);
            sfr(fd, self.chunk_start, len, libc::SYNC_FILE_RANGE_WRITE)?;
            if self.chunk_start >= CHUNK as u64 {
                let prev = self.chunk_start - CHUNK as u64;
                sfr(
                    fd,
                    prev,
                    CHUNK as u64,
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                )?;
            }
            self.chunk_start += len;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        if self.flavor == Flavor::Linus {
            self.linus_step(true)?;
        }
        Ok(())
    }
}

fn sfr(fd: i32, off: u64, len: u64, flags: libc::c_uint) -> Result<()> {
    if unsafe { libc::sync_file_range(fd, off as i64, len as i64, flags) } != 0 {
        return Err(std::io::Error::last_os_error()).context("sync_file_range");
    }
    Ok(())
}

fn copy_file(src: &Path, dst: &Path, flavor: Flavor, buf: &mut [u8]) -> Result<()> {
    let mut input = File::open(src)?;
    let mut sink = Sink::create(dst, flavor)?;
    loop {
        let n = input.read(buf)?;
        if n == 0 {
            break;
        }
        sink.write(&buf[..n])?;
    }
    sink.finish()
}

/// cp -r for the in-application modes: entries in name order, 1 MiB buffers.
fn copy_tree(src: &Path, dst: &Path, flavor: Flavor) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    copy_dir(src, dst, flavor, &mut buf)
}

fn copy_dir(src: &Path, dst: &Path, flavor: Flavor, buf: &mut [u8]) -> Result<()> {
    fs::create_dir_all(dst)?;
    let mut names: Vec<PathBuf> = fs::read_dir(src)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    names.sort();
    for path in names {
        let to = dst.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &to, flavor, buf)?;
        } else {
            copy_file(&path, &to, flavor, buf)?;
        }
    }
    Ok(())
}

/// dd if=/dev/zero of=path bs=1M count=mib, in the flavor.
fn zeros(path: &Path, mib: u64, flavor: Flavor) -> Result<()> {
    let buf = vec![0u8; 1 << 20];
    let mut sink = Sink::create(path, flavor)?;
    for _ in 0..mib {
        sink.write(&buf)?;
    }
    sink.finish()
}

/// A database initialising its file: zeros through one fd, then real data
/// over them from the start, then close.
fn overwrite(path: &Path, mib: u64, flavor: Flavor) -> Result<()> {
    let zero = vec![0u8; 1 << 20];
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut sink = Sink::create(path, flavor)?;
    for _ in 0..mib {
        sink.write(&zero)?;
    }
    sink.rewind();
    for _ in 0..mib {
        sink.write(&data)?;
    }
    sink.finish()
}

/// What the daemon's per-file work costs at its fastest: `n` files of
/// `bytes` each, as fast as one process can create them, in directories of
/// 1,000.  A 20 MiB lead file first: beyond the default policy's 16 MiB
/// burst the process streams, so every close after it is an event.
fn files(dir: &Path, n: u32, bytes: usize, flavor: Flavor) -> Result<()> {
    zeros(&dir.join("lead"), 20, flavor)?;
    let buf = vec![0x61u8; bytes];
    for i in 0..n {
        let sub = dir.join(format!("d{:03}", i / 1000));
        if i % 1000 == 0 {
            fs::create_dir_all(&sub)?;
        }
        let mut sink = Sink::create(&sub.join(format!("f{i:05}")), flavor)?;
        sink.write(&buf)?;
        sink.finish()?;
    }
    Ok(())
}

/// `xtask writer FLAVOR copy-tree SRC DST | zeros PATH MIB | overwrite PATH MIB | files DIR N BYTES`
pub fn main(args: &[String]) -> Result<()> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        [flavor, "copy-tree", src, dst] => copy_tree(Path::new(src), Path::new(dst), Flavor::parse(flavor)?),
        [flavor, "zeros", path, mib] => zeros(Path::new(path), mib.parse()?, Flavor::parse(flavor)?),
        [flavor, "overwrite", path, mib] => overwrite(Path::new(path), mib.parse()?, Flavor::parse(flavor)?),
        [flavor, "files", dir, n, bytes] => files(Path::new(dir), n.parse()?, bytes.parse()?, Flavor::parse(flavor)?),
        _ => bail!(
            "usage: xtask writer FLAVOR (copy-tree SRC DST | zeros PATH MIB | overwrite PATH MIB | files DIR N BYTES)"
        ),
    }
}
