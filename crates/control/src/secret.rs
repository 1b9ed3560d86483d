//! The secret the control server signs tokens with, replaced while it
//! serves: `control` re-reads the secret file when it changes or on
//! SIGHUP. During a rollover the reflectors take the new file (new secret,
//! old one as `previous … until …`) first, so they accept both; then the
//! control servers take it and sign with the new one.

use oskit::watch::FileWatch;
use reflector_proto::auth::{Secret, SecretRing};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How often `control` looks at the secret file's metadata (SIGHUP: at once).
pub const SECRET_RECHECK: Duration = Duration::from_secs(1);

/// The signing secret, shared by the request handlers and the reloader.
#[derive(Clone, Debug)]
pub struct SecretCell {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The whole file: its current secret signs, and the fleet's registry
    /// entries are checked against both while the previous is accepted.
    secret: RwLock<SecretRing>,
    reloads: AtomicU64,
    reload_errors: AtomicU64,
}

impl From<Secret> for SecretCell {
    fn from(secret: Secret) -> SecretCell {
        SecretCell {
            inner: Arc::new(Inner {
                secret: RwLock::new(secret.into()),
                reloads: AtomicU64::new(0),
                reload_errors: AtomicU64::new(0),
            }),
        }
    }
}

impl SecretCell {
    /// The secret in force (a copy: a request signs with one secret
    /// throughout, whatever a reload does meanwhile).
    pub fn get(&self) -> Secret {
        self.inner
            .secret
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .current
            .clone()
    }

    /// The whole secret file as last read.
    pub fn ring(&self) -> SecretRing {
        self.inner.secret.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, secret: Secret) {
        self.set_ring(secret.into());
    }

    pub fn set_ring(&self, ring: SecretRing) {
        *self.inner.secret.write().unwrap_or_else(|p| p.into_inner()) = ring;
    }

    /// Reloads taken, and new versions of the file refused.
    pub fn reloads(&self) -> (u64, u64) {
        (self.inner.reloads.load(Relaxed), self.inner.reload_errors.load(Relaxed))
    }
}

/// The secret file as `control` watches it: a version that does not parse
/// is reported and the secret in force kept.
pub(crate) struct SecretFile {
    watch: FileWatch,
    hangup: Arc<AtomicBool>,
    cell: SecretCell,
}

impl SecretFile {
    pub(crate) fn new(path: &Path, cell: SecretCell, hangup: Arc<AtomicBool>) -> SecretFile {
        SecretFile {
            watch: FileWatch::new(path, SECRET_RECHECK),
            hangup,
            cell,
        }
    }

    pub(crate) fn poll(&mut self) {
        let forced = self.hangup.swap(false, Relaxed);
        let path = self.watch.path().display().to_string();
        let ring = match self.watch.poll(forced) {
            None => return,
            Some(Ok(text)) => SecretRing::parse(&text).map_err(|e| e.to_string()),
            Some(Err(e)) => Err(e.to_string()),
        };
        match ring {
            Ok(ring) => {
                self.cell.set_ring(ring);
                self.cell.inner.reloads.fetch_add(1, Relaxed);
                tracing::info!("token secret reloaded from {path}: new tokens are signed with it");
            }
            Err(e) => {
                self.cell.inner.reload_errors.fetch_add(1, Relaxed);
                tracing::warn!("token secret file {path}: {e}; keeping the secret in force");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_replaces_the_secret_and_a_broken_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("control-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "aa".repeat(32)).unwrap();
        let cell = SecretCell::from(Secret::new(&[0xaa; 32]).unwrap());
        let hup = Arc::new(AtomicBool::new(false));
        let mut file = SecretFile::new(&path, cell.clone(), Arc::clone(&hup));
        let token = |s: &Secret| {
            reflector_proto::auth::TokenClaims {
                player: 1,
                reflector: 0,
                group: 4000,
                expires_unix_s: 100,
            }
            .sign(s)
        };
        let signed_with =
            |s: &Secret, with: &Secret| reflector_proto::auth::verify_token(with, &token(s), 0, 4000, 1, 1_000).is_ok();
        let (old, new) = (Secret::new(&[0xaa; 32]).unwrap(), Secret::new(&[0xbb; 32]).unwrap());
        std::fs::write(
            &path,
            format!("{}\nprevious {} until 200\n", "bb".repeat(32), "aa".repeat(32)),
        )
        .unwrap();
        hup.store(true, Relaxed);
        file.poll();
        assert!(
            signed_with(&cell.get(), &new) && !signed_with(&cell.get(), &old),
            "signs with the new current"
        );
        assert_eq!(cell.reloads(), (1, 0));
        std::fs::write(&path, "short\n").unwrap();
        hup.store(true, Relaxed);
        file.poll();
        assert!(
            signed_with(&cell.get(), &new),
            "a broken file keeps the secret in force"
        );
        assert_eq!(cell.reloads(), (1, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
