//! Durable storage of routes in RocksDB: the only module that touches it. `Store` here keeps
//! routes (every acknowledged change one atomic, synced write batch, so a crash either keeps all
//! of it or none) and gives each change a revision; [`record`] is the format of what it writes;
//! [`snapshot`] is a cluster node's copy of the database in the same store.
//!
//! Version 1 records (configuration in the clear) are sealed at start, and the store is
//! compacted so the clear copies leave the files.

mod error;
mod record;
mod snapshot;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rocksdb::{DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};
use uuid::Uuid;

pub use self::error::StorageError;
pub use self::record::StoredRoute;
use self::record::{
    CREATED, KEY_CHECK, ROUTE, Record, SCHEMA_V1, created_key, key_check_opener, open, resealed, route_key,
    seal, sealed_by,
};
pub use self::record::{
    SCHEMA_VERSION, imported_record, key_check_opens, open_record, record_sealed_by, route_to_reseal,
    seal_key_check, seal_record,
};
pub use self::snapshot::Position;
use crate::hex;
use crate::secrets::{Keyring, Secret};

/// Present while clear copies of version 1 records may remain in the files: the store is
/// compacted at start until it is gone.
const COMPACT_PENDING: &[u8] = b"m";
/// `u`, then a consumer's name: the consumer (SPEC §2.4) as JSON; its keys are digests.
const CONSUMER: u8 = b'u';

fn consumer_key(name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + name.len());
    key.push(CONSUMER);
    key.extend_from_slice(name.as_bytes());
    key
}

/// `v`, then a revision: the last revision the store gave a change (the highest such key; the
/// one before is removed with each change).
const REVISION: u8 = b'v';

/// A key and its value, as RocksDB's iterator gives them.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// A route record as stored, not yet decoded (see [`Store::records`]).
pub struct RawRecord(KeyValue);

/// The route store.
pub struct Store {
    db: DB,
    dir: PathBuf,
    key: Keyring,
    /// The last revision given to a change.
    revision: AtomicU64,
    /// Version 1 records sealed when the store was opened.
    pub migrated: usize,
    /// Whether [`Store::close`] ran.
    closed: std::sync::atomic::AtomicBool,
    /// A cluster node's snapshot whose key check no key of the ring opens: the ring must be
    /// checked against the database's before the snapshot is used ([`Store::adopt_key_check`]).
    unverified: bool,
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}

/// One page of a listing, newest first.
pub struct Page {
    pub stored: Vec<StoredRoute>,
    /// Where the next page starts, if there is one.
    pub next: Option<String>,
}

