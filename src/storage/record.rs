//! The record format: how a route is written into the store's keys and values, and, in cluster
//! mode, into the database and every node's snapshot (the same bytes in all three).
//!
//! Keys: `r/<uuid>` holds a route record; `c/<creation time, inverted><uuid>` is an empty index
//! entry that lists routes newest first; `k` holds a value sealed with the secret key, to tell
//! whether a key is the one the records were sealed with.
//!
//! Records are JSON with a schema version. A route's configuration, which holds its upstream
//! credentials, is sealed (AES-256-GCM, bound to the record's key); only identity, times, the
//! revision and the id of the key that sealed it (`keyId`) are readable without the key. Records
//! sealed before keys had ids have no `keyId`: whichever key of the ring opens them is theirs.
//! Version 1 records held the configuration in the clear; they are read only to be sealed.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::StorageError;
use crate::hex;
use crate::secrets::{KeyId, Keyring, NotOpened};

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

/// The schema version written into every record.
pub const SCHEMA_VERSION: u32 = 2;
/// Configuration in the clear; read only to be sealed.
pub(super) const SCHEMA_V1: u32 = 1;

pub(super) const ROUTE: u8 = b'r';
pub(super) const CREATED: u8 = b'c';
pub(super) const KEY_CHECK: &[u8] = b"k";
const KEY_CHECK_TEXT: &[u8] = b"recast key check";

/// A record as it is on disk.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Record {
    pub(super) v: u32,
    pub(super) uuid: Uuid,
    pub(super) created_at: u64,
    pub(super) updated_at: u64,
    /// Version 1: the configuration in the clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) config: Option<serde_json::Value>,
    /// Version 2: the configuration's JSON text, sealed, in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) sealed: Option<String>,
    /// The revision of the change that wrote it: the store's own, or the database's in cluster
    /// mode; none in records written before revisions were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) revision: Option<u64>,
    /// The id of the key that sealed it (8 hex digits); none in records sealed before keys had
    /// ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) key_id: Option<String>,
}

/// A route record as stored: identity and times readable, the configuration sealed with `key`
/// and bound to `place` (the record's store key), and the revision of the change that wrote it.
pub(super) fn seal(key: &Keyring, place: &[u8], route: &StoredRoute, revision: Option<u64>) -> Vec<u8> {
    let record = Record {
        v: SCHEMA_VERSION,
        uuid: route.uuid,
        created_at: route.created_at,
        updated_at: route.updated_at,
        config: None,
        sealed: Some(hex::encode(&key.seal(route.config.as_bytes(), place))),
        revision,
        key_id: Some(key.sealing().to_string()),
    };
    serde_json::to_vec(&record).expect("a record serializes")
}

/// Reads a record sealed by [`seal`] at `place`; fails on anything else, on a record whose uuid is
/// not its place's, and on a seal that does not open ([`StorageError::KeyMissing`] when it names
/// a key the ring lacks).
pub(super) fn open(
    key: &Keyring,
    place: &[u8],
    bytes: &[u8],
) -> Result<(StoredRoute, Option<u64>), StorageError> {
    opened(key, place, bytes).map(|(route, revision, _)| (route, revision))
}

/// [`open`], with the id of the key that opened the record.
fn opened(
    key: &Keyring,
    place: &[u8],
    bytes: &[u8],
) -> Result<(StoredRoute, Option<u64>, KeyId), StorageError> {
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
    let named = match record.key_id.as_deref() {
        Some(text) => Some(KeyId::parse(text).ok_or_else(|| corrupt(format!("`{text}` is not a key id")))?),
        None => None,
    };
    let (config, id) = key.open_with(&sealed, place, named).map_err(|e| match e {
        NotOpened::KeyMissing(id) => StorageError::KeyMissing {
            uuid: record.uuid,
            key: id,
            created_at: record.created_at,
            updated_at: record.updated_at,
            revision: record.revision,
        },
        NotOpened::Unreadable => corrupt("the sealed configuration does not open".into()),
    })?;
    let config = String::from_utf8(config).map_err(|e| corrupt(e.to_string()))?;
    let route = StoredRoute {
        v: record.v,
        uuid: record.uuid,
        created_at: record.created_at,
        updated_at: record.updated_at,
        config,
    };
    Ok((route, record.revision, id))
}

/// Which key sealed a stored record: the id it names, or for a record from before ids, the key
/// of the ring that opens it.
pub(super) fn sealed_by(key: &Keyring, place: &[u8], bytes: &[u8]) -> Result<KeyId, StorageError> {
    match named_key(place, bytes)? {
        Some(id) => Ok(id),
        None => opened(key, place, bytes).map(|(_, _, id)| id),
    }
}

