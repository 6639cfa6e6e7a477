//! The store on RocksDB: sealing, keys, compactions and revisions.

use super::*;
use crate::secrets::new_key_hex;

/// A configuration holding a stored secret.
fn config(token: &str) -> serde_json::Value {
    serde_json::json!({ "auth": { "mode": "stored", "kind": "Bearer", "token": token } })
}

fn route(uuid: Uuid, token: &str) -> StoredRoute {
    StoredRoute { v: SCHEMA_VERSION, uuid, created_at: 7, updated_at: 8, config: config(token).to_string() }
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
        let sealed = seal(&store.key, &route_key(uuid), &route(uuid, "canary-cut-short-5d1e"), None);
        store.db.put(route_key(uuid), sealed).unwrap();
        store.db.put(COMPACT_PENDING, []).unwrap();
        store.db.flush().unwrap();
    }
    assert!(!files_holding(dir.path(), b"canary-cut-short-5d1e").is_empty(), "the test starts in the clear");
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
    assert!(!files_holding(dir.path(), b"canary-v1-clear-91b2").is_empty(), "the test starts in the clear");
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

/// The revision a record of `uuid` was written with.
fn revision_of(store: &Store, uuid: Uuid) -> u64 {
    let record = store.db.get(route_key(uuid)).unwrap().expect("a record");
    open(&store.key, &route_key(uuid), &record).unwrap().1.expect("a revision")
}

#[test]
fn every_change_has_the_next_revision_and_a_restart_goes_on_from_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    {
        let store = Store::open(dir.path(), None).unwrap();
        assert_eq!(store.put(&route(a, "t")).unwrap(), 1);
        assert_eq!(store.put(&route(b, "t")).unwrap(), 2);
        assert_eq!(store.put(&route(a, "u")).unwrap(), 3);
        assert_eq!(revision_of(&store, a), 3);
        assert_eq!(store.delete(b).unwrap(), Some(4));
        assert_eq!(store.delete(b).unwrap(), None, "no such route: no change");
    }
    // The last change was a deletion, which leaves no record: the counter still goes on.
    let store = Store::open(dir.path(), None).unwrap();
    assert_eq!(store.put(&route(a, "v")).unwrap(), 5);
    assert_eq!(revision_of(&store, a), 5);
}

#[test]
fn changes_written_at_once_get_distinct_revisions_and_a_restart_goes_on_past_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let uuids: Vec<Uuid> = (0..64).map(|_| Uuid::new_v4()).collect();
    let mut revisions = {
        let store = Store::open(dir.path(), None).unwrap();
        std::thread::scope(|scope| {
            let parts: Vec<_> = uuids
                .chunks(8)
                .map(|part| {
                    let store = &store;
                    scope.spawn(move || {
                        part.iter().map(|&u| store.put(&route(u, "t")).unwrap()).collect::<Vec<_>>()
                    })
                })
                .collect();
            parts.into_iter().flat_map(|part| part.join().unwrap()).collect::<Vec<u64>>()
        })
    };
    revisions.sort_unstable();
    assert_eq!(revisions, (1..=64).collect::<Vec<u64>>());
    let store = Store::open(dir.path(), None).unwrap();
    assert_eq!(store.put(&route(uuids[0], "u")).unwrap(), 65);
    // Only the last revision's key is left.
    let keys = store
        .db
        .iterator(IteratorMode::From(&[REVISION], Direction::Forward))
        .map_while(|entry| entry.ok().filter(|(key, _)| key.first() == Some(&REVISION)))
        .count();
    assert_eq!(keys, 1);
}

#[test]
fn a_closed_store_has_its_writes_in_table_files_and_stops_its_background_work() {
    let dir = tempfile::tempdir().unwrap();
    let uuid = Uuid::new_v4();
    let store = std::sync::Arc::new(Store::open(dir.path(), None).unwrap());
    store.put(&route(uuid, "t")).unwrap();
    // Something else still holds the store (as a background task may when a node stops): closing
    // does not wait for it.
    let held = store.clone();
    store.close();
    assert_eq!(
        held.db.property_int_value("rocksdb.num-entries-active-mem-table").unwrap(),
        Some(0),
        "the memtable was written out"
    );
    // Closing again (and the drops) do nothing more.
    held.close();
    drop(store);
    drop(held);
    let store = Store::open(dir.path(), None).unwrap();
    assert_eq!(store.get(uuid).unwrap(), Some(route(uuid, "t")));
}

