//! The key ring's admin endpoints: `GET /v1/keys` (which key sealed how many stored routes) and
//! `POST /v1/keys/reseal` (seal every stored route again with the ring's first key, online).
//!
//! A re-seal goes through the store in steps of `batch` records, each one durable change made
//! under the service's write lock, so registrations, updates and deletes wait at most one step
//! and never interleave with one. It changes no route: the routes in memory keep serving as
//! they are, and every record opens with the ring before, during and after (a crash keeps each
//! record as it was or as it is now).

use std::time::Instant;

use http::StatusCode;
use serde::Serialize;
use uuid::Uuid;

use super::reply::json;
use super::{ApiError, Response, State};
use crate::logging::logged;
use crate::secrets::KeyId;
use crate::storage::KeyCounts;

/// Records re-sealed in one step when `batch` is not given, and the most a step may take.
const DEFAULT_BATCH: usize = 256;
const MAX_BATCH: usize = 1000;

/// `GET /v1/keys`.
pub(super) async fn status(state: &State) -> Result<Response, ApiError> {
    state.loaded()?;
    let counts = state.stored(state.store.key_counts().await)?;
    reply(StatusCode::OK, &KeysView::of(state, &counts, None))
}

/// `POST /v1/keys/reseal[?batch=N]`.
pub(super) async fn reseal(state: &State, query: Option<&str>) -> Result<Response, ApiError> {
    state.loaded()?;
    let mut batch = DEFAULT_BATCH;
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if name == "batch" {
            batch = value.parse().ok().filter(|n| (1..=MAX_BATCH).contains(n)).ok_or_else(|| {
                ApiError::InvalidQuery(format!("`batch` must be a number from 1 to {MAX_BATCH}"))
            })?;
        }
    }
    let Ok(_one) = state.resealing.try_lock() else {
        return Err(ApiError::ResealRefused("a re-seal is under way on this node".to_owned()));
    };
    let sealing = state.store.keyring().sealing();
    logged!(tracing::Level::INFO, %sealing, batch, "re-sealing the stored routes");
    let started = Instant::now();
    let mut done = Resealed::default();
    let mut after = None;
    loop {
        // The store holds the lock until the step is written, even if this request is dropped
        // meanwhile: no change can land between a step's read and its write.
        let writing = Box::new(state.writes.clone().lock_owned().await);
        let step = state.stored(state.store.reseal_step(after.take(), batch, writing).await)?;
        done.scanned += step.scanned;
        done.resealed += step.resealed;
        done.unreadable += step.unreadable;
        done.missing.extend(step.missing.iter().map(|&(uuid, key_id)| Missing { uuid, key_id }));
        match step.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    // Also when this run found nothing to do: an earlier run may have ended before it.
    state.stored(state.store.resealed().await)?;
    let seconds = started.elapsed().as_secs_f64();
    logged!(
        tracing::Level::INFO,
        %sealing,
        resealed = done.resealed,
        scanned = done.scanned,
        missing = done.missing.len(),
        unreadable = done.unreadable,
        seconds,
        "stored routes re-sealed"
    );
    for missing in &done.missing {
        logged!(
            tracing::Level::ERROR,
            uuid = %missing.uuid,
            key = %missing.key_id,
            "route sealed by a key the ring lacks was not re-sealed; it answers 503 until that key is added"
        );
    }
    let counts = state.stored(state.store.key_counts().await)?;
    reply(StatusCode::OK, &KeysView::of(state, &counts, Some(done)))
}

fn reply(status: StatusCode, view: &KeysView) -> Result<Response, ApiError> {
    let body = serde_json::to_vec(view).map_err(|e| ApiError::Storage(e.to_string()))?;
    Ok(json(status, body))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeysView {
    /// The id of the key that seals.
    sealing: KeyId,
    /// The ring's keys in order, then the keys stored records name that the ring lacks.
    keys: Vec<KeyView>,
    /// Records that name no key and open with none of the ring's.
    unreadable: usize,
    /// What a re-seal did.
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    resealed: Option<Resealed>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyView {
    id: KeyId,
    records: usize,
    in_ring: bool,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Resealed {
    /// Records looked at.
    scanned: usize,
    /// Records sealed again with the sealing key.
    resealed: usize,
    /// Records sealed by keys the ring lacks, left as they are.
    missing: Vec<Missing>,
    #[serde(skip)]
    unreadable: usize,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Missing {
    uuid: Uuid,
    key_id: KeyId,
}

impl KeysView {
    fn of(state: &State, counts: &KeyCounts, resealed: Option<Resealed>) -> KeysView {
        let ring = state.store.keyring();
        let mut keys: Vec<KeyView> = ring
            .ids()
            .map(|id| KeyView { id, records: counts.records.get(&id).copied().unwrap_or(0), in_ring: true })
            .collect();
        for (&id, &records) in &counts.records {
            if !ring.ids().any(|held| held == id) {
                keys.push(KeyView { id, records, in_ring: false });
            }
        }
        KeysView { sealing: ring.sealing(), keys, unreadable: counts.unreadable, resealed }
    }
}
