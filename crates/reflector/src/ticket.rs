//! `reflector ticket`: plays the game backend for a local test. It writes a
//! development ticket key file (if the file does not exist yet) and prints a
//! player ticket signed with that file's first HS256 key, so the quick start
//! needs no backend and no hand-written JWT.

use reflector_proto::ticket::TicketMinter;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "The key file is the format `reflector control --ticket-keys` and \
`reflector bots --ticket-keys` read. If FILE does not exist, a DEVELOPMENT key file is written \
there (mode 0600, one random HS256 key, marked as for development in its first lines); a \
production game backend signs tickets with its own key and never runs this command.\n\n\
Example (a ticket for player 1, then a join token with it from a control server on the same key file):\n  \
od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > secret\n  \
reflector ticket --ticket-keys tickets.toml --player 1 > ticket\n  \
reflector control --secret-file secret --reflector 127.0.0.1:4000-4015 --ticket-keys tickets.toml\n  \
curl -sf -H \"Authorization: Bearer $(cat ticket)\" 'http://127.0.0.1:8700/join?player=1&x=0&y=0'")]
pub struct TicketArgs {
    /// Ticket key file (TOML): written as a development key file if it does not exist, then its
    /// first HS256 key signs the ticket.
    #[arg(long, value_name = "FILE")]
    pub ticket_keys: PathBuf,
    /// The player the ticket is for (its `sub` claim).
    #[arg(long, default_value_t = 1)]
    pub player: u32,
    /// How long the ticket is valid, with a unit (`90s`, `10m`, `1h`).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    pub ttl: Duration,
}

fn parse_ttl(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("'{s}': {e}"))?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(7 * 86_400) {
        return Err(format!("'{s}' is not between 1s and 7d"));
    }
    Ok(d)
}

/// The first lines of a key file this command writes.
const DEV_HEADER: &str = "\
# DEVELOPMENT ticket keys, written by `reflector ticket` for a local test.
# Anyone who can read this file can mint tickets for any player: do not use it
# in production, where the game's backend keeps its own signing key and the
# control server gets only what it needs to verify (see `reflector control --help`).
";

/// Writes a development key file at `path` (mode 0600; never over an
/// existing file) with one random HS256 key; returns its kid.
pub fn write_dev_key_file(path: &Path) -> Result<String, String> {
    let mut secret = [0u8; 32];
    getrandom::getrandom(&mut secret).map_err(|e| format!("no random numbers for a key: {e}"))?;
    let kid = format!("dev-{}", hex::encode(&secret[..2]));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot create ticket key file {}: {e}", path.display()))?;
    let text = format!(
        "{DEV_HEADER}\n[[key]]\nkid = \"{kid}\"\nalg = \"HS256\"\nsecret_hex = \"{}\"\n",
        hex::encode(secret)
    );
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("cannot write ticket key file {}: {e}", path.display()))?;
    Ok(kid)
}

/// `reflector ticket`: the ticket on stdout, what was done on stderr.
pub fn run(args: &TicketArgs) -> Result<(), String> {
    if !args.ticket_keys.exists() {
        let kid = write_dev_key_file(&args.ticket_keys)?;
        eprintln!(
            "reflector ticket: wrote a DEVELOPMENT ticket key file {} (mode 0600, HS256 key \"{kid}\"): \
             give it to `reflector control --ticket-keys` and `reflector bots --ticket-keys`; not for production",
            args.ticket_keys.display()
        );
    }
    let minter = TicketMinter::from_file(&args.ticket_keys).map_err(|e| e.to_string())?;
    let now_s = reflector_proto::unix_now_ms() / 1000;
    println!("{}", minter.mint(args.player, now_s, args.ttl.as_secs()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn dev_key_file_is_private_marked_and_never_overwritten() {
        let dir = std::env::temp_dir().join(format!("reflector-ticket-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys.toml");
        let _ = std::fs::remove_file(&path);
        let kid = write_dev_key_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# DEVELOPMENT"), "{text}");
        let keys = reflector_proto::ticket::read_key_file(&path).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!((keys[0].kid.as_str(), keys[0].alg.as_str()), (kid.as_str(), "HS256"));
        assert_eq!(keys[0].secret_hex.as_ref().map(String::len), Some(64));
        let again = write_dev_key_file(&path).unwrap_err();
        assert!(
            again.contains("cannot create") && again.contains("keys.toml"),
            "{again}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn ttl_has_a_unit_and_bounds() {
        assert_eq!(parse_ttl("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_ttl("0s").unwrap_err().contains("between"));
        assert!(parse_ttl("30").unwrap_err().contains("unit"));
    }
}