/// A store in `dir` opened with the ring `keys` (comma-joined).
fn with_ring(dir: &Path, keys: &[&str]) -> Result<Store, StorageError> {
    Store::open(dir, Some(&Secret::new(keys.join(","))))
}

#[test]
fn a_rotated_ring_reseals_every_record_keeps_each_route_and_forgets_the_old_seals() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (new_key_hex().unwrap(), new_key_hex().unwrap());
    let uuids: Vec<Uuid> = (0..7).map(|_| Uuid::new_v4()).collect();
    let (old_id, new_id) = {
        let store = with_ring(dir.path(), &[&old]).unwrap();
        for (i, uuid) in uuids.iter().enumerate() {
            store.put(&route(*uuid, &format!("token-{i}"))).unwrap();
        }
        let old_id = store.keyring().sealing();
        assert_eq!(store.key_counts().unwrap().records.get(&old_id), Some(&7));
        drop(store);
        let store = with_ring(dir.path(), &[&new, &old]).unwrap();
        (old_id, store.keyring().sealing())
    };
    // A ring whose keys are all new to the store: refused at start.
    let stranger = new_key_hex().unwrap();
    assert!(matches!(with_ring(dir.path(), &[&stranger]), Err(StorageError::Key(_))));

    let store = with_ring(dir.path(), &[&new, &old]).unwrap();
    // The sealed configuration of one record as the old key sealed it.
    let old_record: serde_json::Value =
        serde_json::from_slice(&store.db.get(route_key(uuids[0])).unwrap().unwrap()).unwrap();
    let old_sealed = old_record["sealed"].as_str().unwrap().to_owned();
    store.db.flush().unwrap();
    assert!(!files_holding(dir.path(), old_sealed.as_bytes()).is_empty());
    let revisions: Vec<_> = store.records().map(|r| store.decode_revised(&r.unwrap()).unwrap().1).collect();
    // A route written now is sealed by the new key; the others stay the old key's until re-sealed.
    let fresh = Uuid::new_v4();
    store.put(&route(fresh, "token-new")).unwrap();
    let counts = store.key_counts().unwrap();
    assert_eq!((counts.records.get(&old_id), counts.records.get(&new_id)), (Some(&7), Some(&1)));
    // Three records at a time: three steps, the last one without a next.
    let mut after = None;
    let (mut steps, mut resealed, mut scanned) = (0, 0, 0);
    loop {
        let step = store.reseal_step(after.as_deref(), 3).unwrap();
        steps += 1;
        resealed += step.resealed;
        scanned += step.scanned;
        assert!(step.missing.is_empty() && step.unreadable == 0);
        match step.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!((steps, scanned, resealed), (3, 8, 7));
    store.forget_old_seals().unwrap();
    assert_eq!(
        files_holding(dir.path(), old_sealed.as_bytes()),
        Vec::<PathBuf>::new(),
        "old seals left the files"
    );
    assert_eq!(store.key_counts().unwrap().records.into_iter().collect::<Vec<_>>(), vec![(new_id, 8)]);
    // Nothing changed but the seals: the routes, their times and revisions are the same.
    let after_revisions: Vec<_> = store
        .records()
        .map(|r| store.decode_revised(&r.unwrap()).unwrap())
        .filter(|(route, _)| route.uuid != fresh)
        .map(|(_, revision)| revision)
        .collect();
    assert_eq!(after_revisions, revisions);
    for (i, uuid) in uuids.iter().enumerate() {
        assert_eq!(store.get(*uuid).unwrap().unwrap(), route(*uuid, &format!("token-{i}")));
    }
    // A second re-seal finds nothing to do.
    assert_eq!(store.reseal_step(None, 100).unwrap().resealed, 0);
    drop(store);

    // The old key can go: the store opens with the new key alone, every route with it.
    let store = with_ring(dir.path(), &[&new]).unwrap();
    assert_eq!(store.all().filter(|r| r.is_ok()).count(), 8);
    drop(store);
    // And the old key alone no longer opens the store (its key check is the new key's now).
    assert!(matches!(with_ring(dir.path(), &[&old]), Err(StorageError::Key(_))));
}

