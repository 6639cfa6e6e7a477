//! Durable storage of routes in RocksDB: the only module that touches it.
//!
//! Keys: `r/<uuid>` holds a route record; `c/<creation time, inverted><uuid>` is an empty index entry
//! that lists routes newest first; `k` holds a value sealed with the secret key, to tell at start
//! whether the key is the one the records were sealed with. Every acknowledged change is one
//! atomic, synced write batch, so a crash either keeps all of it or none.
//!
//! Records are JSON with a schema version. A route's configuration, which holds its upstream
//! credentials, is stored sealed (AES-256-GCM, bound to the record's key); only identity and times
//! are readable without the key. Version 1 records (configuration in the clear) are sealed at
//! start, and the store is compacted so the clear copies leave the files.

use std::path::{Path, PathBuf};

use rocksdb::{DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::hex;
use crate::secrets::{Secret, SecretKey};

/// The schema version written into every record.
pub const SCHEMA_VERSION: u32 = 2;
/// Configuration in the clear; read only to be sealed.
const SCHEMA_V1: u32 = 1;

const ROUTE: u8 = b'r';
const CREATED: u8 = b'c';
const KEY_CHECK: &[u8] = b"k";
const KEY_CHECK_TEXT: &[u8] = b"recast key check";
/// Present while clear copies of version 1 records may remain in the files: the store is
/// compacted at start until it is gone.
const COMPACT_PENDING: &[u8] = b"m";
/// In a cluster node's snapshot: the database epoch and revision its records come from.
const POSITION: &[u8] = b"p";
/// In a new cluster node's store while its first full load is written and before its position
/// is: records without a position are then that load's, not a standalone node's.
const LOADING: &[u8] = b"l";

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
        }
    }
}

impl std::error::Error for StorageError {}

/// A route as stored: identity, times, and the registration as the client gave it. The record's
/// content beyond these members is owned by the route module; storage only keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRoute {
    /// Schema version of the record.
    pub v: u32,
    pub uuid: Uuid,
    /// Milliseconds since the Unix epoch.
    pub created_at: u64,
    pub updated_at: u64,
    /// The route's configuration (see `route::RouteConfig`) as JSON text. Storage keeps it and
    /// does not read it: the route module reads it once, straight into its own type.
    pub config: String,
}

/// A key and its value, as RocksDB's iterator gives them.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// A route record as stored, not yet decoded (see [`Store::records`]).
pub struct RawRecord(KeyValue);

/// A record as it is on disk.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    v: u32,
    uuid: Uuid,
    created_at: u64,
    updated_at: u64,
    /// Version 1: the configuration in the clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<serde_json::Value>,
    /// Version 2: the configuration's JSON text, sealed, in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sealed: Option<String>,
    /// In cluster mode: the revision of the database change this record comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revision: Option<u64>,
}

/// The route store.
pub struct Store {
    db: DB,
    dir: PathBuf,
    key: SecretKey,
    /// Version 1 records sealed when the store was opened.
    pub migrated: usize,
}

impl Drop for Store {
    /// A clean close writes the memtables to table files, so the next start reads them instead of
    /// replaying the write-ahead log. (Every acknowledged write is already synced in the log; a
    /// crash only makes the next start replay it.)
    fn drop(&mut self) {
        if let Err(e) = self.db.flush() {
            tracing::warn!(error = %e, "the store could not be flushed on close; the next start replays its log");
        }
    }
}

/// One page of a listing, newest first.
pub struct Page {
    pub stored: Vec<StoredRoute>,
    /// Where the next page starts, if there is one.
    pub next: Option<String>,
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, with the secret key from `secret` or the key
    /// file in `dir`. Fails when the key is not the one the records were sealed with.
    pub fn open(dir: &Path, secret: Option<&Secret>) -> Result<Store, StorageError> {
        Store::open_with(dir, secret, false)
    }

