//! `cargo xtask`'s command line: its subcommands, their options and help.
//! Each subcommand's options are its module's `Args`; the internal ones
//! (run by xtask itself, hidden from the help) take their arguments as
//! they come.

use clap::{Parser, Subcommand};

use crate::{bench, container, deb, install, rpm, systest, vmtest};

/// The project's build, run, test and bench entry points.
#[derive(Parser, Debug, PartialEq)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Cmd>,
}

#[derive(Subcommand, Debug, PartialEq)]
pub enum Cmd {
    /// build the daemon (release) and run it in the foreground as root
    Run {
        /// the daemon's arguments (after `--`)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
        args: Vec<String>,
    },
    /// build, then run all tests (needs root: they load BPF and make loop devices)
    ///
    /// Builds, then runs all tests (needs root: they load BPF and make loop
    /// devices): the host tests, vmtest --quick beside them, deb --check,
    /// bench --smoke and systest --quick. With ARGS, only the host tests run.
    #[command(verbatim_doc_comment)]
    Test {
        /// arguments for cargo test (e.g. a test name filter)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
        args: Vec<String>,
    },
    Bench(bench::Args),
    Vmtest(vmtest::Args),
    Systest(systest::Args),
    /// build (release) and install the daemon, wbctl, the systemd unit, completions and docs under DIR
    ///
    /// Builds (release) and installs the daemon, wbctl, the systemd unit,
    /// completions and docs under DIR (default /); then
    /// systemctl enable --now writebehindd
    #[command(verbatim_doc_comment)]
    Install(install::Args),
    /// remove what install put there (policies in /etc are kept)
    Uninstall(install::Args),
    Deb(deb::Args),
    Rpm(rpm::Args),
    Container(container::Args),
    /// Run inside the vmtest guest: each backend's cost per write ([SECS]).
    #[command(hide = true)]
    Overhead {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run by `deb --check`, in a mount namespace of its own (DEB).
    #[command(hide = true)]
    DebTryout {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The bench's in-application writers (Linus's loop, RWF_DONTCACHE).
    #[command(hide = true)]
    Writer {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::bench::modes::Mode;

    fn parse(line: &str) -> Result<Cmd, clap::Error> {
        Cli::try_parse_from(std::iter::once("xtask").chain(line.split_whitespace())).map(|c| c.command.unwrap())
    }

    fn ok(line: &str) -> Cmd {
        parse(line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    fn bench(line: &str) -> bench::Args {
        match ok(line) {
            Cmd::Bench(a) => a,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_command_prints_the_help() {
        assert_eq!(Cli::try_parse_from(["xtask"]).unwrap().command, None);
    }

    #[test]
    fn run_and_test_pass_their_arguments_on() {
        assert_eq!(ok("run"), Cmd::Run { args: vec![] });
        assert_eq!(
            ok("run -- --config /etc/x.toml -v"),
            Cmd::Run { args: strings(&["--config", "/etc/x.toml", "-v"]) }
        );
        assert_eq!(ok("test"), Cmd::Test { args: vec![] });
        assert_eq!(ok("test lifecycle"), Cmd::Test { args: strings(&["lifecycle"]) });
        assert_eq!(
            ok("test -p wb-tests --test backends"),
            Cmd::Test { args: strings(&["-p", "wb-tests", "--test", "backends"]) }
        );
    }

    #[test]
    fn what_test_runs_is_what_its_command_lines_say() {
        assert_eq!(ok("deb --check"), Cmd::Deb(deb::Args { check: true }));
        let smoke = bench::Args { smoke: true, out: Some("target/bench/smoke".into()), ..Default::default() };
        assert_eq!(bench("bench --smoke --out target/bench/smoke"), smoke);
        let quick = systest::Args { quick: true, ..Default::default() };
        assert_eq!(ok("systest --quick"), Cmd::Systest(quick));
        let images = systest::Args { quick: true, images: true, ..Default::default() };
        assert_eq!(ok("systest --quick --images"), Cmd::Systest(images));
        assert_eq!(ok("deb"), Cmd::Deb(Default::default()));
    }

    #[test]
    fn bench_lists_are_comma_separated() {
        let a = bench("bench --quick --check --out target/bench/check-raw");
        assert!(a.quick && a.check && a.out == Some(PathBuf::from("target/bench/check-raw")));
        let a = bench("bench --quick --check --fs ext4,xfs,btrfs");
        assert_eq!(a.fs, Some(strings(&["ext4", "xfs", "btrfs"])));
        assert_eq!(bench("bench --check-results DIR").check_results, Some("DIR".into()));
        assert_eq!(bench("bench --baseline D1,D2,D3").baseline, Some(strings(&["D1", "D2", "D3"])));
        let a = bench("bench --quick --only copy --fs ext4 --modes default,writebehindd");
        assert_eq!(a.only, Some(strings(&["copy"])));
        assert_eq!(a.modes, Some(vec![Mode::Default, Mode::Writebehindd(None)]));
        assert_eq!(bench("bench --rates raw,30").rates, Some(vec![crate::bench::RAW, 30]));
        assert_eq!(bench("bench --rates 100,0").rates, Some(vec![100, crate::bench::RAW]));
        assert_eq!(bench("bench --only multi --writers 1,10,30").writers, Some(vec![1, 10, 30]));
        let a =
            bench("bench --fs ext4 --runs 1 --only copy,multi --modes default,strict,linus,writebehindd --rates 100");
        assert_eq!(a.modes, Some(vec![Mode::Default, Mode::BdiStrict, Mode::Linus, Mode::Writebehindd(None)]));
        assert_eq!((a.runs, a.rates), (Some(1), Some(vec![100])));
        let a = bench("bench --modes writebehindd:window_seconds=0.25+pacing=false,global,dontcache");
        assert_eq!(a.modes.unwrap()[1..], [Mode::GlobalDirty, Mode::DontCache]);
        assert_eq!(bench("bench --only cost --parts per-call,flood").parts, Some(strings(&["per-call", "flood"])));
    }

    #[test]
    fn documented_invocations_parse() {
        for line in [
            "bench",
            "bench --quick",
            "bench --only db",
            "bench --only cost --runs 3",
            "bench --only beside --rates 30 --fs ext4",
            "bench --quick --only copy --fs ext4 --rates 30",
            "bench --only copy,tar,multi --fs btrfs,btrfs-zstd --modes default,writebehindd --rates 100,30 --writers 10 --runs 2",
            "bench --rates raw --only copy,tar,multi --modes default,writebehindd --fs ext4,xfs,btrfs --runs 5 --out target/bench/raw",
            "bench --quick --rates raw --only copy,tar,multi --modes default,writebehindd --fs ext4,xfs,btrfs --out target/bench/rawq-1",
            "bench --baseline target/bench/rawq-1,target/bench/rawq-2,target/bench/rawq-3",
            "bench --rates raw --only tar --modes default",
            "bench --only db --fs xfs,btrfs --modes default,writebehindd --runs 2",
            "bench --only multi --fs ext4 --rates 100 --runs 1 --writers 10",
            "vmtest",
            "vmtest --quick",
            "systest",
            "systest --only nfs",
            "systest --only db",
            "systest --quick --default-everywhere",
            "systest --quick --no-deb --only usb",
            "systest --deb target/deb/writebehindd_0.1.0_amd64.deb --kernel 7.2",
            "install",
            "uninstall",
            "deb",
        ] {
            ok(line);
        }
    }

    #[test]
    fn vmtest_and_systest_options() {
        let want = vmtest::Args {
            quick: true,
            kernel: vec!["5.10", "7.2"],
            only: strings(&["lifecycle", "backends"]),
            backend: strings(&["tracepoint"]),
        };
        assert_eq!(
            ok("vmtest --quick --kernel 5.10,7.2 --only lifecycle,backends --backend tracepoint"),
            Cmd::Vmtest(want)
        );
        let want = systest::Args {
            quick: true,
            kernel: Some(vec!["6.1"]),
            only: Some(systest::Only::Usb),
            ..Default::default()
        };
        assert_eq!(ok("systest --quick --kernel 6.1 --only usb"), Cmd::Systest(want));
        let Cmd::Systest(a) = ok("systest --only nfs --kernel 6.12,6.1") else { panic!() };
        assert_eq!((a.kernel, a.only), (Some(vec!["6.12", "6.1"]), Some(systest::Only::Nfs)));
        let Cmd::Systest(a) = ok("systest --quick --kernel 6.12 --only usb --kernel 7.2") else { panic!() };
        assert_eq!(a.kernel, Some(vec!["7.2"]));
        let Cmd::Systest(a) = ok("systest --quick --no-deb --only usb") else { panic!() };
        assert!(a.no_deb && a.deb.is_none());
    }

    #[test]
    fn install_takes_a_root() {
        assert_eq!(ok("install"), Cmd::Install(install::Args { root: "/".into() }));
        assert_eq!(ok("install --root /tmp/r"), Cmd::Install(install::Args { root: "/tmp/r".into() }));
        assert_eq!(ok("uninstall --root /tmp/r"), Cmd::Uninstall(install::Args { root: "/tmp/r".into() }));
    }

    /// The forms xtask runs itself with (vmtest's guest script, deb --check,
    /// the bench's writers) reach their functions as they are.
    #[test]
    fn internal_commands_take_their_arguments_as_they_come() {
        assert_eq!(ok("overhead"), Cmd::Overhead { args: vec![] });
        assert_eq!(ok("overhead 2"), Cmd::Overhead { args: strings(&["2"]) });
        assert_eq!(ok("deb-tryout target/deb/w.deb"), Cmd::DebTryout { args: strings(&["target/deb/w.deb"]) });
        for line in [
            "writer plain files /mnt/own 250 1024",
            "writer linus copy-tree /dev/shm/src /mnt/copy",
            "writer dontcache zeros /mnt/dd 64",
            "writer linus overwrite /mnt/f 64",
        ] {
            let want = strings(&line.split_whitespace().skip(1).collect::<Vec<_>>());
            assert_eq!(ok(line), Cmd::Writer { args: want });
        }
        let help = format!("{}", <Cli as clap::CommandFactory>::command().render_help());
        assert!(!help.contains("overhead") && !help.contains("deb-tryout") && !help.contains("writer"));
    }

    #[test]
    fn bad_arguments_are_refused_with_the_reason() {
        for (line, says) in [
            ("nosuch", "unrecognized subcommand 'nosuch'"),
            ("bench --modes bogus", "unknown mode \"bogus\""),
            ("bench --only copy,bogus", "unknown scenario \"bogus\""),
            ("bench --parts tar,bogus", "unknown part of cost \"bogus\""),
            ("bench --fs zfs", "no filesystem \"zfs\""),
            ("bench --rates fast", "\"fast\" is neither MiB/s nor raw"),
            ("bench --writers ten", "invalid digit"),
            ("bench --runs", "a value is required for '--runs <N>'"),
            ("bench --quick --smoke", "cannot be used with"),
            ("bench --check-results D --baseline D", "cannot be used with"),
            ("bench --frobnicate", "unexpected argument '--frobnicate'"),
            ("vmtest --only nope", "vmtest runs no test \"nope\""),
            ("vmtest --backend kprobe", "invalid value 'kprobe'"),
            ("vmtest --kernel 4.19", "no kernel 4.19"),
            ("systest --only nope", "invalid value 'nope'"),
            ("systest --kernel 6.2", "no kernel 6.2"),
            ("systest --deb x.deb --no-deb", "cannot be used with"),
            ("deb --chek", "unexpected argument '--chek'"),
            ("install /tmp/r", "unexpected argument '/tmp/r'"),
        ] {
            let e = parse(line).err().unwrap_or_else(|| panic!("{line} parsed"));
            assert!(e.to_string().contains(says), "{line}: {e}");
            assert_eq!(e.exit_code(), 2, "{line}");
        }
    }
}