#[test]
fn a_record_sealed_by_a_key_the_ring_lacks_is_named_listed_and_deletable() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (new_key_hex().unwrap(), new_key_hex().unwrap());
    let (kept, lost) = (Uuid::new_v4(), Uuid::new_v4());
    let old_id = {
        let store = with_ring(dir.path(), &[&old]).unwrap();
        store.put(&route(lost, "lost")).unwrap();
        store.keyring().sealing()
    };
    {
        // The new key first, the old one kept: `kept` is sealed by the new key.
        let store = with_ring(dir.path(), &[&new, &old]).unwrap();
        store.put(&route(kept, "kept")).unwrap();
        // The key check is re-sealed by the first step of a re-seal; here only that, so the
        // old record stays the old key's.
        let mut batch = WriteBatch::default();
        batch.put(KEY_CHECK, seal_key_check(store.keyring()));
        store.write(batch).unwrap();
    }
    let store = with_ring(dir.path(), &[&new]).unwrap();
    assert_eq!(store.get(kept).unwrap().unwrap(), route(kept, "kept"));
    match store.get(lost) {
        Err(StorageError::KeyMissing { uuid, key, created_at: 7, updated_at: 8, .. }) => {
            assert_eq!((uuid, key), (lost, old_id));
        }
        other => panic!("{other:?}"),
    }
    let message = store.get(lost).unwrap_err().to_string();
    assert!(message.contains(&lost.to_string()) && message.contains(&old_id.to_string()), "{message}");
    let counts = store.key_counts().unwrap();
    assert_eq!(counts.records.get(&old_id), Some(&1), "counted under the id it names");
    // A re-seal leaves it as it is, and says so.
    let step = store.reseal_step(None, 10).unwrap();
    assert_eq!((step.resealed, step.missing.clone()), (0, vec![(lost, old_id)]));
    // Listed (its configuration unknown), and deletable.
    let page = store.page(10, None).unwrap();
    assert_eq!(page.stored.len(), 2);
    assert!(page.stored.iter().any(|r| r.uuid == lost && r.config.is_empty()));
    assert!(store.delete(lost).unwrap().is_some());
    assert!(store.get(lost).unwrap().is_none());
    assert_eq!(store.page(10, None).unwrap().stored.len(), 1);
}

#[test]
fn records_sealed_before_key_ids_open_are_counted_by_the_key_that_opens_them_and_resealed() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key_hex().unwrap();
    let uuid = Uuid::new_v4();
    let store = with_ring(dir.path(), &[&key]).unwrap();
    store.put(&route(uuid, "legacy")).unwrap();
    // The record as it was written before records named their key.
    let place = route_key(uuid);
    let mut record: serde_json::Value =
        serde_json::from_slice(&store.db.get(place).unwrap().unwrap()).unwrap();
    assert_eq!(record["keyId"], store.keyring().sealing().to_string());
    record.as_object_mut().unwrap().remove("keyId");
    store.db.put(place, serde_json::to_vec(&record).unwrap()).unwrap();
    assert_eq!(store.get(uuid).unwrap().unwrap(), route(uuid, "legacy"));
    assert_eq!(store.key_counts().unwrap().records.get(&store.keyring().sealing()), Some(&1));
    // A re-seal gives it its key's id.
    assert_eq!(store.reseal_step(None, 10).unwrap().resealed, 1);
    let record: serde_json::Value = serde_json::from_slice(&store.db.get(place).unwrap().unwrap()).unwrap();
    assert_eq!(record["keyId"], store.keyring().sealing().to_string());
    assert_eq!(store.reseal_step(None, 10).unwrap().resealed, 0);
}