    /// [`Store::open`], with RocksDB's background compactions held until
    /// [`Store::resume_compactions`]: a service starting on a store with table files to merge
    /// loads its routes first, instead of sharing the cores with the merge while it loads. While
    /// they are held, table files only pile up (RocksDB does not slow writes down for them), so
    /// whoever opens the store this way resumes them before writing much.
    pub fn open_holding_compactions(dir: &Path, secret: Option<&Secret>) -> Result<Store, StorageError> {
        Store::open_with(dir, secret, true)
    }

    fn open_with(dir: &Path, secret: Option<&Secret>, hold_compactions: bool) -> Result<Store, StorageError> {
        if let Err(e) = std::fs::create_dir_all(dir) {
            return Err(StorageError::Open { dir: dir.to_owned(), why: e.to_string() });
        }
        let mut options = Options::default();
        options.create_if_missing(true);
        // Small records, few of them per second: keep the footprint modest.
        options.set_keep_log_file_num(4);
        options.set_max_log_file_size(8 << 20);
        options.set_disable_auto_compactions(hold_compactions);
        let db = match DB::open(&options, dir) {
            Ok(db) => db,
            Err(e) if is_lock_error(&e) => return Err(StorageError::Locked { dir: dir.to_owned() }),
            Err(e) => return Err(StorageError::Open { dir: dir.to_owned(), why: e.into_string() }),
        };
        // Loaded while the database's lock is held, so two processes cannot both create a key.
        let sealed_before = db.get(KEY_CHECK).map_err(io)?.is_some();
        let key = SecretKey::load(secret, dir, !sealed_before).map_err(StorageError::Key)?;
        let mut store = Store { db, dir: dir.to_owned(), key, migrated: 0 };
        if store.check_key()? {
            store.migrated = store.seal_v1_records()?;
        }
        store.compact_if_pending()?;
        Ok(store)
    }

    /// Lets RocksDB merge table files in the background again, after
    /// [`Store::open_holding_compactions`]; RocksDB schedules any merge that is due at once.
    pub fn resume_compactions(&self) -> Result<(), StorageError> {
        self.db.set_options(&[("disable_auto_compactions", "false")]).map_err(io)
    }

    /// Fails closed when the key does not open the key-check value. `Ok(true)` for a store that
    /// has no key check yet: a new one, or one from before records were sealed.
    fn check_key(&self) -> Result<bool, StorageError> {
        match self.db.get(KEY_CHECK).map_err(io)? {
            Some(sealed) => match self.key.open(&sealed, KEY_CHECK) {
                Ok(text) if text == KEY_CHECK_TEXT => Ok(false),
                _ => Err(StorageError::Key(format!(
                    "the secret key ({}) is not the one the stored routes in {} were sealed with; \
                     start with the right RECAST_SECRET_KEY or key file (nothing was changed)",
                    self.key.origin,
                    self.dir.display()
                ))),
            },
            // A new store, or one from before records were sealed (version 1 records only). Sealed
            // records without a key check mean the check was removed: refuse rather than guess.
            None if self.only_v1_records() => Ok(true),
            None => Err(StorageError::Key(format!(
                "{} holds sealed routes but no key check; it was altered (nothing was changed)",
                self.dir.display()
            ))),
        }
    }

    /// Whether every route record is version 1 (written before records were sealed); true when
    /// there are none.
    fn only_v1_records(&self) -> bool {
        self.all_records().all(|entry| {
            entry
                .ok()
                .and_then(|(_, value)| serde_json::from_slice::<Record>(&value).ok())
                .is_some_and(|r| r.v == SCHEMA_V1)
        })
    }

    /// Seals every version 1 record, and writes the key check and the compaction marker, in one
    /// synced batch. Returns how many records were sealed.
    fn seal_v1_records(&self) -> Result<usize, StorageError> {
        let mut batch = WriteBatch::default();
        batch.put(KEY_CHECK, self.key.seal(KEY_CHECK_TEXT, KEY_CHECK));
        // Even with no version 1 record left, routes deleted before sealing may linger in the files.
        batch.put(COMPACT_PENDING, []);
        let mut sealed = 0;
        for entry in self.all_records() {
            let (key, value) = entry.map_err(io)?;
            let Ok(record) = serde_json::from_slice::<Record>(&value) else { continue };
            if record.v != SCHEMA_V1 {
                continue;
            }
            let Some(config) = record.config else { continue };
            let config = config.to_string();
            let route = StoredRoute {
                v: SCHEMA_VERSION,
                uuid: record.uuid,
                created_at: record.created_at,
                updated_at: record.updated_at,
                config,
            };
            batch.put(&key, self.encode(&key, &route)?);
            sealed += 1;
        }
        self.write(batch)?;
        Ok(sealed)
    }

