//! One config file (TOML) for `reflector serve` and `reflector control`.
//!
//! The keys are the long options of the command, with `_` for `-`
//! (`--member-timeout` is `member_timeout`), so every option, including
//! ones added later, is a key without a second list to keep in step. A
//! value is what the option takes on the command line: a string, a number,
//! `true`/`false` for a switch, an array for an option that repeats.
//! Options given on the command line override the file (and so does an
//! option that conflicts with a key, e.g. `--anonymous-joins` over
//! `ticket_keys`). A key that is no option of the command is an error
//! naming it. Secrets appear only as the paths of their files
//! (`secret_file`, `ticket_keys`, `tls_key`): no option takes one inline.
//! Relative paths are relative to the working directory, as on the
//! command line.
//!
//! The file is read into command-line arguments and parsed by clap with
//! the rest, so a value is checked exactly as on the command line.
//! `--print-config` prints the effective configuration in the same format
//! (each key with its option's help as a comment), which reads back as the
//! same configuration.

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};
use std::ffi::OsString;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The subcommands that take `--config`.
pub const CONFIGURABLE: [&str; 2] = ["serve", "control"];

/// Ids of the arguments that are not configuration.
const NOT_KEYS: [&str; 4] = ["config", "print_config", "help", "version"];

/// Adds `--config`, `--log-format` and `--print-config` to the
/// configurable subcommands.
pub fn with_config_args(cmd: Command) -> Command {
    CONFIGURABLE.iter().fold(cmd, |cmd, name| {
        cmd.mut_subcommand(name, |s| {
            s.arg(
                Arg::new("config")
                    .long("config")
                    .value_name("FILE")
                    .value_parser(clap::value_parser!(PathBuf))
                    .help(
                        "Read options from this TOML file: keys are the long options with '_' for '-' \
                         (e.g. secret_file = \"secret\"); options on the command line override it",
                    ),
            )
            .arg(
                Arg::new("log_format")
                    .long("log-format")
                    .value_name("FORMAT")
                    .value_parser(["text", "json"])
                    .default_value("text")
                    .help("Logs on stderr as text, or as one JSON object per line (for a log collector)"),
            )
            .arg(
                Arg::new("print_config")
                    .long("print-config")
                    .action(ArgAction::SetTrue)
                    .help("Print the effective configuration (file and options merged) as TOML and exit"),
            )
        })
    })
}

/// `--log-format json` for the subcommand of `m`.
pub fn json_logs(m: &ArgMatches) -> bool {
    m.subcommand()
        .filter(|(name, _)| CONFIGURABLE.contains(name))
        .and_then(|(_, sub)| sub.get_one::<String>("log_format"))
        .is_some_and(|f| f == "json")
}

/// What the command line asks for.
pub enum Parsed {
    /// Run with these matches.
    Run(ArgMatches),
    /// `--print-config`: this text on stdout, then exit 0.
    Print(String),
}

/// Parses `argv` with the config file, if `--config` names one, merged in.
/// Errors are the message to print (clap's own errors exit as clap does).
pub fn parse(cmd: Command, argv: Vec<OsString>) -> Result<Parsed, String> {
    // A first pass only to find --config and what the command line gives;
    // it tolerates what the file may supply (required options).
    let first = cmd.clone().ignore_errors(true).try_get_matches_from(&argv).ok();
    let found = first.as_ref().and_then(|m| {
        let (name, sub) = m.subcommand()?;
        if !CONFIGURABLE.contains(&name) {
            return None;
        }
        let path = sub.get_one::<PathBuf>("config")?.clone();
        Some((name.to_string(), sub.clone(), path))
    });
    let argv = match found {
        Some((name, sub_matches, path)) => {
            let sub_cmd = cmd
                .find_subcommand(&name)
                .ok_or_else(|| format!("no subcommand {name}"))?;
            let extra = file_args(sub_cmd, &sub_matches, &path)?;
            // An error of the command line alone is reported as clap
            // reports it; one that needs the file's values names the file.
            if let Err(e) = cmd.clone().try_get_matches_from(&argv) {
                if e.kind() != clap::error::ErrorKind::MissingRequiredArgument {
                    e.exit();
                }
            }
            let mut argv = argv;
            argv.extend(extra);
            let matches = cmd.clone().try_get_matches_from(&argv).map_err(|e| {
                let text = e.to_string();
                // clap's message without its "try --help" trailer.
                let first = text.split("\n\n").next().unwrap_or(&text);
                format!(
                    "with config file {}: {}",
                    path.display(),
                    first.trim().trim_start_matches("error: ")
                )
            })?;
            return finish(&cmd, matches);
        }
        None => argv,
    };
    finish(&cmd, cmd.clone().get_matches_from(argv))
}

