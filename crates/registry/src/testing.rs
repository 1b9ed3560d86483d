//! A Redis server of a test's own: Debian's `redis-server` on a free port
//! of 127.0.0.1, with a password (the registry never runs without one), no
//! persistence, in a scratch directory; stopped and removed on drop. Or the
//! same over TLS only ([`RedisServer::start_tls`]): a throwaway CA and a
//! server certificate for 127.0.0.1 made at start, in that directory.

use crate::RegistryTls;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    dir: PathBuf,
    pub port: u16,
    /// The TLS set-up, for a server started with [`RedisServer::start_tls`].
    tls: Option<TlsMode>,
}

/// How a TLS test server treats clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// Any client that verifies the server (`tls-auth-clients no`).
    ServerOnly,
    /// Only clients with a certificate of the test CA (`tls-auth-clients yes`).
    ClientCertificates,
}

/// The password of every test server.
pub const PASSWORD: &str = "fleet-test-password";

impl RedisServer {
    /// Starts one on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        RedisServer::start_on(port)
    }

    /// Starts one on `port` (a restart: same address, no data).
    pub fn start_on(port: u16) -> RedisServer {
        RedisServer::launch(port, None)
    }

    /// Starts one that speaks TLS only (`--port 0 --tls-port`), its
    /// certificate (for 127.0.0.1 and localhost) signed by a CA made for it.
    pub fn start_tls(mode: TlsMode) -> RedisServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        RedisServer::launch(port, Some(mode))
    }

    fn launch(port: u16, tls: Option<TlsMode>) -> RedisServer {
        let dir = std::env::temp_dir().join(format!("registry-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let mut cmd = Command::new("redis-server");
        // 127.0.0.2 too, an address of this host that a TLS server's
        // certificate does not name.
        cmd.args(["--bind", "127.0.0.1", "127.0.0.2", "--requirepass", PASSWORD])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir);
        match tls {
            None => {
                cmd.args(["--port", &port.to_string()]);
            }
            Some(mode) => {
                let ca = TestCa::new("registry test CA");
                ca.write(&dir.join("ca.pem"));
                ca.issue(
                    &["127.0.0.1", "localhost"],
                    &dir.join("server.pem"),
                    &dir.join("server-key.pem"),
                );
                ca.issue(
                    &["registry-client"],
                    &dir.join("client.pem"),
                    &dir.join("client-key.pem"),
                );
                let auth = if mode == TlsMode::ClientCertificates {
                    "yes"
                } else {
                    "no"
                };
                cmd.args(["--port", "0", "--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(dir.join("server.pem"))
                    .arg("--tls-key-file")
                    .arg(dir.join("server-key.pem"))
                    .arg("--tls-ca-cert-file")
                    .arg(dir.join("ca.pem"))
                    .args(["--tls-auth-clients", auth]);
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (Debian package redis-server; make deps installs it)");
        let s = RedisServer {
            child: Some(child),
            dir,
            port,
            tls,
        };
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = s.client().get_connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return s;
                }
            }
            assert!(Instant::now() < until, "redis-server on port {port} did not answer");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://:PASSWORD@127.0.0.1:PORT` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://:{PASSWORD}@127.0.0.1:{}", self.port)
    }

    /// The files a client of this server needs: its CA, and for a server
    /// that requires them a client certificate of that CA.
    pub fn client_tls(&self) -> RegistryTls {
        match self.tls {
            None => RegistryTls::default(),
            Some(mode) => RegistryTls {
                ca_file: Some(self.dir.join("ca.pem")),
                client_cert: (mode == TlsMode::ClientCertificates)
                    .then(|| (self.dir.join("client.pem"), self.dir.join("client-key.pem"))),
            },
        }
    }

    /// The CA file of a TLS server.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.map(|_| self.dir.join("ca.pem"))
    }

    /// A Redis client of this server (with its CA for a TLS one), for tests
    /// that look at the keys directly.
    pub fn client(&self) -> redis::Client {
        let tls = self.client_tls();
        match self.tls {
            None => redis::Client::open(self.url()).expect("a valid URL"),
            Some(_) => crate::tls::client(&self.url(), &tls).expect("the test CA's files"),
        }
    }

    /// Stops it at once (kill), as a crash or a restart would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A throwaway certificate authority (ECDSA P-256), for tests.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().expect("a key pair");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("a self-signed CA");
        TestCa { cert, key }
    }

    /// Writes its certificate (PEM) to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.cert.pem()).expect("the CA file written");
    }

    /// A certificate for `names` (IP addresses or DNS names) signed by this
    /// CA, for servers and clients alike, and its key, written as PEM.
    pub fn issue(&self, names: &[&str], cert_path: &Path, key_path: &Path) {
        let key = rcgen::KeyPair::generate().expect("a key pair");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("certificate parameters");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "registry test");
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("a signed certificate");
        std::fs::write(cert_path, cert.pem()).expect("the certificate written");
        std::fs::write(key_path, key.serialize_pem()).expect("the key written");
    }
}