    /// Compacts the whole store while the marker is present, so that clear copies of version 1
    /// records leave its files; then removes the marker. A crash in between repeats it at the
    /// next start.
    fn compact_if_pending(&self) -> Result<(), StorageError> {
        if self.db.get(COMPACT_PENDING).map_err(io)?.is_none() {
            return Ok(());
        }
        self.db.flush().map_err(io)?;
        self.db.compact_range::<&[u8], &[u8]>(None, None);
        let mut batch = WriteBatch::default();
        batch.delete(COMPACT_PENDING);
        self.write(batch)?;
        self.db.flush().map_err(io)?;
        self.db.flush_wal(true).map_err(io)
    }

    fn all_records(&self) -> impl Iterator<Item = Result<KeyValue, rocksdb::Error>> + '_ {
        self.db
            .iterator(IteratorMode::From(&[ROUTE], Direction::Forward))
            .take_while(|entry| entry.as_ref().map_or(true, |(key, _)| key.first() == Some(&ROUTE)))
    }

    fn encode(&self, key: &[u8], route: &StoredRoute) -> Result<Vec<u8>, StorageError> {
        Ok(seal(&self.key, key, route, None))
    }

    fn decode(&self, key: &[u8], bytes: &[u8]) -> Result<StoredRoute, StorageError> {
        open(&self.key, key, bytes).map(|(route, _)| route)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the secret key came from.
    pub fn key_origin(&self) -> &crate::secrets::KeyOrigin {
        &self.key.origin
    }

    /// Stores a new route or replaces one, durably (synced) and atomically with its index entry.
    pub fn put(&self, route: &StoredRoute) -> Result<(), StorageError> {
        let key = route_key(route.uuid);
        let value = self.encode(&key, route)?;
        let mut batch = WriteBatch::default();
        batch.put(key, value);
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
            Some(bytes) => self.decode(&key, &bytes).map(Some),
        }
    }

    /// Every stored route, in key order; an unreadable record is returned as an error in place.
    pub fn all(&self) -> impl Iterator<Item = Result<StoredRoute, StorageError>> + '_ {
        self.records().map(|record| self.decode_record(&record?))
    }

    /// Every route record, in key order, not yet decoded. Decoding (unsealing and parsing) is most
    /// of the cost of reading a record, so a caller may spread [`Store::decode_record`] over
    /// threads.
    pub fn records(&self) -> impl Iterator<Item = Result<RawRecord, StorageError>> + '_ {
        self.all_records().map(|entry| entry.map(RawRecord).map_err(io))
    }

    pub fn decode_record(&self, record: &RawRecord) -> Result<StoredRoute, StorageError> {
        let (key, value) = &record.0;
        self.decode(key, value)
    }

    /// Up to `limit` routes, newest first, starting after `cursor` (from a previous page).
    pub fn page(&self, limit: usize, cursor: Option<&Cursor>) -> Result<Page, StorageError> {
        let start = match cursor {
            // Just after the cursor's entry.
            Some(Cursor(key)) => [key.as_slice(), &[0]].concat(),
            None => vec![CREATED],
        };
        let mut stored = Vec::new();
        let mut last = None;
        for entry in self.db.iterator(IteratorMode::From(&start, Direction::Forward)) {
            let (key, _) = entry.map_err(io)?;
            if key.first() != Some(&CREATED) {
                break;
            }
            if stored.len() == limit {
                return Ok(Page { stored, next: last.map(|k: Box<[u8]>| hex::encode(&k)) });
            }
            let Some(uuid) = key.get(9..25).and_then(|b| Uuid::from_slice(b).ok()) else { continue };
            if let Some(route) = self.get(uuid)? {
                stored.push(route);
            }
            last = Some(key);
        }
        Ok(Page { stored, next: None })
    }

    /// [`Store::decode_record`] with the record's revision (cluster mode; 0 without one).
    pub fn decode_revised(&self, record: &RawRecord) -> Result<(StoredRoute, u64), StorageError> {
        let (key, value) = &record.0;
        open(&self.key, key, value).map(|(route, revision)| (route, revision.unwrap_or(0)))
    }

    /// Whether any route is stored.
    pub fn has_routes(&self) -> Result<bool, StorageError> {
        self.all_records().next().transpose().map(|first| first.is_some()).map_err(io)
    }

    /// Marks this store as a new cluster node's whose first load is being written ([`LOADING`]).
    pub fn mark_loading(&self) -> Result<(), StorageError> {
        self.db.put(LOADING, []).map_err(io)
    }

    /// Whether this store is a cluster node's whose first load was begun; its position, once
    /// written, says where that load ended.
    pub fn is_loading(&self) -> Result<bool, StorageError> {
        self.db.get_pinned(LOADING).map(|found| found.is_some()).map_err(io)
    }

    /// Where a cluster node's snapshot stands; `None` for a standalone store and a new snapshot.
    pub fn position(&self) -> Result<Option<Position>, StorageError> {
        let Some(bytes) = self.db.get_pinned(POSITION).map_err(io)? else { return Ok(None) };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StorageError::Corrupt { key: "p".to_owned(), why: e.to_string() })
    }

    /// Applies database changes to a cluster node's snapshot in one atomic write: each change is a
    /// route's record as the database holds it (from [`seal_record`]), or `None` where the route
    /// was deleted; then the snapshot stands at `position` (if given; else where it stood). Not
    /// synced: the database is the source of truth, and a snapshot cut short by a crash is still
    /// a prefix of the changes.
    pub fn apply(
        &self,
        changes: &[(Uuid, Option<Vec<u8>>)],
        position: Option<Position>,
    ) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        for (uuid, record) in changes {
            let key = route_key(*uuid);
            // The index entry of the record it replaces (its creation time does not change, but
            // a record that is not readable is replaced whole).
            if let Some(old) = self.db.get_pinned(key).map_err(io)?
                && let Ok(old) = serde_json::from_slice::<Record>(&old)
            {
                batch.delete(created_key(old.created_at, *uuid));
            }
            match record {
                Some(bytes) => {
                    let created_at = serde_json::from_slice::<Record>(bytes)
                        .map_err(|e| StorageError::Corrupt { key: hex::encode(&key), why: e.to_string() })?
                        .created_at;
                    batch.put(key, bytes);
                    batch.put(created_key(created_at, *uuid), []);
                }
                None => batch.delete(key),
            }
        }
        if let Some(position) = position {
            let position = serde_json::to_vec(&position).map_err(|e| StorageError::Io(e.to_string()))?;
            batch.put(POSITION, position);
        }
        self.db.write(batch).map_err(io)
    }

    /// Removes every route that `keep` does not hold (a full resync), leaving the position as it
    /// is. Returns how many were removed.
    pub fn retain(&self, keep: impl Fn(Uuid) -> bool) -> Result<usize, StorageError> {
        let mut batch = WriteBatch::default();
        let mut removed = 0;
        for entry in self.all_records() {
            let (key, value) = entry.map_err(io)?;
            let Some(uuid) = key.get(1..).and_then(|b| Uuid::from_slice(b).ok()) else { continue };
            if keep(uuid) {
                continue;
            }
            if let Ok(record) = serde_json::from_slice::<Record>(&value) {
                batch.delete(created_key(record.created_at, uuid));
            }
            batch.delete(&key);
            removed += 1;
        }
        self.db.write(batch).map_err(io)?;
        Ok(removed)
    }

    fn write(&self, batch: WriteBatch) -> Result<(), StorageError> {
        let mut options = WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(batch, &options).map_err(io)
    }
}

