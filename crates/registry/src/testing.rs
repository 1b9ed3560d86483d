//! A Redis server of a test's own: Debian's `redis-server` on a free port
//! of 127.0.0.1, with a password (the registry never runs without one), no
//! persistence, in a scratch directory; stopped and removed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    dir: std::path::PathBuf,
    pub port: u16,
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
        let dir = std::env::temp_dir().join(format!("registry-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--requirepass",
                PASSWORD,
            ])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (Debian package redis-server; make deps installs it)");
        let s = RedisServer {
            child: Some(child),
            dir,
            port,
        };
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = redis::Client::open(s.url()).and_then(|c| c.get_connection()) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return s;
                }
            }
            assert!(Instant::now() < until, "redis-server on port {port} did not answer");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://:PASSWORD@127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://:{PASSWORD}@127.0.0.1:{}", self.port)
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
