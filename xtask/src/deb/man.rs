//! The man pages, generated at package time from what the programs and the
//! policy files already say, so they cannot go stale:
//!
//! * writebehindd(8) and wbctl(8): clap_mangen, from the programs' clap
//!   definitions (writebehindd-cli, which both binaries parse with), plus
//!   what clap does not hold: the daemon's synopsis forms, wbctl's commands
//!   with their own options, and the pages each refers to.
//! * writebehindd.policy(5): rendered here from policies/README.md (the
//!   format), policies/default.toml (every key, its default and its
//!   comment) and policies/examples/.

use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result};
use clap_mangen::Man;
use writebehindd_cli::clap::{self, CommandFactory};

use super::{gzip, output, write};
use crate::layout::{DEBIAN, LOCAL, POLICY_DIR};

pub fn write_all(stage: &Path, version: &str) -> Result<()> {
    let man = stage.join("usr/share/man");
    // Dated by the commit, not the build: the same source, the same page.
    let date = output(Command::new("git").args(["log", "-1", "--format=%as"]))?;
    let daemon = writebehindd_cli::daemon::Args::command();
    let text = program_page(daemon, "write-behind for streaming writers", version, &date)?
        + &see_also(&["wbctl (8)", "writebehindd.policy (5)"]);
    write_page(&man.join("man8/writebehindd.8"), &text)?;
    let wbctl = writebehindd_cli::wbctl::Cli::command();
    let text =
        program_page(wbctl, "query and control writebehindd", version, &date)? + &see_also(&["writebehindd (8)"]);
    write_page(&man.join("man8/wbctl.8"), &text)?;
    write_page(&man.join("man5/writebehindd.policy.5"), &policy_page(version)?)
}

fn write_page(page: &Path, text: &str) -> Result<()> {
    write(page, text.as_bytes())?;
    gzip(page)
}

fn see_also(pages: &[&str]) -> String {
    let refs: Vec<String> = pages.iter().map(|p| format!(".BR {p}")).collect();
    format!(".SH \"SEE ALSO\"\n{}\n", refs.join(",\n"))
}

/// A program's page in section 8, `name` its NAME line.  clap_mangen's
/// sections, but for a synopsis of the forms the program's usage spells
/// out (the daemon's), clap's subcommands as a list of commands with their
/// own options (wbctl's: clap_mangen would refer to a page per command)
/// and the text after the options as NOTES.
fn program_page(cmd: clap::Command, name: &str, version: &str, date: &str) -> Result<String> {
    let program = cmd.get_name().to_owned();
    let description = cmd.get_long_about().or(cmd.get_about()).cloned();
    // clap keeps a version as &'static str: this process renders two pages and exits.
    let mut cmd = cmd.version(&*version.to_owned().leak()).about(name.to_owned());
    if let Some(d) = description {
        cmd = cmd.long_about(d);
    }
    let man = Man::new(cmd.clone())
        .title(program.to_uppercase())
        .section("8")
        .date(date)
        .source(format!("{program} {version}"))
        .manual("System Administration Utilities");
    let mut out = rendered(|w| man.render_title(w))?;
    out += &section(|w| man.render_name_section(w))?;
    match cmd.get_overridden_usage() {
        Some(usage) => out += &synopsis(&program, &usage.to_string()),
        None => out += &section(|w| man.render_synopsis_section(w))?,
    }
    out += &section(|w| man.render_description_section(w))?;
    out += &section(|w| man.render_options_section(w))?;
    out += &commands(&program, &cmd)?;
    if let Some(notes) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        out += ".SH NOTES\n";
        out += &notes.to_string().lines().map(|l| format!(".PP\n{}\n", inline(l))).collect::<String>();
    }
    Ok(out + &section(|w| man.render_version_section(w))?)
}