impl Store {
    /// Closes the store for good, once: writes the memtables to table files, so the next start
    /// reads them instead of replaying the write-ahead log (every acknowledged write is already
    /// synced in the log; a crash only makes the next start replay it), and stops the storage
    /// library's background work (a compaction under way stops at its next check rather than
    /// running on into the process's exit, which waited for it). A write after it (by work left
    /// behind past the grace period) still goes to the synced log, which the next start replays.
    /// Done by a stopping node before it says that storage is closed, whatever still holds the
    /// store, and by the drop of the last handle otherwise.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = self.db.flush() {
            tracing::warn!(error = %e, "the store could not be flushed on close; the next start replays its log");
        }
        self.db.cancel_all_background_work(true);
    }

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
        let key = Keyring::load(secret, dir, !sealed_before).map_err(StorageError::Key)?;
        let revision = AtomicU64::new(last_revision(&db)?);
        let mut store = Store {
            db,
            dir: dir.to_owned(),
            key,
            revision,
            migrated: 0,
            closed: std::sync::atomic::AtomicBool::new(false),
            unverified: false,
        };
        match store.check_key()? {
            KeyCheck::Opens => {}
            KeyCheck::None => store.migrated = store.seal_v1_records()?,
            KeyCheck::Unverified => store.unverified = true,
        }
        store.compact_if_pending()?;
        Ok(store)
    }

    /// Lets RocksDB merge table files in the background again, after
    /// [`Store::open_holding_compactions`]; RocksDB schedules any merge that is due at once.
    pub fn resume_compactions(&self) -> Result<(), StorageError> {
        self.db.set_options(&[("disable_auto_compactions", "false")]).map_err(io)
    }

    /// Fails closed when no key of the ring opens the key-check value, except in a cluster
    /// node's snapshot, whose records are the database's: there the ring is checked against the
    /// database's key check before the snapshot is used ([`KeyCheck::Unverified`]).
    fn check_key(&self) -> Result<KeyCheck, StorageError> {
        match self.db.get(KEY_CHECK).map_err(io)? {
            Some(sealed) if key_check_opener(&self.key, &sealed).is_some() => Ok(KeyCheck::Opens),
            Some(_) if self.position()?.is_some() || self.is_loading()? => Ok(KeyCheck::Unverified),
            Some(_) => Err(self.wrong_key()),
            // A new store, or one from before records were sealed (version 1 records only). Sealed
            // records without a key check mean the check was removed: refuse rather than guess.
            None if self.only_v1_records() => Ok(KeyCheck::None),
            None => Err(StorageError::Key(format!(
                "{} holds sealed routes but no key check; it was altered (nothing was changed)",
                self.dir.display()
            ))),
        }
    }

    /// Whether this is a cluster node's snapshot whose key check the ring does not open: the
    /// caller must check the ring against the database's, then [`Store::adopt_key_check`].
    pub fn key_check_unverified(&self) -> bool {
        self.unverified
    }

    /// Seals the key check again with the ring's first key: after a re-seal began, or once a
    /// cluster node's ring was found to be the database's.
    pub fn adopt_key_check(&self) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        batch.put(KEY_CHECK, seal_key_check(&self.key));
        self.write(batch)
    }

    fn wrong_key(&self) -> StorageError {
        StorageError::Key(format!(
            "the secret key ({}) is not the one the stored routes in {} were sealed with; \
                     start with the right RECAST_SECRET_KEYS, RECAST_SECRET_KEY or key file (nothing was changed)",
            self.key.origin,
            self.dir.display()
        ))
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
        batch.put(KEY_CHECK, seal_key_check(&self.key));
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
            batch.put(&key, seal(&self.key, &key, &route, None));
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

    /// The keys that seal and open the records.
    pub fn keyring(&self) -> &Keyring {
        &self.key
    }

    /// Stores a new route or replaces one, durably (synced) and atomically with its index entry;
    /// answers the change's revision.
    pub fn put(&self, route: &StoredRoute) -> Result<u64, StorageError> {
        let key = route_key(route.uuid);
        let mut batch = WriteBatch::default();
        let revision = self.next_revision(&mut batch);
        batch.put(key, seal(&self.key, &key, route, Some(revision)));
        batch.put(created_key(route.created_at, route.uuid), []);
        self.write(batch)?;
        Ok(revision)
    }

    /// Removes a route and its index entry, durably; answers the deletion's revision, or `None`
    /// when there was no such route.
    pub fn delete(&self, uuid: Uuid) -> Result<Option<u64>, StorageError> {
        // Read without unsealing: a route sealed by a key the ring lacks can be deleted too.
        let key = route_key(uuid);
        let Some(bytes) = self.db.get_pinned(key).map_err(io)? else { return Ok(None) };
        let record: Record = serde_json::from_slice(&bytes)
            .map_err(|e| StorageError::Corrupt { key: hex::encode(&key), why: e.to_string() })?;
        let mut batch = WriteBatch::default();
        let revision = self.next_revision(&mut batch);
        batch.delete(key);
        batch.delete(created_key(record.created_at, uuid));
        self.write(batch)?;
        Ok(Some(revision))
    }

    /// The revision of a change about to be written in `batch`, which also records it. Changes
    /// written at once may land in any order: each writes its own revision's key and removes the
    /// one before, so the highest key is never removed and the next start goes on from it.
    fn next_revision(&self, batch: &mut WriteBatch) -> u64 {
        let revision = self.revision.fetch_add(1, Ordering::Relaxed) + 1;
        batch.put(revision_key(revision), []);
        batch.delete(revision_key(revision - 1));
        revision
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
            match self.get(uuid) {
                Ok(Some(route)) => stored.push(route),
                Ok(None) => {}
                // Listed by what can be read of it without the key; the route table holds it
                // as a route that answers 503 and says why.
                Err(StorageError::KeyMissing { uuid, created_at, updated_at, .. }) => {
                    stored.push(StoredRoute {
                        v: SCHEMA_VERSION,
                        uuid,
                        created_at,
                        updated_at,
                        config: String::new(),
                    })
                }
                Err(e) => return Err(e),
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

    /// How many stored records each key sealed, and how many could not be read.
    pub fn key_counts(&self) -> Result<KeyCounts, StorageError> {
        let mut counts = KeyCounts::default();
        for entry in self.all_records() {
            let (key, value) = entry.map_err(io)?;
            match sealed_by(&self.key, &key, &value) {
                Ok(id) => *counts.records.entry(id).or_default() += 1,
                Err(_) => counts.unreadable += 1,
            }
        }
        Ok(counts)
    }

    /// One step of a re-seal: of the next `limit` records after the route key `after`, seals
    /// again with the ring's first key every one another key sealed, in one synced batch (so a
    /// crash keeps each record as it was or as it is now, both open with the ring). The first
    /// step also seals the key check with the first key. A record's route, times and revision
    /// are unchanged.
    pub fn reseal_step(&self, after: Option<&[u8]>, limit: usize) -> Result<ResealStep, StorageError> {
        let mut step = ResealStep::default();
        let mut batch = WriteBatch::default();
        if after.is_none() {
            batch.put(KEY_CHECK, seal_key_check(&self.key));
        }
        let start = match after {
            Some(after) => [after, &[0]].concat(),
            None => vec![ROUTE],
        };
        // The key of the record looked at last: where the next step begins, if there is more.
        let mut last = None;
        for entry in self.db.iterator(IteratorMode::From(&start, Direction::Forward)) {
            let (key, value) = entry.map_err(io)?;
            if key.first() != Some(&ROUTE) {
                break;
            }
            if step.scanned == limit {
                step.next = last.take();
                break;
            }
            step.scanned += 1;
            match resealed(&self.key, &key, &value) {
                Ok(Some(record)) => {
                    batch.put(&key, record);
                    step.resealed += 1;
                }
                Ok(None) => {}
                Err(StorageError::KeyMissing { uuid, key: id, .. }) => step.missing.push((uuid, id)),
                Err(e) => {
                    tracing::error!(error = %e, "a stored record that does not open was left as it is");
                    step.unreadable += 1;
                }
            }
            last = Some(key.to_vec());
        }
        self.write(batch)?;
        Ok(step)
    }

    /// After a re-seal that sealed records again: compacts the store so that the copies sealed
    /// by the old keys leave its files (a crash before the end repeats it at the next start).
    pub fn forget_old_seals(&self) -> Result<(), StorageError> {
        let mut marker = WriteBatch::default();
        marker.put(COMPACT_PENDING, []);
        self.write(marker)?;
        self.compact_if_pending()
    }

    /// Whether any route is stored.
    pub fn has_routes(&self) -> Result<bool, StorageError> {
        self.all_records().next().transpose().map(|first| first.is_some()).map_err(io)
    }

    /// Stores a consumer (its metadata and its keys' digests) in place of what was stored of
    /// it, durably.
    pub fn put_consumer(&self, consumer: &crate::callers::StoredConsumer) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        let value = serde_json::to_vec(consumer).map_err(|e| StorageError::Io(e.to_string()))?;
        batch.put(consumer_key(&consumer.name), value);
        self.write(batch)
    }

    /// Stores several consumers in one durable batch (an import, a benchmark's fill).
    pub fn put_consumers(&self, consumers: &[crate::callers::StoredConsumer]) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        for consumer in consumers {
            let value = serde_json::to_vec(consumer).map_err(|e| StorageError::Io(e.to_string()))?;
            batch.put(consumer_key(&consumer.name), value);
        }
        self.write(batch)
    }

    /// Removes a consumer, durably; whether there was one.
    pub fn delete_consumer(&self, name: &str) -> Result<bool, StorageError> {
        let key = consumer_key(name);
        if self.db.get_pinned(&key).map_err(io)?.is_none() {
            return Ok(false);
        }
        let mut batch = WriteBatch::default();
        batch.delete(key);
        self.write(batch)?;
        Ok(true)
    }

    /// Every stored consumer, by name.
    pub fn consumers(&self) -> Result<Vec<crate::callers::StoredConsumer>, StorageError> {
        let mut consumers = Vec::new();
        self.each_consumer(|consumer| consumers.push(consumer))?;
        Ok(consumers)
    }

    /// Hands every stored consumer to `f` as it is read (a start reads a million without
    /// holding them all twice); how many there were.
    pub fn each_consumer(
        &self,
        mut f: impl FnMut(crate::callers::StoredConsumer),
    ) -> Result<usize, StorageError> {
        let mut count = 0;
        let entries = self
            .db
            .iterator(IteratorMode::From(&[CONSUMER], Direction::Forward))
            .take_while(|entry| entry.as_ref().map_or(true, |(key, _)| key.first() == Some(&CONSUMER)));
        for entry in entries {
            let (key, value) = entry.map_err(io)?;
            let consumer = serde_json::from_slice(&value)
                .map_err(|e| StorageError::Corrupt { key: hex::encode(&key), why: e.to_string() })?;
            f(consumer);
            count += 1;
        }
        Ok(count)
    }

    fn write(&self, batch: WriteBatch) -> Result<(), StorageError> {
        let mut options = WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(batch, &options).map_err(io)
    }
}

