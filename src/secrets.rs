//! Secrets: the key that seals stored route configurations (AES-256-GCM), where it comes from, and
//! a string type for secret settings that never prints its value.
//!
//! The key is `RECAST_SECRET_KEY` (64 hex digits) when set; otherwise the file `secret.key` in the
//! data directory, created on first start with permissions 0600 and refused when others can read
//! it. A sealed value is `nonce (12 bytes) || ciphertext || tag (16 bytes)`; the associated data
//! binds it to where it is stored, so a sealed value moved to another key does not open.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use crate::hex;

/// The key file's name in the data directory.
pub const KEY_FILE: &str = "secret.key";
const KEY_LEN: usize = 32;

/// A secret setting (a key, a token): its `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself; only where it is used, never for printing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for Secret {
    type Err = String;

    fn from_str(text: &str) -> Result<Secret, String> {
        Ok(Secret(text.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where the key came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOrigin {
    Setting,
    File(PathBuf),
    NewFile(PathBuf),
}

impl fmt::Display for KeyOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyOrigin::Setting => f.write_str("RECAST_SECRET_KEY"),
            KeyOrigin::File(path) => write!(f, "the key file {}", path.display()),
            KeyOrigin::NewFile(path) => write!(f, "the new key file {}", path.display()),
        }
    }
}

/// The sealing key.
pub struct SecretKey {
    key: LessSafeKey,
    pub origin: KeyOrigin,
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey(from {})", self.origin)
    }
}

/// A sealed value did not open: another key, or altered bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreadable;

impl SecretKey {
    /// The key from `setting`, or else from the key file in `dir`, which is created when missing
    /// if `may_create` (a store that already holds sealed values needs its own key back).
    pub fn load(setting: Option<&Secret>, dir: &Path, may_create: bool) -> Result<SecretKey, String> {
        if let Some(setting) = setting {
            let bytes = parse_hex(setting.expose().trim())
                .ok_or("RECAST_SECRET_KEY must be 64 hex digits (32 bytes); `recast new-key` prints one")?;
            return Ok(SecretKey::from_bytes(&bytes, KeyOrigin::Setting));
        }
        let path = dir.join(KEY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                check_permissions(&path)?;
                let bytes = parse_hex(text.trim()).ok_or_else(|| {
                    format!("the key file {} does not hold 64 hex digits; it is damaged", path.display())
                })?;
                Ok(SecretKey::from_bytes(&bytes, KeyOrigin::File(path)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !may_create => Err(format!(
                "the stored routes in {} were sealed with a key that is not here: set RECAST_SECRET_KEY \
                 or restore the key file {}",
                dir.display(),
                path.display()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let bytes = new_key_bytes()?;
                write_key_file(&path, &bytes)
                    .map_err(|e| format!("cannot create the key file {}: {e}", path.display()))?;
                Ok(SecretKey::from_bytes(&bytes, KeyOrigin::NewFile(path)))
            }
            Err(e) => Err(format!("cannot read the key file {}: {e}", path.display())),
        }
    }

    fn from_bytes(bytes: &[u8; KEY_LEN], origin: KeyOrigin) -> SecretKey {
        // AES-256 takes exactly 32 bytes, which `bytes` is.
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256 key");
        SecretKey { key: LessSafeKey::new(unbound), origin }
    }

    /// Encrypts `plain`, bound to `context` (which opening must repeat).
    pub fn seal(&self, plain: &[u8], context: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        // The system's random source does not fail on Linux once booted; if it ever did, a nonce
        // from the clock and a counter keeps nonces unique within this process.
        if SystemRandom::new().fill(&mut nonce).is_err() {
            nonce = fallback_nonce();
        }
        let mut sealed = Vec::with_capacity(NONCE_LEN + plain.len() + AES_256_GCM.tag_len());
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(plain);
        let mut body = sealed.split_off(NONCE_LEN);
        // Sealing fails only for inputs beyond 64 GiB.
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(context), &mut body)
            .expect("a route record is far below AES-GCM's size limit");
        sealed.extend_from_slice(&body);
        sealed
    }

    /// Decrypts what [`SecretKey::seal`] made with the same key and `context`.
    pub fn open(&self, sealed: &[u8], context: &[u8]) -> Result<Vec<u8>, Unreadable> {
        if sealed.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return Err(Unreadable);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unreadable)?;
        let mut body = body.to_vec();
        let plain = self.key.open_in_place(nonce, Aad::from(context), &mut body).map_err(|_| Unreadable)?;
        Ok(plain.to_vec())
    }
}

/// A new random key as 64 hex digits (`recast new-key`).
pub fn new_key_hex() -> Result<String, String> {
    Ok(hex::encode(&new_key_bytes()?))
}

fn new_key_bytes() -> Result<[u8; KEY_LEN], String> {
    let mut bytes = [0u8; KEY_LEN];
    SystemRandom::new().fill(&mut bytes).map_err(|_| "the system's random source failed".to_owned())?;
    Ok(bytes)
}

fn fallback_nonce() -> [u8; NONCE_LEN] {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut nonce = [0u8; NONCE_LEN];
    nonce[..8].copy_from_slice(&(now.as_nanos() as u64).to_be_bytes());
    nonce[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    nonce
}

/// Writes the key to a temporary file (0600), then renames it into place: a crash leaves either
/// no key file or a whole one, never an empty one.
fn write_key_file(path: &Path, bytes: &[u8; KEY_LEN]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let temporary = path.with_extension("key.new");
    // Left by a start that died before the rename; nothing was sealed with it.
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temporary)?;
    file.write_all(format!("{}\n", hex::encode(bytes)).as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    // The directory entry must be durable too, or a crash could lose the key but keep records
    // sealed with it.
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn check_permissions(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the key file {}: {e}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "the key file {} can be read by others (mode {:o}); make it private: chmod 600 {}",
            path.display(),
            mode & 0o777,
            path.display()
        ));
    }
    Ok(())
}

