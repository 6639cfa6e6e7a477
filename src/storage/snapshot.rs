//! A cluster node's snapshot of the database, kept in the node's own store: the records exactly
//! as the database holds them (`record::seal_record`), the position they stand at, and the marker
//! of a first load being written. The database is the source of truth, so these writes are not
//! synced: a snapshot cut short by a crash is still a prefix of the changes, and a node whose
//! snapshot cannot be trusted loads everything again.

use rocksdb::WriteBatch;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::record::{Record, created_key, route_key};
use super::{StorageError, Store, io};
use crate::hex;

/// In a cluster node's snapshot: the database epoch and revision its records come from.
const POSITION: &[u8] = b"p";
/// In a new cluster node's store while its first full load is written and before its position
/// is: records without a position are then that load's, not a standalone node's.
const LOADING: &[u8] = b"l";

/// Where a cluster node's snapshot stands: the database it comes from (its epoch, written when
/// the schema was created), the last revision applied, and the id the database's history gives
/// the change at that revision, so a node can tell that the history it followed is still the
/// database's (not one a restore from a backup replaced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub epoch: Uuid,
    pub revision: u64,
    /// `None` in a snapshot written before the history was kept, or at a revision inside a
    /// change that wrote several (an import): a node at such a position loads everything again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Uuid>,
}

impl Store {
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
}