/// What the key check said when the store was opened.
enum KeyCheck {
    /// A key of the ring opens it.
    Opens,
    /// There is none yet (a new store, or version 1 records to seal).
    None,
    /// No key of the ring opens a cluster node's snapshot's check.
    Unverified,
}

/// How many stored records each key sealed ([`Store::key_counts`]).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KeyCounts {
    pub records: std::collections::BTreeMap<crate::secrets::KeyId, usize>,
    /// Records that do not open with any key of the ring and name none.
    pub unreadable: usize,
}

/// What one step of a re-seal did ([`Store::reseal_step`]).
#[derive(Debug, Default, Clone)]
pub struct ResealStep {
    /// Records looked at.
    pub scanned: usize,
    /// Records sealed again with the first key.
    pub resealed: usize,
    /// Records sealed by a key the ring lacks, left as they are.
    pub missing: Vec<(Uuid, crate::secrets::KeyId)>,
    /// Records that open with no key of the ring and name none, left as they are.
    pub unreadable: usize,
    /// Where the next step begins; `None` when this one reached the last record.
    pub next: Option<Vec<u8>>,
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

/// `v` and a revision, big-endian so keys sort by revision.
fn revision_key(revision: u64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = REVISION;
    key[1..].copy_from_slice(&revision.to_be_bytes());
    key
}

/// The last revision the store gave a change: its highest revision key (0 for none). The keys
/// below it, left by changes that landed out of order, are removed.
fn last_revision(db: &DB) -> Result<u64, StorageError> {
    let mut keys = Vec::new();
    for entry in db.iterator(IteratorMode::From(&[REVISION], Direction::Forward)) {
        let (key, _) = entry.map_err(io)?;
        if key.first() != Some(&REVISION) {
            break;
        }
        keys.push(key);
    }
    let Some(last) = keys.pop() else { return Ok(0) };
    if !keys.is_empty() {
        let mut batch = WriteBatch::default();
        keys.iter().for_each(|key| batch.delete(key));
        db.write(batch).map_err(io)?;
    }
    let revision = last.get(1..).and_then(|bytes| bytes.try_into().ok()).map(u64::from_be_bytes);
    revision.ok_or_else(|| StorageError::Corrupt {
        key: hex::encode(&last),
        why: "not a revision key".to_owned(),
    })
}

/// A record of [`Store::records`] as it is stored (`recast routes export`).
pub fn record_bytes(record: &RawRecord) -> &[u8] {
    &record.0.1
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
