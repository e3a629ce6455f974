//! The man pages, generated at package time from what the programs and the
//! policy files already say, so they cannot go stale:
//!
//! * writebehindd(8) and wbctl(8): help2man, from each binary's --help and
//!   --version (the daemon's USAGE string, wbctl's clap definitions). One
//!   tool for both, and no change to how either parses its arguments.
//! * writebehindd.policy(5): rendered here from policies/README.md (the
//!   format), policies/default.toml (every key, its default and its
//!   comment) and policies/examples/.

use std::{fs, path::Path, process::Command};

use anyhow::Result;

use super::{OUT, gzip, output, write};
use crate::layout::{DEBIAN, LOCAL, POLICY_DIR};

pub fn write_all(stage: &Path, version: &str) -> Result<()> {
    let man = stage.join("usr/share/man");
    let daemon = help_for_help2man()?;
    let see_also = |others: &str| format!("[SEE ALSO]\n{others}\n");
    help2man(
        &daemon,
        "write-behind for streaming writers",
        &see_also(".BR wbctl (8),\n.BR writebehindd.policy (5)"),
        &man,
    )?;
    let wbctl = std::path::absolute(crate::release_bin("wbctl"))?;
    let wbctl_extra = command_options(&wbctl)? + &see_also(".BR writebehindd (8)");
    help2man(&wbctl, "query and control writebehindd", &wbctl_extra, &man)?;
    let page = man.join("man5/writebehindd.policy.5");
    write(&page, policy_page(version)?.as_bytes())?;
    gzip(&page)
}

/// help2man reads a synopsis from "Usage:" and "  or:" lines; the daemon
/// prints "usage:" and aligns its other forms under it. A wrapper script
/// rewrites just that, and passes everything else through.
fn help_for_help2man() -> Result<std::path::PathBuf> {
    let bin = std::path::absolute(crate::release_bin("writebehindd"))?;
    let script = std::path::absolute(Path::new(OUT).join("help2man/writebehindd"))?;
    let text = format!(
        "#!/bin/sh\n'{}' \"$@\" | sed -e 's/^usage:/Usage:/' -e 's/^  *writebehindd /  or:  writebehindd /'\n",
        bin.display()
    );
    write(&script, text.as_bytes())?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755))?;
    Ok(script)
}

/// wbctl's --help lists its commands; each command's own arguments and
/// options (`policy --pid`) are only in `wbctl COMMAND --help`: a section
/// with those, less the global ones.
fn command_options(wbctl: &Path) -> Result<String> {
    let help = |args: &[&str]| output(Command::new(wbctl).args(args).arg("--help"));
    let top = help(&[])?;
    let long = |l: &&str| l.split_whitespace().find(|w| w.starts_with("--")).map(str::to_owned);
    let global: Vec<String> = section(&top, "Options:").iter().filter_map(long).collect();
    let mut out = String::from("[COMMAND OPTIONS]\n");
    for cmd in section(&top, "Commands:").iter().filter_map(|l| l.split_whitespace().next()) {
        if cmd == "help" {
            continue;
        }
        let text = help(&[cmd])?;
        let own: Vec<String> = ["Arguments:", "Options:"]
            .iter()
            .flat_map(|s| section(&text, s))
            .filter(|l| long(l).is_none_or(|o| !global.contains(&o)))
            .map(|l| escape(l.trim()))
            .collect();
        if !own.is_empty() {
            out += &format!(".TP\n.B wbctl {cmd}\n{}\n", own.join("\n.br\n"));
        }
    }
    Ok(out)
}

/// The lines of a clap help section ("Options:" up to a blank line).
fn section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines().skip_while(|l| *l != title).skip(1).take_while(|l| !l.trim().is_empty()).collect()
}

fn help2man(bin: &Path, name: &str, include: &str, man: &Path) -> Result<()> {
    let program = bin.file_name().unwrap().to_string_lossy().into_owned();
    let extra = Path::new(OUT).join(format!("help2man/{program}.h2m"));
    write(&extra, include.as_bytes())?;
    let page = man.join(format!("man8/{program}.8"));
    let mut cmd = Command::new("help2man");
    cmd.args(["--no-info", "--section=8", "--name", name]).arg("--include").arg(&extra).arg(bin);
    // Dated by the commit, not the build: the same source, the same page.
    cmd.env("SOURCE_DATE_EPOCH", super::commit_time()?);
    write(&page, output(&mut cmd)?.as_bytes())?;
    gzip(&page)
}