fn finish(cmd: &Command, matches: ArgMatches) -> Result<Parsed, String> {
    if let Some((name, sub)) = matches.subcommand() {
        if CONFIGURABLE.contains(&name) && sub.get_flag("print_config") {
            let sub_cmd = cmd
                .find_subcommand(name)
                .ok_or_else(|| format!("no subcommand {name}"))?;
            return Ok(Parsed::Print(print_config(name, sub_cmd, sub)));
        }
    }
    Ok(Parsed::Run(matches))
}

/// The arguments that are configuration keys, in their order.
fn keys(sub_cmd: &Command) -> impl Iterator<Item = &Arg> {
    sub_cmd
        .get_arguments()
        .filter(|a| !NOT_KEYS.contains(&a.get_id().as_str()) && a.get_long().is_some())
}

/// An argument's key: its long option with `_` for `-`.
fn key_of(arg: &Arg) -> String {
    arg.get_long().unwrap_or_default().replace('-', "_")
}

fn on_command_line(m: &ArgMatches, id: &str) -> bool {
    m.value_source(id) == Some(ValueSource::CommandLine)
}

/// Whether the command line gives `arg`, or an argument that conflicts
/// with it (either side may declare the conflict).
fn overridden(sub_cmd: &Command, given: &ArgMatches, arg: &Arg) -> bool {
    on_command_line(given, arg.get_id().as_str())
        || sub_cmd.get_arguments().any(|other| {
            on_command_line(given, other.get_id().as_str())
                && (sub_cmd
                    .get_arg_conflicts_with(arg)
                    .iter()
                    .any(|c| c.get_id() == other.get_id())
                    || sub_cmd
                        .get_arg_conflicts_with(other)
                        .iter()
                        .any(|c| c.get_id() == arg.get_id()))
        })
}

/// The config file at `path` as command-line arguments, leaving out what
/// the command line (`given`) already sets or rules out.
pub fn file_args(sub_cmd: &Command, given: &ArgMatches, path: &Path) -> Result<Vec<OsString>, String> {
    let p = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config file {p}: {e}"))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| format!("config file {p}: {e}"))?;
    let mut out = Vec::new();
    for (key, value) in &table {
        if let Some(old) = keys(sub_cmd).find(|a| key_of(a) == *key && a.is_hide_set()) {
            let new = sub_cmd
                .get_arg_conflicts_with(old)
                .first()
                .map(|a| key_of(a))
                .unwrap_or_default();
            return Err(format!(
                "config file {p}: '{key}' is the old spelling of '{new}', which takes a unit (e.g. {new} = \"10s\" or \"500ms\")"
            ));
        }
        let Some(arg) = keys(sub_cmd).find(|a| key_of(a) == *key) else {
            return Err(format!(
                "config file {p}: unknown key '{key}' (the keys are the long options of `reflector {}` \
                 with '_' for '-'; `reflector {} --print-config` lists them)",
                sub_cmd.get_name(),
                sub_cmd.get_name()
            ));
        };
        if overridden(sub_cmd, given, arg) {
            continue;
        }
        let long = arg.get_long().unwrap_or(key);
        let bad = |want: &str| format!("config file {p}: key '{key}' wants {want}, not {value}");
        match arg.get_action() {
            ArgAction::SetTrue => match value {
                toml::Value::Boolean(true) => out.push(OsString::from(format!("--{long}"))),
                toml::Value::Boolean(false) => {}
                _ => return Err(bad("true or false")),
            },
            ArgAction::Append => {
                let items = match value {
                    toml::Value::Array(items) => items.clone(),
                    v => vec![v.clone()],
                };
                for item in &items {
                    let text = scalar(item).ok_or_else(|| bad("a string or number, or an array of them"))?;
                    out.push(OsString::from(format!("--{long}={text}")));
                }
            }
            _ => {
                let text = scalar(value).ok_or_else(|| bad("a string or a number"))?;
                out.push(OsString::from(format!("--{long}={text}")));
            }
        }
    }
    Ok(out)
}

/// A value as its command-line text.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