/// A route record as stored: identity and times readable, the configuration sealed with `key`
/// and bound to `place` (the record's store key), and the revision it comes from in cluster mode.
fn seal(key: &SecretKey, place: &[u8], route: &StoredRoute, revision: Option<u64>) -> Vec<u8> {
    let record = Record {
        v: SCHEMA_VERSION,
        uuid: route.uuid,
        created_at: route.created_at,
        updated_at: route.updated_at,
        config: None,
        sealed: Some(hex::encode(&key.seal(route.config.as_bytes(), place))),
        revision,
    };
    serde_json::to_vec(&record).expect("a record serializes")
}

/// Reads a record sealed by [`seal`] at `place`; fails on anything else, on a record whose uuid is
/// not its place's, and on a seal that does not open.
fn open(key: &SecretKey, place: &[u8], bytes: &[u8]) -> Result<(StoredRoute, Option<u64>), StorageError> {
    let corrupt = |why: String| StorageError::Corrupt { key: hex::encode(place), why };
    let record: Record = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if record.v != SCHEMA_VERSION {
        return Err(corrupt(format!("schema version {} is not {SCHEMA_VERSION}", record.v)));
    }
    if place.get(1..) != Some(record.uuid.as_bytes().as_slice()) {
        return Err(corrupt(format!("the record names route {}, another than its place", record.uuid)));
    }
    let sealed = record
        .sealed
        .as_deref()
        .and_then(hex::decode)
        .ok_or_else(|| corrupt("no sealed configuration".into()))?;
    let config =
        key.open(&sealed, place).map_err(|_| corrupt("the sealed configuration does not open".into()))?;
    let config = String::from_utf8(config).map_err(|e| corrupt(e.to_string()))?;
    let route = StoredRoute {
        v: record.v,
        uuid: record.uuid,
        created_at: record.created_at,
        updated_at: record.updated_at,
        config,
    };
    Ok((route, record.revision))
}

