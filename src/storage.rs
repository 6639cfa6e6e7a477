//! Durable storage of routes in RocksDB: the only module that touches it.
//!
//! Keys: `r/<uuid>` holds a route record; `c/<creation time, inverted><uuid>` is an empty index entry
//! that lists routes newest first. Every acknowledged change is one atomic, synced write batch, so
//! a crash either keeps all of it or none. Records are JSON with a schema version, read back
//! through [`StoredRoute`].

use std::path::{Path, PathBuf};

use rocksdb::{DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The schema version written into every record.
pub const SCHEMA_VERSION: u32 = 1;

const ROUTE: u8 = b'r';
const CREATED: u8 = b'c';

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
        }
    }
}

impl std::error::Error for StorageError {}

/// A route as stored: identity, times, and the registration as the client gave it. The record's
/// content beyond these members is owned by the route module; storage only keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredRoute {
    /// Schema version of the record.
    pub v: u32,
    pub uuid: Uuid,
    /// Milliseconds since the Unix epoch.
    pub created_at: u64,
    pub updated_at: u64,
    /// The route's configuration (see `route::RouteConfig`).
    pub config: serde_json::Value,
}

/// The route store.
pub struct Store {
    db: DB,
    dir: PathBuf,
}

/// One page of a listing, newest first.
pub struct Page {
    pub routes: Vec<StoredRoute>,
    /// Where the next page starts, if there is one.
    pub next: Option<String>,
}

impl Store {
    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store, StorageError> {
        if let Err(e) = std::fs::create_dir_all(dir) {
            return Err(StorageError::Open { dir: dir.to_owned(), why: e.to_string() });
        }
        let mut options = Options::default();
        options.create_if_missing(true);
        // Small records, few of them per second: keep the footprint modest.
        options.set_keep_log_file_num(4);
        options.set_max_log_file_size(8 << 20);
        match DB::open(&options, dir) {
            Ok(db) => Ok(Store { db, dir: dir.to_owned() }),
            Err(e) if is_lock_error(&e) => Err(StorageError::Locked { dir: dir.to_owned() }),
            Err(e) => Err(StorageError::Open { dir: dir.to_owned(), why: e.into_string() }),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stores a new route or replaces one, durably (synced) and atomically with its index entry.
    pub fn put(&self, route: &StoredRoute) -> Result<(), StorageError> {
        let value = serde_json::to_vec(route).map_err(|e| StorageError::Io(e.to_string()))?;
        let mut batch = WriteBatch::default();
        batch.put(route_key(route.uuid), value);
        batch.put(created_key(route.created_at, route.uuid), []);
        self.write(batch)
    }

    /// Removes a route and its index entry, durably. Returns whether it existed.
    pub fn delete(&self, uuid: Uuid) -> Result<bool, StorageError> {
        let Some(route) = self.get(uuid)? else { return Ok(false) };
        let mut batch = WriteBatch::default();
        batch.delete(route_key(uuid));
        batch.delete(created_key(route.created_at, uuid));
        self.write(batch)?;
        Ok(true)
    }

    pub fn get(&self, uuid: Uuid) -> Result<Option<StoredRoute>, StorageError> {
        let key = route_key(uuid);
        match self.db.get_pinned(key).map_err(io)? {
            None => Ok(None),
            Some(bytes) => decode(&key, &bytes).map(Some),
        }
    }

    /// Every stored route, oldest first; an unreadable record is returned as an error in place.
    pub fn all(&self) -> impl Iterator<Item = Result<StoredRoute, StorageError>> + '_ {
        self.db
            .iterator(IteratorMode::From(&[ROUTE], Direction::Forward))
            .take_while(|entry| entry.as_ref().map_or(true, |(key, _)| key.first() == Some(&ROUTE)))
            .map(|entry| {
                let (key, value) = entry.map_err(io)?;
                decode(&key, &value)
            })
    }

    /// Up to `limit` routes, newest first, starting after `cursor` (from a previous page).
    pub fn page(&self, limit: usize, cursor: Option<&Cursor>) -> Result<Page, StorageError> {
        let start = match cursor {
            // Just after the cursor's entry.
            Some(Cursor(key)) => [key.as_slice(), &[0]].concat(),
            None => vec![CREATED],
        };
        let mut routes = Vec::new();
        let mut last = None;
        for entry in self.db.iterator(IteratorMode::From(&start, Direction::Forward)) {
            let (key, _) = entry.map_err(io)?;
            if key.first() != Some(&CREATED) {
                break;
            }
            if routes.len() == limit {
                return Ok(Page { routes, next: last.map(|k: Box<[u8]>| encode_cursor(&k)) });
            }
            let Some(uuid) = key.get(9..25).and_then(|b| Uuid::from_slice(b).ok()) else { continue };
            if let Some(route) = self.get(uuid)? {
                routes.push(route);
            }
            last = Some(key);
        }
        Ok(Page { routes, next: None })
    }

    fn write(&self, batch: WriteBatch) -> Result<(), StorageError> {
        let mut options = WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(batch, &options).map_err(io)
    }
}

fn route_key(uuid: Uuid) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[0] = ROUTE;
    key[1..].copy_from_slice(uuid.as_bytes());
    key
}

/// `c`, then the creation time inverted (so that ascending keys are newest first), then the uuid.
fn created_key(created_at: u64, uuid: Uuid) -> [u8; 25] {
    let mut key = [0u8; 25];
    key[0] = CREATED;
    key[1..9].copy_from_slice(&(u64::MAX - created_at).to_be_bytes());
    key[9..].copy_from_slice(uuid.as_bytes());
    key
}

fn encode_cursor(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a listing continues: the index key of the last route of the previous page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor(Vec<u8>);

impl Cursor {
    /// Reads a cursor as [`Page::next`] gives it; `None` for anything else.
    pub fn parse(text: &str) -> Option<Cursor> {
        if text.len() != 50 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let key: Vec<u8> = (0..25)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()
            .ok()?;
        (key[0] == CREATED).then_some(Cursor(key))
    }
}

fn decode(key: &[u8], bytes: &[u8]) -> Result<StoredRoute, StorageError> {
    let corrupt = |why: String| StorageError::Corrupt { key: encode_cursor(key), why };
    let route: StoredRoute = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if route.v != SCHEMA_VERSION {
        return Err(corrupt(format!("schema version {} is not {SCHEMA_VERSION}", route.v)));
    }
    Ok(route)
}

fn io(e: rocksdb::Error) -> StorageError {
    StorageError::Io(e.into_string())
}

/// RocksDB reports a held `LOCK` file as an IO error: "Resource temporarily unavailable" from
/// another process, "lock hold by current process" from this one.
fn is_lock_error(e: &rocksdb::Error) -> bool {
    let text = e.as_ref().to_ascii_lowercase();
    text.contains("lock")
        && ["temporarily unavailable", "no locks available", "hold by current process"]
            .iter()
            .any(|m| text.contains(m))
}
