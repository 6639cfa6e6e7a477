//! Secrets: the keys that seal stored route configurations (AES-256-GCM), where they come from,
//! and a string type for secret settings that never prints its value.
//!
//! The keys are a ring: `RECAST_SECRET_KEYS` (a comma list of keys of 64 hex digits, the first
//! sealing and all opening), or `RECAST_SECRET_KEY` (one key), or else the file `secret.key` in
//! the data directory, created on first start with permissions 0600 and refused when others can
//! read it; either of the last two is a ring of one. A key is known by its id, the first 8 hex
//! digits of its SHA-256, which sealed records carry so that the key that opens them is found
//! without trying each. A sealed value is `nonce (12 bytes) || ciphertext || tag (16 bytes)`;
//! the associated data binds it to where it is stored, so a sealed value moved elsewhere does
//! not open.

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
            KeyOrigin::Setting => f.write_str("RECAST_SECRET_KEYS (or RECAST_SECRET_KEY)"),
            KeyOrigin::File(path) => write!(f, "the key file {}", path.display()),
            KeyOrigin::NewFile(path) => write!(f, "the new key file {}", path.display()),
        }
    }
}

/// A key's id: the first 4 bytes of its SHA-256, written as 8 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId([u8; 4]);

impl KeyId {
    fn of(key: &[u8; KEY_LEN]) -> KeyId {
        let digest = ring::digest::digest(&ring::digest::SHA256, key);
        let mut id = [0u8; 4];
        id.copy_from_slice(&digest.as_ref()[..4]);
        KeyId(id)
    }

    /// Reads an id as [`KeyId`]'s `Display` writes it (8 hex digits, either case).
    pub fn parse(text: &str) -> Option<KeyId> {
        let bytes = hex::decode(text)?;
        bytes.try_into().ok().map(KeyId)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl serde::Serialize for KeyId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The keys that seal and open stored routes: the first seals, every one opens.
pub struct Keyring {
    keys: Vec<(KeyId, LessSafeKey)>,
    pub origin: KeyOrigin,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Keyring({} from {})",
            self.ids().map(|id| id.to_string()).collect::<Vec<_>>().join(","),
            self.origin
        )
    }
}

/// A sealed value did not open: another key, or altered bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreadable;

/// Why a sealed value did not open with a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotOpened {
    /// It names a key the ring lacks.
    KeyMissing(KeyId),
    /// No key of the ring opens it (another key, or altered bytes).
    Unreadable,
}

