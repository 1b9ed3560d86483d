//! The token secret replaced while the server runs: a rollover writes the
//! new secret to the file with the old one as `previous … until …`, and
//! `serve` hands the new ring here (on SIGHUP or when it sees the file
//! change). Each event loop picks it up at its next wake-up; joins are
//! checked with one ring or the other, never a mixture.

use super::Server;
use oskit::watch::FileWatch;
use reflector_proto::auth::SecretRing;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often `serve` looks at the secret file's metadata (SIGHUP: at once).
pub const SECRET_RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct SharedSecret {
    ring: Mutex<SecretRing>,
    /// Bumped after each replacement, so a loop looks at one atomic per
    /// wake-up and takes the lock only when there is something new.
    generation: AtomicU64,
}

impl SharedSecret {
    pub(crate) fn new(ring: SecretRing) -> Arc<SharedSecret> {
        Arc::new(SharedSecret {
            ring: Mutex::new(ring),
            generation: AtomicU64::new(0),
        })
    }

    pub(crate) fn replace(&self, ring: SecretRing) {
        *self.ring.lock().unwrap_or_else(|p| p.into_inner()) = ring;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The ring, if it was replaced since the generation in `seen` (which
    /// is brought up to date).
    pub(crate) fn newer(&self, seen: &mut u64) -> Option<SecretRing> {
        let now = self.generation.load(Ordering::Acquire);
        if now == *seen {
            return None;
        }
        *seen = now;
        Some(self.ring.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// The secret file as `serve` watches it: re-read when it changes, or at
/// once on SIGHUP; a version that does not parse is reported and the secret
/// in force is kept, so a half-written file never locks players out.
pub(crate) struct SecretFile {
    watch: FileWatch,
    hangup: Arc<AtomicBool>,
}

impl SecretFile {
    /// Watches `path` (just read into `ring`); SIGHUP sets `hangup`.
    pub(crate) fn new(path: &Path, ring: &SecretRing, hangup: Arc<AtomicBool>, server: &Server) -> SecretFile {
        publish_previous(ring, server);
        SecretFile {
            watch: FileWatch::new(path, SECRET_RECHECK),
            hangup,
        }
    }

    /// Looks at the file if it is time (or a SIGHUP came) and hands a new
    /// ring to the server's loops.
    pub(crate) fn poll(&mut self, server: &Server) {
        let forced = self.hangup.swap(false, Ordering::Relaxed);
        let counters = &server.registry().secret;
        let path = self.watch.path().display().to_string();
        let ring = match self.watch.poll(forced) {
            None => return,
            Some(Ok(text)) => SecretRing::parse(&text).map_err(|e| e.to_string()),
            Some(Err(e)) => Err(e.to_string()),
        };
        match ring {
            Ok(ring) => {
                match ring.previous {
                    Some((_, until)) => tracing::info!(
                        "token secret reloaded from {path}; tokens signed with the previous one are accepted until {until} (Unix seconds)"
                    ),
                    None => tracing::info!("token secret reloaded from {path}; no previous secret is accepted"),
                }
                publish_previous(&ring, server);
                server.set_token_secret(ring);
                counters.reloads.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!("token secret file {path}: {e}; keeping the secret in force");
                counters.reload_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn publish_previous(ring: &SecretRing, server: &Server) {
    let until = ring.previous.as_ref().map_or(0, |(_, until)| *until);
    server
        .registry()
        .secret
        .previous_until_s
        .store(until, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::auth::{Secret, TokenClaims};

    #[test]
    fn a_replacement_is_seen_once_by_each_reader() {
        let a = Secret::new(&[1; 32]).unwrap();
        let b = Secret::new(&[2; 32]).unwrap();
        let token = TokenClaims {
            player: 7,
            reflector: 0,
            group: 4000,
            expires_unix_s: 100,
        }
        .sign(&b);
        let shared = SharedSecret::new(a.into());
        let (mut one, mut two) = (0, 0);
        assert!(shared.newer(&mut one).is_none());
        shared.replace(b.into());
        let got = shared.newer(&mut one).expect("the new ring");
        assert!(
            got.verify_token(&token, 0, 4000, 7, 1_000).is_ok(),
            "it is the new secret"
        );
        assert!(shared.newer(&mut one).is_none(), "seen once");
        assert!(shared.newer(&mut two).is_some(), "another loop sees it too");
    }
}