/// Command-line text as the TOML value that reads back as the same text.
fn value_of(text: &str) -> toml::Value {
    let numeric = !text.is_empty() && text.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c));
    if numeric {
        if let Ok(i) = text.parse::<i64>() {
            if i.to_string() == text {
                return toml::Value::Integer(i);
            }
        }
        if let Ok(f) = text.parse::<f64>() {
            if f.is_finite() && f.to_string() == text {
                return toml::Value::Float(f);
            }
        }
    }
    toml::Value::String(text.to_string())
}

/// The effective configuration of `reflector NAME` as TOML: every key in
/// the command's order with its help as a comment; unset ones commented out.
pub fn print_config(name: &str, sub_cmd: &Command, m: &ArgMatches) -> String {
    let mut out = format!("# reflector {name}: effective configuration (read it back with --config FILE)\n");
    // Hidden options are old spellings in milliseconds (`--member-timeout-ms`);
    // one that was given shows as the value of the option it stands for.
    let mut instead: Vec<(String, toml::Value)> = Vec::new();
    for old in keys(sub_cmd).filter(|a| a.is_hide_set()) {
        let id = old.get_id().as_str();
        if let (true, Some(raw)) = (id.ends_with("_ms"), m.get_raw(id).and_then(|mut v| v.next())) {
            if let Some(new) = sub_cmd.get_arg_conflicts_with(old).first() {
                let text = format!("{}ms", raw.to_string_lossy());
                instead.push((new.get_id().to_string(), toml::Value::String(text)));
            }
        }
    }
    for arg in keys(sub_cmd) {
        let id = arg.get_id().as_str();
        if arg.is_hide_set() {
            continue;
        }
        if let Some(help) = arg.get_help() {
            let help = help.to_string();
            let first = help.split(". ").next().unwrap_or(&help).trim_end_matches('.');
            let _ = writeln!(out, "\n# {first}.");
        } else {
            out.push('\n');
        }
        let raw: Vec<String> = m
            .get_raw(id)
            .map(|vals| vals.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let value = match arg.get_action() {
            ArgAction::SetTrue => Some(toml::Value::Boolean(m.get_flag(id))),
            ArgAction::Append if !raw.is_empty() => Some(toml::Value::Array(raw.iter().map(|t| value_of(t)).collect())),
            _ => raw.first().map(|t| value_of(t)),
        };
        let value = instead
            .iter()
            .find(|(new, _)| new == id)
            .map(|(_, v)| v.clone())
            .or(value);
        let key = key_of(arg);
        match value {
            Some(v) => {
                let _ = writeln!(out, "{key} = {v}");
            }
            None => {
                let _ = writeln!(out, "# {key} =   (not set)");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_the_same_text() {
        for text in [
            "4000-4015",
            "127.0.0.1",
            "5",
            "2.5",
            "1e3",
            "-",
            "nan",
            "inf",
            "10s",
            "007",
            "",
        ] {
            let v = value_of(text);
            assert_eq!(scalar(&v).as_deref(), Some(text), "{text} -> {v}");
        }
        assert_eq!(value_of("5"), toml::Value::Integer(5));
        assert_eq!(value_of("2.5"), toml::Value::Float(2.5));
        assert_eq!(value_of("nan"), toml::Value::String("nan".into()));
    }
}

#[cfg(test)]
mod cli_tests {
    use super::*;
    use clap::CommandFactory;

    /// Secrets are configured only as files: every option of `serve` and
    /// `control` named for a secret or a key takes a path.
    #[test]
    fn secrets_are_only_paths() {
        let cmd = with_config_args(crate::Cli::command());
        for name in CONFIGURABLE {
            let sub = cmd.find_subcommand(name).unwrap();
            for arg in keys(sub) {
                let key = key_of(arg);
                if ["secret", "key", "password", "token"].iter().any(|w| key.contains(w)) && key != "token_ttl" {
                    assert_eq!(
                        arg.get_value_parser().type_id(),
                        clap::builder::ValueParser::path_buf().type_id(),
                        "{name} {key} must take a file path"
                    );
                }
            }
        }
    }

    #[test]
    fn every_key_is_distinct_and_known() {
        let cmd = with_config_args(crate::Cli::command());
        for name in CONFIGURABLE {
            let sub = cmd.find_subcommand(name).unwrap();
            let mut seen = std::collections::HashSet::new();
            for arg in keys(sub) {
                assert!(seen.insert(key_of(arg)), "{name}: key {} twice", key_of(arg));
            }
            assert!(seen.contains("secret_file"), "{name}");
        }
    }
}