/// What one of clap_mangen's render calls writes.
fn rendered(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Result<String> {
    let mut out = Vec::new();
    render(&mut out)?;
    Ok(String::from_utf8(out)?)
}

/// The same, without the preamble roff writes before each rendering (the
/// page's first, its title, keeps it).
fn section(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Result<String> {
    const PREAMBLE: &str = ".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";
    let text = rendered(render)?;
    Ok(text.strip_prefix(PREAMBLE).map(str::to_owned).unwrap_or(text))
}

/// A synopsis from a usage text: one line per form (a line that does not
/// start with the program's name continues the form above it).
fn synopsis(program: &str, usage: &str) -> String {
    let mut forms: Vec<String> = Vec::new();
    for line in usage.lines().map(str::trim) {
        match (line.strip_prefix(program), forms.last_mut()) {
            (None, Some(form)) => *form += &format!(" {line}"),
            (rest, _) => forms.push(rest.unwrap_or(line).trim().to_owned()),
        }
    }
    let forms: Vec<String> = forms.iter().map(|f| format!("\\fB{program}\\fR {}\n", roff_text(f))).collect();
    format!(".SH SYNOPSIS\n{}", forms.join(".br\n"))
}

/// COMMANDS, each with what it does, and COMMAND OPTIONS: the arguments
/// and options a command takes beside the global ones.  Empty for a
/// program without commands.
fn commands(program: &str, cmd: &clap::Command) -> Result<String> {
    let subs: Vec<&clap::Command> = cmd.get_subcommands().filter(|c| c.get_name() != "help").collect();
    if subs.is_empty() {
        return Ok(String::new());
    }
    let mut list = String::from(".SH COMMANDS\n");
    let mut options = String::from(".SH \"COMMAND OPTIONS\"\n");
    for sub in subs {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        list += &format!(".TP\n\\fB{program} {}\\fR\n{}\n", sub.get_name(), inline(&about));
        // Its own arguments only: the global ones propagate when the whole
        // command is built, and --help is everywhere.
        let own = sub.clone().disable_help_flag(true);
        if own.get_arguments().next().is_none() {
            continue;
        }
        let man = Man::new(own);
        let text = section(|w| man.render_options_section(w))?;
        let items = text.strip_prefix(".SH OPTIONS\n").context("clap_mangen's options section changed form")?;
        options += &format!(".SS \"{program} {}\"\n{items}", sub.get_name());
    }
    Ok(list + &options)
}

/// Plain text for roff: backslashes and hyphens escaped.
fn roff_text(text: &str) -> String {
    escape(text).replace('-', "\\-")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn page(cmd: clap::Command, name: &str) -> String {
        program_page(cmd, name, "9.9.9", "2001-02-03").unwrap()
    }

    #[test]
    fn the_daemons_page_has_its_synopsis_forms_options_and_notes() {
        let p = page(writebehindd_cli::daemon::Args::command(), "write-behind for streaming writers");
        assert!(p.contains("\n.TH WRITEBEHINDD 8 2001-02-03 \"writebehindd 9.9.9\""), "{p}");
        assert_eq!(p.matches(".ds Aq '").count(), 1, "roff's preamble once: {p}");
        assert!(p.contains("writebehindd \\- write\\-behind for streaming writers"), "{p}");
        let synopsis: Vec<&str> = p.lines().skip_while(|l| *l != ".SH SYNOPSIS").skip(1).take(5).collect();
        assert_eq!(synopsis.len(), 5, "{p}");
        assert!(synopsis[0].starts_with("\\fBwritebehindd\\fR [\\-\\-policy\\-dir DIR]"), "{p}");
        assert!(synopsis[0].contains("[\\-\\-max\\-streams N]"), "continued on the form's line: {p}");
        assert_eq!(
            synopsis[1..],
            [".br", "\\fBwritebehindd\\fR \\-\\-check\\-policy PATH...", ".br", "\\fBwritebehindd\\fR \\-\\-restore"]
        );
        for text in [
            ".SH DESCRIPTION\nKeeps the dirty page cache",
            ".SH OPTIONS",
            "control\\-group",
            "[default: 8192]",
            ".SH NOTES",
            "RUST_LOG",
            ".SH VERSION",
        ] {
            assert!(p.contains(text), "{text:?} missing:\n{p}");
        }
        assert!(!p.contains(".SH COMMANDS"));
    }

    #[test]
    fn wbctls_page_lists_its_commands_and_their_options() {
        let p = page(writebehindd_cli::wbctl::Cli::command(), "query and control writebehindd");
        assert!(p.contains("wbctl \\- query and control writebehindd"), "{p}");
        assert!(p.contains(".SH DESCRIPTION\nQuery and control the writebehindd daemon"), "{p}");
        let commands: Vec<&str> = p.lines().filter_map(|l| l.strip_prefix("\\fBwbctl ")).collect();
        assert_eq!(commands.len(), 9, "every command but help: {p}");
        let options = p.split(".SH \"COMMAND OPTIONS\"\n").nth(1).unwrap();
        let own: Vec<&str> = options.lines().filter_map(|l| l.strip_prefix(".SS ")).collect();
        assert_eq!(own, ["\"wbctl policy\"", "\"wbctl metrics\"", "\"wbctl completions\""], "{p}");
        assert!(options.contains("\\-\\-pid") && options.contains("powershell") && !options.contains("\\-\\-socket"));
    }
}