impl Keyring {
    /// The ring from `setting` (a comma list of keys), or else from the key file in `dir`, which
    /// is created when missing if `may_create` (a store that already holds sealed values needs
    /// its own key back).
    pub fn load(setting: Option<&Secret>, dir: &Path, may_create: bool) -> Result<Keyring, String> {
        if let Some(setting) = setting {
            let mut keys = Vec::new();
            for (i, text) in setting.expose().split(',').enumerate() {
                let bytes = parse_hex(text.trim()).ok_or_else(|| {
                    format!(
                        "key {} of RECAST_SECRET_KEYS (or RECAST_SECRET_KEY) is not 64 hex digits (32 bytes); \
                         each key must be, and `recast new-key` prints one",
                        i + 1
                    )
                })?;
                keys.push(bytes);
            }
            return Keyring::from_keys(&keys, KeyOrigin::Setting);
        }
        let path = dir.join(KEY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                check_permissions(&path)?;
                let bytes = parse_hex(text.trim()).ok_or_else(|| {
                    format!("the key file {} does not hold 64 hex digits; it is damaged", path.display())
                })?;
                Keyring::from_keys(&[bytes], KeyOrigin::File(path))
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
                Keyring::from_keys(&[bytes], KeyOrigin::NewFile(path))
            }
            Err(e) => Err(format!("cannot read the key file {}: {e}", path.display())),
        }
    }

    fn from_keys(keys: &[[u8; KEY_LEN]], origin: KeyOrigin) -> Result<Keyring, String> {
        let mut ring: Vec<(KeyId, LessSafeKey)> = Vec::with_capacity(keys.len());
        for bytes in keys {
            let id = KeyId::of(bytes);
            if ring.iter().any(|(seen, _)| *seen == id) {
                return Err(format!("key {id} is listed twice in RECAST_SECRET_KEYS"));
            }
            // AES-256 takes exactly 32 bytes, which `bytes` is.
            let unbound = UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256 key");
            ring.push((id, LessSafeKey::new(unbound)));
        }
        if ring.is_empty() {
            return Err("RECAST_SECRET_KEYS lists no key".to_owned());
        }
        Ok(Keyring { keys: ring, origin })
    }

    /// The id of the key that seals.
    pub fn sealing(&self) -> KeyId {
        self.keys[0].0
    }

    /// The ids of the ring's keys, the sealing one first.
    pub fn ids(&self) -> impl Iterator<Item = KeyId> + '_ {
        self.keys.iter().map(|(id, _)| *id)
    }

    /// Encrypts `plain` with the sealing key, bound to `context` (which opening must repeat).
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
        self.keys[0]
            .1
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(context), &mut body)
            .expect("a route record is far below AES-GCM's size limit");
        sealed.extend_from_slice(&body);
        sealed
    }

    /// Decrypts what [`Keyring::seal`] made with `context`: with the key `id` when the value
    /// names it, else with whichever key of the ring opens it. Answers the key that did.
    pub fn open_with(
        &self,
        sealed: &[u8],
        context: &[u8],
        id: Option<KeyId>,
    ) -> Result<(Vec<u8>, KeyId), NotOpened> {
        match id {
            Some(id) => {
                let (_, key) =
                    self.keys.iter().find(|(held, _)| *held == id).ok_or(NotOpened::KeyMissing(id))?;
                open_one(key, sealed, context).map(|plain| (plain, id)).map_err(|_| NotOpened::Unreadable)
            }
            None => self
                .keys
                .iter()
                .find_map(|(id, key)| open_one(key, sealed, context).ok().map(|plain| (plain, *id)))
                .ok_or(NotOpened::Unreadable),
        }
    }

    /// Decrypts what [`Keyring::seal`] made with `context`, with whichever key opens it.
    pub fn open(&self, sealed: &[u8], context: &[u8]) -> Result<Vec<u8>, Unreadable> {
        self.open_with(sealed, context, None).map(|(plain, _)| plain).map_err(|_| Unreadable)
    }
}