/// A route record sealed for the database and every node's snapshot (cluster mode): the same
/// bytes in both, with the revision of the change that wrote it.
pub fn seal_record(key: &SecretKey, route: &StoredRoute, revision: u64) -> Vec<u8> {
    seal(key, &route_key(route.uuid), route, Some(revision))
}

/// Reads a record of [`seal_record`] for route `uuid`, with its revision (0 when it has none).
pub fn open_record(key: &SecretKey, uuid: Uuid, bytes: &[u8]) -> Result<(StoredRoute, u64), StorageError> {
    open(key, &route_key(uuid), bytes).map(|(route, revision)| (route, revision.unwrap_or(0)))
}

/// A record of [`Store::records`] or [`seal_record`] as it is stored (`recast routes export`).
pub fn record_bytes(record: &RawRecord) -> &[u8] {
    &record.0.1
}

/// A stored record as given (`recast routes import`): its route's uuid and times, and the same
/// record with `revision` set; the sealed configuration is kept byte for byte, and must open
/// with `key`.
pub fn imported_record(
    key: &SecretKey,
    bytes: &[u8],
    revision: u64,
) -> Result<(StoredRoute, Vec<u8>), StorageError> {
    let mut record: Record = serde_json::from_slice(bytes)
        .map_err(|e| StorageError::Corrupt { key: "(import)".to_owned(), why: e.to_string() })?;
    let (route, _) = open(key, &route_key(record.uuid), bytes)?;
    record.revision = Some(revision);
    let bytes = serde_json::to_vec(&record).map_err(|e| StorageError::Io(e.to_string()))?;
    Ok((route, bytes))
}

/// The sealed value that tells whether a key is the one records were sealed with.
pub fn seal_key_check(key: &SecretKey) -> Vec<u8> {
    key.seal(KEY_CHECK_TEXT, KEY_CHECK)
}

/// Whether `sealed` is [`seal_key_check`] of `key`.
pub fn key_check_opens(key: &SecretKey, sealed: &[u8]) -> bool {
    key.open(sealed, KEY_CHECK).is_ok_and(|text| text == KEY_CHECK_TEXT)
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

/// Where a cluster node's snapshot stands: the database it comes from (its epoch, written when
/// the schema was created) and the last revision applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub epoch: Uuid,
    pub revision: u64,
}