fn parse_hex(text: &str) -> Option<[u8; KEY_LEN]> {
    hex::decode(text)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_the_same_key_and_context() {
        let dir = tempfile::tempdir().unwrap();
        let key = SecretKey::load(None, dir.path(), true).unwrap();
        let sealed = key.seal(b"token-123", b"r/1");
        assert!(!sealed.windows(9).any(|w| w == b"token-123"));
        assert_eq!(key.open(&sealed, b"r/1").unwrap(), b"token-123");
        assert_eq!(key.open(&sealed, b"r/2"), Err(Unreadable), "bound to its context");
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(key.open(&altered, b"r/1"), Err(Unreadable));
        assert_eq!(key.open(&sealed[..20], b"r/1"), Err(Unreadable));
        assert_ne!(key.seal(b"token-123", b"r/1"), sealed, "a fresh nonce each time");
        let other = SecretKey::load(Some(&Secret::new(new_key_hex().unwrap())), dir.path(), true).unwrap();
        assert_eq!(other.open(&sealed, b"r/1"), Err(Unreadable));
    }

    #[test]
    fn the_key_file_is_created_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let first = SecretKey::load(None, dir.path(), true).unwrap();
        let path = dir.path().join(KEY_FILE);
        assert_eq!(first.origin, KeyOrigin::NewFile(path.clone()));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let second = SecretKey::load(None, dir.path(), true).unwrap();
        assert_eq!(second.origin, KeyOrigin::File(path.clone()));
        assert_eq!(second.open(&first.seal(b"x", b"c"), b"c").unwrap(), b"x");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = SecretKey::load(None, dir.path(), true).unwrap_err();
        assert!(refused.contains("chmod 600"), "{refused}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not hex\n").unwrap();
        assert!(SecretKey::load(None, dir.path(), true).unwrap_err().contains("damaged"));
        std::fs::remove_file(&path).unwrap();
        assert!(SecretKey::load(None, dir.path(), false).unwrap_err().contains("restore the key file"));
        assert!(!path.exists(), "not created when the store needs its old key");
    }

    #[test]
    fn a_key_setting_must_be_64_hex_digits_and_never_prints() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "abc", &"g".repeat(64), &"a".repeat(63), &"é".repeat(32)] {
            let error = SecretKey::load(Some(&Secret::new(bad)), dir.path(), true).unwrap_err();
            assert!(error.contains("64 hex digits"), "{error}");
        }
        let key = new_key_hex().unwrap();
        assert_eq!(key.len(), 64);
        assert!(SecretKey::load(Some(&Secret::new(&key)), dir.path(), true).is_ok());
        assert!(!dir.path().join(KEY_FILE).exists(), "no key file when the setting gives the key");
        assert_eq!(format!("{:?} {}", Secret::new(&key), Secret::new(&key)), "*** ***");
    }
}
