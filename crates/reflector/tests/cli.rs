//! The `control` and `bots` subcommands as a user runs them: the real
//! binary, refusing bad arguments with a message that names them.

use std::process::{Command, Output};

fn reflector(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the reflector binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_arguments_name_the_problem() {
    let o = reflector(&["bots", "--size", "5", "--control", "http://127.0.0.1:9"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--size"), "{}", stderr(&o));

    let o = reflector(&["bots", "--control", "127.0.0.1:8700"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("http://"), "{}", stderr(&o));

    let o = reflector(&["control", "--reflector", "127.0.0.1:4000"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--secret-file"), "{}", stderr(&o));

    let o = reflector(&[
        "control",
        "--anonymous-joins",
        "--secret-file",
        "/nonexistent/secret",
        "--reflector",
        "nothing",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("IP:PORTS"), "{}", stderr(&o));

    // Tickets or an explicit opt-out: never anonymous by default.
    let o = reflector(&["control", "--secret-file", "s", "--reflector", "127.0.0.1:4000"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--ticket-keys"), "{}", stderr(&o));
    let secret = std::env::temp_dir().join(format!("reflector-cli-secret-{}", std::process::id()));
    std::fs::write(&secret, "ab".repeat(32)).unwrap();
    let o = reflector(&[
        "control",
        "--secret-file",
        secret.to_str().unwrap(),
        "--reflector",
        "127.0.0.1:4000",
        "--ticket-keys",
        "/nonexistent/keys.toml",
    ]);
    let _ = std::fs::remove_file(&secret);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/nonexistent/keys.toml"), "{}", stderr(&o));
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("reflector-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn ticket_writes_a_development_key_file_and_mints_a_ticket_control_accepts() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("ticket");
    let keys = dir.join("tickets.toml");
    let k = keys.to_str().unwrap();
    let o = reflector(&["ticket", "--ticket-keys", k, "--player", "7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("DEVELOPMENT"), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&keys).unwrap().permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&keys).unwrap();
    assert!(text.starts_with("# DEVELOPMENT"), "{text}");
    let ticket = String::from_utf8(o.stdout).unwrap();
    let verifier = reflector_control::players::TicketVerifier::from_file(&keys).unwrap();
    let now_s = reflector_proto::unix_now_ms() / 1000;
    assert_eq!(verifier.verify(ticket.trim(), now_s), Ok(7));
    // A second call reuses the file (and says nothing about writing it).
    let o = reflector(&["ticket", "--ticket-keys", k, "--player", "8", "--ttl", "90s"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("DEVELOPMENT"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), text);
    let ticket = String::from_utf8(o.stdout).unwrap();
    assert_eq!(verifier.verify(ticket.trim(), now_s), Ok(8));
    // A TTL needs its unit.
    let o = reflector(&["ticket", "--ticket-keys", k, "--ttl", "90"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--ttl"), "{}", stderr(&o));
    // A key file with nothing to sign with is named.
    std::fs::write(
        dir.join("ed.toml"),
        "[[key]]\nkid = \"x\"\nalg = \"EdDSA\"\npublic_pem = \"\"\n",
    )
    .unwrap();
    let o = reflector(&["ticket", "--ticket-keys", dir.join("ed.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("ed.toml") && stderr(&o).contains("HS256"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The examples of `reflector --help` and `reflector control --help` name
/// everything the commands require (the ticket key file included).
#[test]
fn help_examples_name_the_required_options() {
    for args in [&["--help"][..], &["control", "--help"]] {
        let o = reflector(args);
        assert!(o.status.success());
        let help = String::from_utf8_lossy(&o.stdout).into_owned();
        let control: Vec<&str> = help
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("reflector control "))
            .collect();
        assert!(!control.is_empty(), "{help}");
        for line in control {
            assert!(
                line.contains("--ticket-keys") || line.contains("--anonymous-joins"),
                "{line}"
            );
        }
        assert!(help.contains("reflector ticket --ticket-keys"), "{help}");
    }
}

/// An address this host does not have (TEST-NET-1, RFC 5737).
const NOT_HERE: &str = "192.0.2.1";

#[test]
fn binding_an_address_this_host_lacks_names_the_address() {
    let dir = scratch("bind");
    let secret = dir.join("secret");
    std::fs::write(&secret, "ab".repeat(32)).unwrap();
    let s = secret.to_str().unwrap();
    let o = reflector(&[
        "serve",
        "--bind",
        NOT_HERE,
        "--ports",
        "4000",
        "--secret-file",
        s,
        "--duration",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("192.0.2.1 is not an address of this host") && e.contains("--bind"),
        "{e}"
    );
    assert!(!e.contains("another reflector"), "{e}");

    let metrics = format!("{NOT_HERE}:9100");
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let o = reflector(&[
        "serve",
        "--bind",
        "127.0.0.1",
        "--ports",
        &port,
        "--secret-file",
        s,
        "--metrics",
        &metrics,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("192.0.2.1 is not an address of this host"),
        "{}",
        stderr(&o)
    );

    let listen = format!("{NOT_HERE}:8700");
    let o = reflector(&[
        "control",
        "--secret-file",
        s,
        "--reflector",
        "127.0.0.1:4000",
        "--anonymous-joins",
        "--insecure-http",
        "--listen",
        &listen,
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("192.0.2.1 is not an address of this host"), "{e}");
    assert!(!e.contains("another server"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bots_exit_2_when_the_control_server_is_unreachable_as_their_help_says() {
    let help = String::from_utf8(reflector(&["bots", "--help"]).stdout).unwrap();
    assert!(
        help.contains("2 errors") && help.contains("control server unreachable"),
        "{help}"
    );
    // Nothing listens on a port this test bound and closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let o = reflector(&["bots", "--control", &url, "--count", "1", "--duration", "1", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("unreachable"), "{}", stderr(&o));
}

/// A control server on a free loopback port, with tickets from `keys`; its
/// URL and suggested request from its start-up line. Killed on drop.
struct Control {
    child: std::process::Child,
    url: String,
    hint: String,
}

impl Control {
    fn start(secret: &str, keys: &str) -> Control {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_reflector"))
            .args(["control", "--listen", "127.0.0.1:0", "--secret-file", secret])
            .args(["--reflector", "127.0.0.1:4000", "--ticket-keys", keys])
            .env("RUST_LOG", "info")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut found = None;
        for line in err.lines().take(20) {
            let line = line.unwrap();
            if let Some(rest) = line.split("control server at ").nth(1) {
                let url = format!("http://{}", rest.split(':').take(2).collect::<Vec<_>>().join(":"));
                let hint = line.split("try: ").nth(1).unwrap_or_default().to_string();
                found = Some((url, hint));
                break;
            }
        }
        let (url, hint) = found.expect("the control server's start-up line");
        Control { child, url, hint }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GET of `path` from `url` (http://IP:PORT), with a bearer ticket; the
/// whole answer.
fn http_get(url: &str, path: &str, ticket: Option<&str>) -> String {
    use std::io::{Read, Write};
    let addr = url.strip_prefix("http://").unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let auth = ticket
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// Runs bots for at most a minute of sending; returns their output and
/// whether they ended within `limit` (a refusal must end the run, not be
/// retried for all of it).
fn bots_until(args: &[&str], limit: std::time::Duration) -> (Output, bool) {
    let start = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .arg("bots")
        .args(args)
        .args(["--count", "2", "--duration", "60", "--quiet"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ended = false;
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            ended = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if !ended {
        let _ = child.kill();
    }
    (child.wait_with_output().unwrap(), ended)
}

#[test]
fn bots_refused_for_their_ticket_name_the_ticket_and_stop() {
    let dir = scratch("bots401");
    let secret = dir.join("secret");
    std::fs::write(&secret, "ab".repeat(32)).unwrap();
    let keys = dir.join("tickets.toml");
    let other = dir.join("other.toml");
    for k in [&keys, &other] {
        assert!(reflector(&["ticket", "--ticket-keys", k.to_str().unwrap()])
            .status
            .success());
    }
    let control = Control::start(secret.to_str().unwrap(), keys.to_str().unwrap());
    let limit = std::time::Duration::from_secs(30);

    // The start-up line's suggestion works as written: a ticket from
    // `reflector ticket` with this key file, then /join with it.
    let h = &control.hint;
    let ticket_cmd = h
        .split("$(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_default();
    let words: Vec<&str> = ticket_cmd.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"reflector"), "{h}");
    assert!(ticket_cmd.contains(keys.to_str().unwrap()), "{h}");
    let o = reflector(&words[1..]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ticket = stdout(&o).trim().to_string();
    let target = h.rsplit('\'').nth(1).unwrap_or_default();
    let path = target
        .strip_prefix(control.url.as_str())
        .unwrap_or_else(|| panic!("{h}"));
    assert_eq!(
        http_get(&control.url, path, Some(&ticket)).lines().next(),
        Some("HTTP/1.1 200 OK"),
        "{h}"
    );
    assert!(http_get(&control.url, path, None).starts_with("HTTP/1.1 401"));

    // No ticket key file: the message asks for one, and does not blame the reflector.
    let (o, ended) = bots_until(&["--control", &control.url], limit);
    assert!(ended, "bots kept retrying a 401: {}", stderr(&o));
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("401") && e.contains("--ticket-keys FILE") && e.contains("reflector ticket"),
        "{e}"
    );
    assert!(!e.contains("reflector running"), "{e}");

    // The wrong key file: named.
    let (o, ended) = bots_until(
        &["--control", &control.url, "--ticket-keys", other.to_str().unwrap()],
        limit,
    );
    assert!(ended, "bots kept retrying a 401: {}", stderr(&o));
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("401") && e.contains("other.toml"), "{e}");

    // The old spelling still reads the same file (and gets past the ticket check).
    // With no reflector behind the control server the bots keep trying to
    // join: still running after a few seconds means the tickets were taken.
    let (o, ended) = bots_until(
        &["--control", &control.url, "--ticket-key", keys.to_str().unwrap()],
        std::time::Duration::from_secs(3),
    );
    assert!(!ended && !stderr(&o).contains("401"), "{}", stderr(&o));
    drop(control);
    let _ = std::fs::remove_dir_all(dir);
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `serve` with a secret in `dir`, a config file there with `toml`.
fn config_dir(name: &str, toml: &str) -> (std::path::PathBuf, String, String) {
    let dir = scratch(name);
    let secret = dir.join("secret");
    std::fs::write(&secret, "ab".repeat(32)).unwrap();
    let file = dir.join("config.toml");
    std::fs::write(&file, toml.replace("SECRET", secret.to_str().unwrap())).unwrap();
    let s = secret.to_str().unwrap().to_string();
    (dir, file.to_str().unwrap().to_string(), s)
}

fn key_line<'a>(printed: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key} = ");
    printed.lines().find(|l| l.starts_with(&prefix)).unwrap_or("")
}

#[test]
fn config_file_flags_override_it_and_print_config_shows_the_result() {
    let (dir, file, _) = config_dir(
        "config-precedence",
        "secret_file = \"SECRET\"\nreplies_per_s = 7\nmax_members = 64\ngroup_data_tags = [\"4001=off\"]\nstrict_backend = true\n",
    );
    let o = reflector(&["serve", "--config", &file, "--max-members", "99", "--print-config"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = stdout(&o);
    assert_eq!(key_line(&p, "replies_per_s"), "replies_per_s = 7", "{p}");
    assert_eq!(key_line(&p, "max_members"), "max_members = 99", "{p}");
    assert_eq!(
        key_line(&p, "group_data_tags"),
        "group_data_tags = [\"4001=off\"]",
        "{p}"
    );
    assert_eq!(key_line(&p, "strict_backend"), "strict_backend = true", "{p}");
    // Defaults show too.
    assert_eq!(key_line(&p, "member_rate_pps"), "member_rate_pps = 500", "{p}");
    // A conflicting option on the command line wins over the file's key.
    let keys = dir.join("keys.toml");
    std::fs::write(
        &file,
        format!(
            "secret_file = \"s\"\nreflector = [\"127.0.0.1:4000-4001\"]\nticket_keys = \"{}\"\n",
            keys.display()
        ),
    )
    .unwrap();
    let o = reflector(&["control", "--config", &file, "--anonymous-joins", "--print-config"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = stdout(&o);
    assert_eq!(key_line(&p, "anonymous_joins"), "anonymous_joins = true", "{p}");
    assert_eq!(key_line(&p, "ticket_keys"), "", "{p}");
    assert_eq!(
        key_line(&p, "reflector"),
        "reflector = [\"127.0.0.1:4000-4001\"]",
        "{p}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn config_file_unknown_keys_and_bad_values_are_named() {
    let (dir, file, _) = config_dir(
        "config-unknown",
        "secret_file = \"SECRET\"\nmember_timeoutt = \"10s\"\n",
    );
    let o = reflector(&["serve", "--config", &file]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown key 'member_timeoutt'"), "{}", stderr(&o));
    // A mistake on the command line is not blamed on the file.
    std::fs::write(&file, "secret_file = \"s\"\n").unwrap();
    let o = reflector(&["serve", "--config", &file, "--bogus"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("'--bogus'") && !e.contains("config.toml"), "{e}");
    std::fs::write(&file, "secret_file = \"s\"\nmember_rate_pps = \"lots\"\n").unwrap();
    let o = reflector(&["serve", "--config", &file]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("config.toml") && e.contains("lots") && e.contains("--member-rate-pps"),
        "{e}"
    );
    std::fs::write(&file, "secret_file = \"s\"\nstrict_backend = \"yes\"\n").unwrap();
    let o = reflector(&["serve", "--config", &file]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("'strict_backend' wants true or false"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&file, "secret_file = [[\n").unwrap();
    let o = reflector(&["serve", "--config", &file]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("config.toml"), "{}", stderr(&o));
    let o = reflector(&["serve", "--config", dir.join("nothere.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nothere.toml"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn print_config_reads_back_as_the_same_configuration() {
    let (dir, file, secret) = config_dir("config-roundtrip", "");
    let cases: [Vec<&str>; 2] = [
        vec![
            "serve",
            "--secret-file",
            &secret,
            "--bind",
            "127.0.0.1",
            "--ports",
            "4000-4003,4010",
        ],
        vec![
            "control",
            "--secret-file",
            &secret,
            "--reflector",
            "127.0.0.1:4000-4015",
            "--reflector",
            "127.0.0.2:5000",
            "--ticket-keys",
            "keys.toml",
            "--cell-size",
            "2.5",
        ],
    ];
    for args in cases {
        let mut first = args.clone();
        first.extend(["--group-data-tags", "4001=off"].iter().filter(|_| args[0] == "serve"));
        first.push("--print-config");
        let o = reflector(&first);
        assert!(o.status.success(), "{}", stderr(&o));
        let printed = stdout(&o);
        std::fs::write(&file, &printed).unwrap();
        let o = reflector(&[args[0], "--config", &file, "--print-config"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), printed);
    }
    // And the file runs: a reflector from the config file alone.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &file,
        format!("secret_file = \"{secret}\"\nbind = \"127.0.0.1\"\nports = {port}\nduration = 0.2\nthreads = 1\n"),
    )
    .unwrap();
    let o = reflector(&["serve", "--config", &file]);
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(dir);
}

/// New duration options take a unit; each old one in milliseconds stays,
/// hidden, reads its old unit and conflicts with the new one.
#[test]
fn durations_take_units_and_old_millisecond_options_keep_their_unit() {
    let (dir, _, secret) = config_dir("units", "");
    let base = ["serve", "--secret-file", secret.as_str(), "--print-config"];
    let printed = |extra: &[&str]| {
        let o = reflector(&[&base[..], extra].concat());
        (o.status.code(), stdout(&o), stderr(&o))
    };
    let (code, p, e) = printed(&["--member-timeout", "1500ms", "--checkpoint-every", "2s"]);
    assert_eq!(code, Some(0), "{e}");
    assert_eq!(key_line(&p, "member_timeout"), "member_timeout = \"1500ms\"");
    assert_eq!(key_line(&p, "checkpoint_every"), "checkpoint_every = \"2s\"");
    let (code, p, e) = printed(&["--member-timeout-ms", "1500", "--checkpoint-hello-timeout-ms", "300"]);
    assert_eq!(code, Some(0), "{e}");
    assert_eq!(key_line(&p, "member_timeout"), "member_timeout = \"1500ms\"");
    assert_eq!(
        key_line(&p, "checkpoint_hello_timeout"),
        "checkpoint_hello_timeout = \"300ms\""
    );
    assert_eq!(key_line(&p, "member_timeout_ms"), "", "{p}");
    let (code, _, e) = printed(&["--member-timeout", "1500"]);
    assert_eq!(code, Some(2));
    assert!(e.contains("no unit") && e.contains("1500ms"), "{e}");
    let (code, _, e) = printed(&["--member-timeout", "2s", "--member-timeout-ms", "2000"]);
    assert_eq!(code, Some(2));
    assert!(e.contains("cannot be used with"), "{e}");
    let (code, _, e) = printed(&["--member-timeout", "50ms"]);
    assert_eq!(code, Some(2));
    assert!(e.contains("100ms"), "{e}");
    let help = stdout(&reflector(&["serve", "--help"]));
    assert!(
        help.contains("--member-timeout <DURATION>") && !help.contains("-ms"),
        "{help}"
    );
    // Options that always counted seconds still read a bare number as seconds.
    let o = reflector(
        &[
            "control",
            "--secret-file",
            &secret,
            "--reflector",
            "127.0.0.1:4000",
            "--anonymous-joins",
        ]
        .iter()
        .chain(&["--token-ttl", "90", "--http-idle-timeout", "1m", "--print-config"])
        .copied()
        .collect::<Vec<_>>(),
    );
    let p = stdout(&o);
    assert_eq!(key_line(&p, "token_ttl"), "token_ttl = 90", "{}", stderr(&o));
    assert_eq!(key_line(&p, "http_idle_timeout"), "http_idle_timeout = \"1m\"");
    let o = reflector(&["bots", "--settle", "20", "--control", "http://127.0.0.1:9"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--settle"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(dir);
}

/// `--log-format json`: every line on stderr is one JSON object, the
/// final error included.
#[test]
fn json_logs_are_one_object_per_line() {
    let (dir, _, secret) = config_dir("json-logs", "");
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let runs: [(Vec<&str>, bool); 2] = [
        (
            vec![
                "serve",
                "--secret-file",
                &secret,
                "--bind",
                "127.0.0.1",
                "--ports",
                &port,
                "--duration",
                "200ms",
            ],
            true,
        ),
        (
            vec![
                "control",
                "--secret-file",
                &secret,
                "--reflector",
                "127.0.0.1:4000",
                "--anonymous-joins",
            ]
            .into_iter()
            .chain(["--listen", "192.0.2.1:8700", "--insecure-http"])
            .collect(),
            false,
        ),
    ];
    for (args, ok) in runs {
        let o = Command::new(env!("CARGO_BIN_EXE_reflector"))
            .args(&args)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .output()
            .unwrap();
        assert_eq!(o.status.success(), ok, "{}", stderr(&o));
        let lines: Vec<serde_json::Value> = stderr(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        assert!(!lines.is_empty(), "{args:?}");
        for l in &lines {
            assert!(l["level"].is_string() && l["fields"]["message"].is_string(), "{l}");
        }
        if !ok {
            let last = &lines[lines.len() - 1];
            assert_eq!(last["level"], "ERROR");
            assert!(
                last["fields"]["message"].as_str().unwrap().contains("192.0.2.1"),
                "{last}"
            );
        }
    }
    let o = reflector(&["serve", "--secret-file", &secret, "--log-format", "xml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("xml"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(dir);
}
