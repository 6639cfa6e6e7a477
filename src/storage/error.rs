//! Why storage failed.

use std::path::PathBuf;

use uuid::Uuid;

/// Why storage failed.
#[derive(Debug)]
pub enum StorageError {
    /// Another process holds the data directory.
    Locked { dir: PathBuf },
    /// The data directory cannot be opened or created (permissions, not a directory, corrupt).
    Open { dir: PathBuf, why: String },
    /// A read or write failed.
    Io(String),
    /// A stored record cannot be read.
    Corrupt { key: String, why: String },
    /// The secret key cannot be loaded, or is not the one the records were sealed with.
    Key(String),
    /// A record was sealed by a key the ring lacks: the route cannot be read until the key is
    /// given back.
    KeyMissing {
        uuid: Uuid,
        key: crate::secrets::KeyId,
        created_at: u64,
        updated_at: u64,
        revision: Option<u64>,
    },
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::Locked { dir } => write!(
                f,
                "the data directory {} is in use by another recast process (only one may use it)",
                dir.display()
            ),
            StorageError::Open { dir, why } => {
                write!(f, "cannot open the data directory {}: {why}", dir.display())
            }
            StorageError::Io(why) => write!(f, "storage failed: {why}"),
            StorageError::Corrupt { key, why } => write!(f, "stored record {key} is unreadable: {why}"),
            StorageError::Key(why) => f.write_str(why),
            StorageError::KeyMissing { uuid, key, .. } => write!(
                f,
                "route {uuid} was sealed by key {key}, which RECAST_SECRET_KEYS lacks; add that key \
                 to the ring to serve it"
            ),
        }
    }
}

impl std::error::Error for StorageError {}