/// writebehindd.policy(5) in roff.
fn policy_page(version: &str) -> Result<String> {
    let date = output(Command::new("git").args(["log", "-1", "--format=%as"]))?;
    let mut out = format!(
        ".TH WRITEBEHINDD.POLICY 5 \"{date}\" \"writebehindd {version}\" \"File Formats\"\n\
         .SH NAME\nwritebehindd.policy \\- policy files of writebehindd\n\
         .SH SYNOPSIS\n.I /{POLICY_DIR}/*.toml\n.SH DESCRIPTION\n"
    );
    out += &markdown(&fs::read_to_string("policies/README.md")?);
    out += ".SH KEYS\n";
    out += &keys(&fs::read_to_string("policies/default.toml")?);
    out += ".SH EXAMPLES\n";
    for f in DEBIAN.files()?.iter().filter(|f| f.dst.contains("/examples/")) {
        out += &format!(
            ".SS {}\n.EX\n{}.EE\n",
            f.dst.rsplit('/').next().unwrap(),
            escape_block(&fs::read_to_string(&f.src)?)
        );
    }
    // The README names the repository's files; say where the package puts them.
    let doc = DEBIAN.doc_dir;
    out += &format!(
        ".SH FILES\n.TP\n.I /{POLICY_DIR}/\npolicy drop-ins, applied in name order\n\
         .TP\n.I /{doc}/default.toml\nthe embedded default\n.TP\n.I /{doc}/examples/\nthe examples above\n\
         .SH SEE ALSO\n.BR writebehindd (8),\n.BR wbctl (8)\n"
    );
    debug_assert!(!out.contains(LOCAL.doc_dir));
    Ok(out)
}

/// default.toml: its first comment is an introduction; after it, each
/// comment block documents the keys set right below it.
fn keys(toml: &str) -> String {
    let mut out = String::new();
    let mut blocks = toml.split("\n\n").filter(|b| !b.trim().is_empty());
    if let Some(intro) = blocks.next() {
        out += &format!(".PP\n{}\n", inline(&comment_text(intro)));
    }
    for block in blocks {
        let settings: Vec<String> = block
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains('='))
            .map(|l| format!("\\fB{}\\fR", escape(l.trim())))
            .collect();
        out += &format!(".TP\n{}\n{}\n", settings.join(", "), inline(&comment_text(block)));
    }
    out
}

/// The text of a block's comment lines, joined.
fn comment_text(block: &str) -> String {
    let lines = block.lines().filter_map(|l| l.strip_prefix('#')).map(str::trim);
    lines.collect::<Vec<_>>().join(" ")
}

/// policies/README.md's Markdown (headings, paragraphs, "- " lists,
/// `code`) as man macros.
fn markdown(md: &str) -> String {
    let mut out = String::new();
    for block in md.split("\n\n").map(str::trim).filter(|b| !b.is_empty()) {
        if block.starts_with("# ") {
            continue; // the page's own title
        }
        if block.starts_with("- ") {
            for item in block.split("\n- ") {
                let item = item.trim_start_matches("- ").split_whitespace().collect::<Vec<_>>().join(" ");
                out += &format!(".IP \\(bu 2\n{}\n", inline(&item));
            }
        } else {
            out += &format!(".PP\n{}\n", inline(&block.split_whitespace().collect::<Vec<_>>().join(" ")));
        }
    }
    out
}

/// One paragraph's text: `code` in bold, roff's special characters escaped.
fn inline(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 1 {
            out += &format!("\\fB{}\\fR", escape(part));
        } else {
            out += &escape(part);
        }
    }
    out
}

fn escape(text: &str) -> String {
    text.replace('\\', "\\e")
}

/// Literal lines: also a leading . or ' must not be read as a request.
fn escape_block(text: &str) -> String {
    text.lines().map(|l| format!("\\&{}\n", escape(l))).collect()
}