/// The key id a stored record names, read without opening it; `None` for a record from before
/// ids.
fn named_key(place: &[u8], bytes: &[u8]) -> Result<Option<KeyId>, StorageError> {
    let record: Record = serde_json::from_slice(bytes)
        .map_err(|e| StorageError::Corrupt { key: hex::encode(place), why: e.to_string() })?;
    Ok(record.key_id.as_deref().and_then(KeyId::parse))
}

/// The record at `place` sealed again with the ring's sealing key, its route, times and revision
/// unchanged; `None` when the sealing key sealed it already.
pub(super) fn resealed(key: &Keyring, place: &[u8], bytes: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
    Ok(to_reseal(key, place, bytes)?.map(|(route, revision)| seal(key, place, &route, revision)))
}

/// The route and revision of the record at `place` when a key other than the ring's sealing key
/// sealed it (or it names none); `None`, without opening it, when it names the sealing key.
fn to_reseal(
    key: &Keyring,
    place: &[u8],
    bytes: &[u8],
) -> Result<Option<(StoredRoute, Option<u64>)>, StorageError> {
    if named_key(place, bytes)? == Some(key.sealing()) {
        return Ok(None);
    }
    opened(key, place, bytes).map(|(route, revision, _)| Some((route, revision)))
}

/// A route record sealed for the database and every node's snapshot (cluster mode): the same
/// bytes in both, with the revision of the change that wrote it.
pub fn seal_record(key: &Keyring, route: &StoredRoute, revision: u64) -> Vec<u8> {
    seal(key, &route_key(route.uuid), route, Some(revision))
}

/// Reads a record of [`seal_record`] for route `uuid`, with its revision (0 when it has none).
pub fn open_record(key: &Keyring, uuid: Uuid, bytes: &[u8]) -> Result<(StoredRoute, u64), StorageError> {
    open(key, &route_key(uuid), bytes).map(|(route, revision)| (route, revision.unwrap_or(0)))
}

/// A stored record as given (`recast routes import`): its route's uuid and times, and the same
/// record with `revision` set; the sealed configuration is kept byte for byte, and must open
/// with `key`.
pub fn imported_record(
    key: &Keyring,
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

/// Which key sealed the database record of route `uuid` (cluster mode): the id it names, or for
/// a record from before ids, the key of the ring that opens it.
pub fn record_sealed_by(key: &Keyring, uuid: Uuid, bytes: &[u8]) -> Result<KeyId, StorageError> {
    sealed_by(key, &route_key(uuid), bytes)
}

/// The route of the database record of route `uuid` when a key other than the ring's sealing key
/// sealed it, to be sealed again ([`seal_record`]); `None` when the sealing key sealed it.
pub fn route_to_reseal(key: &Keyring, uuid: Uuid, bytes: &[u8]) -> Result<Option<StoredRoute>, StorageError> {
    Ok(to_reseal(key, &route_key(uuid), bytes)?.map(|(route, _)| route))
}

/// The sealed value that tells whether a key is the one records were sealed with.
pub fn seal_key_check(key: &Keyring) -> Vec<u8> {
    key.seal(KEY_CHECK_TEXT, KEY_CHECK)
}

/// Whether `sealed` is [`seal_key_check`] of a key of the ring.
pub fn key_check_opens(key: &Keyring, sealed: &[u8]) -> bool {
    key_check_opener(key, sealed).is_some()
}

/// The key of the ring that [`seal_key_check`] made `sealed` with, if one did.
pub(super) fn key_check_opener(key: &Keyring, sealed: &[u8]) -> Option<KeyId> {
    match key.open_with(sealed, KEY_CHECK, None) {
        Ok((text, id)) if text == KEY_CHECK_TEXT => Some(id),
        _ => None,
    }
}

pub(super) fn route_key(uuid: Uuid) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[0] = ROUTE;
    key[1..].copy_from_slice(uuid.as_bytes());
    key
}

/// `c`, then the creation time inverted (so that ascending keys are newest first), then the uuid.
pub(super) fn created_key(created_at: u64, uuid: Uuid) -> [u8; 25] {
    let mut key = [0u8; 25];
    key[0] = CREATED;
    key[1..9].copy_from_slice(&(u64::MAX - created_at).to_be_bytes());
    key[9..].copy_from_slice(uuid.as_bytes());
    key
}