/// Where a listing continues: the index key of the last route of the previous page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor(Vec<u8>);

impl Cursor {
    /// Reads a cursor as [`Page::next`] gives it; `None` for anything else.
    pub fn parse(text: &str) -> Option<Cursor> {
        let key = hex::decode(text).filter(|key| key.len() == 25)?;
        (key[0] == CREATED).then_some(Cursor(key))
    }

    /// The cursor after the route created at `created_at` with `uuid`, as text.
    pub fn after(created_at: u64, uuid: Uuid) -> String {
        hex::encode(&created_key(created_at, uuid))
    }

    /// The creation time and uuid of the route the listing continues after.
    pub fn route(&self) -> (u64, Uuid) {
        let mut inverted = [0u8; 8];
        inverted.copy_from_slice(&self.0[1..9]);
        let uuid = Uuid::from_slice(&self.0[9..25]).expect("a parsed cursor holds 16 uuid bytes");
        (u64::MAX - u64::from_be_bytes(inverted), uuid)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::new_key_hex;

    /// A configuration holding a stored secret.
    fn config(token: &str) -> serde_json::Value {
        serde_json::json!({ "auth": { "mode": "stored", "kind": "Bearer", "token": token } })
    }

    fn route(uuid: Uuid, token: &str) -> StoredRoute {
        StoredRoute {
            v: SCHEMA_VERSION,
            uuid,
            created_at: 7,
            updated_at: 8,
            config: config(token).to_string(),
        }
    }

    /// A record as the first schema wrote it: the configuration in the clear.
    fn v1_record(uuid: Uuid, token: &str) -> Vec<u8> {
        let record = serde_json::json!({
            "v": 1, "uuid": uuid, "createdAt": 7, "updatedAt": 8, "config": config(token),
        });
        serde_json::to_vec(&record).unwrap()
    }

    /// Every file under `dir` that holds `needle`.
    fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.extend(files_holding(&path, needle));
            } else if std::fs::read(&path).unwrap().windows(needle.len()).any(|w| w == needle) {
                found.push(path);
            }
        }
        found
    }

    /// Level-0 table files of `store`.
    fn level0(store: &Store) -> u64 {
        store.db.property_int_value("rocksdb.num-files-at-level0").unwrap().expect("a RocksDB property")
    }

    /// Writes six routes, each flushed to a table file of its own: more than the four at which
    /// RocksDB merges them by default. Returns the level-0 file count before.
    fn six_table_files(store: &Store) -> u64 {
        let before = level0(store);
        for _ in 0..6 {
            store.put(&route(Uuid::new_v4(), "t")).unwrap();
            store.db.flush().unwrap();
        }
        before
    }

    /// Waits up to 30 s for level 0 to hold fewer than `files`.
    fn merged_below(store: &Store, files: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while level0(store) >= files {
            assert!(std::time::Instant::now() < deadline, "table files not merged within 30 s");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn table_files_are_merged_only_once_held_compactions_resume() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_holding_compactions(dir.path(), None).unwrap();
        let before = six_table_files(&store);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(level0(&store), before + 6, "merged while compactions were held");
        store.resume_compactions().unwrap();
        merged_below(&store, before + 6);
        assert_eq!(store.all().count(), 6, "every route is still there after the merge");
    }

    #[test]
    fn a_store_opened_plainly_merges_as_it_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), None).unwrap();
        let before = six_table_files(&store);
        merged_below(&store, before + 6);
        assert_eq!(store.all().count(), 6);
    }

    #[test]
    fn configurations_are_sealed_on_disk_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let uuid = Uuid::new_v4();
        {
            let store = Store::open(dir.path(), None).unwrap();
            store.put(&route(uuid, "canary-sealed-7f3a")).unwrap();
            assert_eq!(store.get(uuid).unwrap(), Some(route(uuid, "canary-sealed-7f3a")));
        }
        assert_eq!(files_holding(dir.path(), b"canary-sealed-7f3a"), Vec::<PathBuf>::new());
        let store = Store::open(dir.path(), None).unwrap();
        assert_eq!(store.get(uuid).unwrap(), Some(route(uuid, "canary-sealed-7f3a")));
    }

    #[test]
    fn a_wrong_key_fails_closed_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (right, wrong) = (Secret::new(new_key_hex().unwrap()), Secret::new(new_key_hex().unwrap()));
        let uuid = Uuid::new_v4();
        Store::open(dir.path(), Some(&right)).unwrap().put(&route(uuid, "t")).unwrap();
        let Err(StorageError::Key(why)) = Store::open(dir.path(), Some(&wrong)) else {
            panic!("a wrong key must not open the store")
        };
        assert!(why.contains("not the one the stored routes"), "{why}");
        let Err(StorageError::Key(why)) = Store::open(dir.path(), None) else { panic!("no key, no store") };
        assert!(why.contains("set RECAST_SECRET_KEY"), "{why}");
        assert!(!dir.path().join(crate::secrets::KEY_FILE).exists());
        let store = Store::open(dir.path(), Some(&right)).unwrap();
        assert_eq!(store.get(uuid).unwrap(), Some(route(uuid, "t")));
    }

    #[test]
    fn a_store_with_sealed_routes_but_no_key_check_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), None).unwrap();
            store.put(&route(Uuid::new_v4(), "t")).unwrap();
            store.db.delete(KEY_CHECK).unwrap();
        }
        let Err(StorageError::Key(why)) = Store::open(dir.path(), None) else { panic!("refused") };
        assert!(why.contains("altered"), "{why}");
    }

    #[test]
    fn a_compaction_cut_short_is_done_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let uuid = Uuid::new_v4();
        {
            let store = Store::open(dir.path(), None).unwrap();
            // A clear record, and a start that sealed it but died before compacting.
            store.db.put(route_key(uuid), v1_record(uuid, "canary-cut-short-5d1e")).unwrap();
            store.db.flush().unwrap();
            let sealed = store.encode(&route_key(uuid), &route(uuid, "canary-cut-short-5d1e")).unwrap();
            store.db.put(route_key(uuid), sealed).unwrap();
            store.db.put(COMPACT_PENDING, []).unwrap();
            store.db.flush().unwrap();
        }
        assert!(
            !files_holding(dir.path(), b"canary-cut-short-5d1e").is_empty(),
            "the test starts in the clear"
        );
        let store = Store::open(dir.path(), None).unwrap();
        assert_eq!(store.migrated, 0);
        assert_eq!(store.get(uuid).unwrap(), Some(route(uuid, "canary-cut-short-5d1e")));
        drop(store);
        assert_eq!(files_holding(dir.path(), b"canary-cut-short-5d1e"), Vec::<PathBuf>::new());
    }

    #[test]
    fn version_1_records_are_sealed_at_start_and_their_clear_copies_leave_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let uuid = Uuid::new_v4();
        {
            // A store as the first schema wrote it: the configuration in the clear.
            let mut options = Options::default();
            options.create_if_missing(true);
            let db = DB::open(&options, dir.path()).unwrap();
            db.put(route_key(uuid), v1_record(uuid, "canary-v1-clear-91b2")).unwrap();
            db.put(created_key(7, uuid), []).unwrap();
            db.flush().unwrap();
        }
        assert!(
            !files_holding(dir.path(), b"canary-v1-clear-91b2").is_empty(),
            "the test starts in the clear"
        );
        {
            let store = Store::open(dir.path(), None).unwrap();
            assert_eq!(store.migrated, 1);
            assert_eq!(store.get(uuid).unwrap(), Some(route(uuid, "canary-v1-clear-91b2")));
        }
        assert_eq!(files_holding(dir.path(), b"canary-v1-clear-91b2"), Vec::<PathBuf>::new());
        let store = Store::open(dir.path(), None).unwrap();
        assert_eq!(store.migrated, 0);
        assert_eq!(store.all().count(), 1);
        assert!(store.db.get(COMPACT_PENDING).unwrap().is_none(), "the marker is gone once compacted");
        assert_eq!(store.page(10, None).unwrap().stored, [route(uuid, "canary-v1-clear-91b2")]);
    }
}