fn open_one(key: &LessSafeKey, sealed: &[u8], context: &[u8]) -> Result<Vec<u8>, Unreadable> {
    if sealed.len() < NONCE_LEN + AES_256_GCM.tag_len() {
        return Err(Unreadable);
    }
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unreadable)?;
    let mut body = body.to_vec();
    let plain = key.open_in_place(nonce, Aad::from(context), &mut body).map_err(|_| Unreadable)?;
    Ok(plain.to_vec())
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
    fn a_ring_seals_with_its_first_key_and_opens_with_any() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (new_key_hex().unwrap(), new_key_hex().unwrap());
        let ring =
            |keys: &[&str]| Keyring::load(Some(&Secret::new(keys.join(","))), dir.path(), true).unwrap();
        let before = ring(&[&old]);
        let sealed_before = before.seal(b"token", b"r/1");
        // The new key first, the old one kept: what the old one sealed still opens, by id or not.
        let rotating = ring(&[&new, &old]);
        assert_eq!(rotating.sealing(), ring(&[&new]).sealing());
        assert_eq!(rotating.ids().collect::<Vec<_>>(), vec![ring(&[&new]).sealing(), before.sealing()]);
        assert_eq!(
            rotating.open_with(&sealed_before, b"r/1", Some(before.sealing())).unwrap(),
            (b"token".to_vec(), before.sealing())
        );
        assert_eq!(rotating.open_with(&sealed_before, b"r/1", None).unwrap().1, before.sealing());
        let sealed_now = rotating.seal(b"token", b"r/1");
        assert_eq!(before.open(&sealed_now, b"r/1"), Err(Unreadable), "sealed with the new key");
        // Without the old key: its records name a key the ring lacks.
        let after = ring(&[&new]);
        assert_eq!(
            after.open_with(&sealed_before, b"r/1", Some(before.sealing())),
            Err(NotOpened::KeyMissing(before.sealing()))
        );
        assert_eq!(after.open_with(&sealed_before, b"r/1", None), Err(NotOpened::Unreadable));
        assert_eq!(after.open(&sealed_now, b"r/1").unwrap(), b"token");
        // A wrong id for a key the ring holds: it does not open.
        assert_eq!(
            rotating.open_with(&sealed_before, b"r/1", Some(after.sealing())),
            Err(NotOpened::Unreadable)
        );
    }

    #[test]
    fn key_ids_are_the_first_8_hex_digits_of_the_keys_sha256_and_a_ring_lists_each_once() {
        let dir = tempfile::tempdir().unwrap();
        // SHA-256 of 32 zero bytes begins 66687aad.
        let zero = "0".repeat(64);
        let ring = Keyring::load(Some(&Secret::new(&zero)), dir.path(), true).unwrap();
        assert_eq!(ring.sealing().to_string(), "66687aad");
        assert_eq!(KeyId::parse("66687AAD"), Some(ring.sealing()));
        assert_eq!(KeyId::parse("66687aa"), None);
        let twice =
            Keyring::load(Some(&Secret::new(format!("{zero}, {zero}"))), dir.path(), true).unwrap_err();
        assert!(twice.contains("66687aad") && twice.contains("twice"), "{twice}");
        let second_bad =
            Keyring::load(Some(&Secret::new(format!("{zero},xyz"))), dir.path(), true).unwrap_err();
        assert!(second_bad.contains("key 2"), "{second_bad}");
        // Spaces around the commas are allowed.
        let other = new_key_hex().unwrap();
        assert_eq!(
            Keyring::load(Some(&Secret::new(format!(" {other} , {zero} "))), dir.path(), true)
                .unwrap()
                .ids()
                .count(),
            2
        );
    }

    #[test]
    fn sealed_values_open_only_with_the_same_key_and_context() {
        let dir = tempfile::tempdir().unwrap();
        let key = Keyring::load(None, dir.path(), true).unwrap();
        let sealed = key.seal(b"token-123", b"r/1");
        assert!(!sealed.windows(9).any(|w| w == b"token-123"));
        assert_eq!(key.open(&sealed, b"r/1").unwrap(), b"token-123");
        assert_eq!(key.open(&sealed, b"r/2"), Err(Unreadable), "bound to its context");
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(key.open(&altered, b"r/1"), Err(Unreadable));
        assert_eq!(key.open(&sealed[..20], b"r/1"), Err(Unreadable));
        assert_ne!(key.seal(b"token-123", b"r/1"), sealed, "a fresh nonce each time");
        let other = Keyring::load(Some(&Secret::new(new_key_hex().unwrap())), dir.path(), true).unwrap();
        assert_eq!(other.open(&sealed, b"r/1"), Err(Unreadable));
    }

    #[test]
    fn the_key_file_is_created_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let first = Keyring::load(None, dir.path(), true).unwrap();
        let path = dir.path().join(KEY_FILE);
        assert_eq!(first.origin, KeyOrigin::NewFile(path.clone()));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let second = Keyring::load(None, dir.path(), true).unwrap();
        assert_eq!(second.origin, KeyOrigin::File(path.clone()));
        assert_eq!(second.open(&first.seal(b"x", b"c"), b"c").unwrap(), b"x");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = Keyring::load(None, dir.path(), true).unwrap_err();
        assert!(refused.contains("chmod 600"), "{refused}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not hex\n").unwrap();
        assert!(Keyring::load(None, dir.path(), true).unwrap_err().contains("damaged"));
        std::fs::remove_file(&path).unwrap();
        assert!(Keyring::load(None, dir.path(), false).unwrap_err().contains("restore the key file"));
        assert!(!path.exists(), "not created when the store needs its old key");
    }

    #[test]
    fn a_key_setting_must_be_64_hex_digits_and_never_prints() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "abc", &"g".repeat(64), &"a".repeat(63), &"é".repeat(32)] {
            let error = Keyring::load(Some(&Secret::new(bad)), dir.path(), true).unwrap_err();
            assert!(error.contains("64 hex digits"), "{error}");
            assert!(!error.contains(bad) || bad.is_empty(), "the key is not repeated: {error}");
        }
        let key = new_key_hex().unwrap();
        assert_eq!(key.len(), 64);
        assert!(Keyring::load(Some(&Secret::new(&key)), dir.path(), true).is_ok());
        assert!(!dir.path().join(KEY_FILE).exists(), "no key file when the setting gives the key");
        assert_eq!(format!("{:?} {}", Secret::new(&key), Secret::new(&key)), "*** ***");
    }
}
