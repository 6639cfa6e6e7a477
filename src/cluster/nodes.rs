//! The nodes alive: each node keeps a row of `recast_nodes` with the time it last said it is
//! alive (the database's clock, so the nodes' clocks do not matter), and counts the rows seen
//! lately. Outbound rate limits are shared by that count (`docs/upstreams.md`). The row also
//! names the keys of the node's ring, the sealing one first, which a re-seal checks
//! (`store.rs`).

use std::time::Duration;

use uuid::Uuid;

use super::{Database, DbError};

/// How long the row of a node that stopped without saying so is kept.
const FORGOTTEN_AFTER: &str = "1 hour";

impl Database {
    /// Says that `node` is alive now; answers how many nodes said so within `alive`, this one
    /// included.
    pub async fn heartbeat(&self, node: Uuid, alive: Duration) -> Result<u32, DbError> {
        self.alive_ms.store(alive.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
        let client = self.pooled().await?;
        let keys = self.key.ids().map(|id| id.to_string()).collect::<Vec<_>>().join(",");
        self.within(client.execute(
            "INSERT INTO recast_nodes (id, key_ids) VALUES ($1, $2)
             ON CONFLICT (id) DO UPDATE SET seen_at = now(), key_ids = excluded.key_ids",
            &[&node, &keys],
        ))
        .await?;
        let row = self
            .within(client.query_one(
                "SELECT count(*) FROM recast_nodes WHERE seen_at > now() - make_interval(secs => $1)",
                &[&alive.as_secs_f64()],
            ))
            .await?;
        let alive: i64 = row.get(0);
        self.within(client.execute(
            &format!("DELETE FROM recast_nodes WHERE seen_at < now() - interval '{FORGOTTEN_AFTER}'"),
            &[],
        ))
        .await?;
        Ok(u32::try_from(alive).unwrap_or(u32::MAX).max(1))
    }

    /// The live nodes (heard from within the heartbeat's `alive`, or a minute before the first
    /// heartbeat) that do not seal with the key `id`: the first of their ring's keys is another.
    pub(super) async fn nodes_sealing_otherwise(
        &self,
        id: crate::secrets::KeyId,
    ) -> Result<Vec<Uuid>, DbError> {
        let alive = match self.alive_ms.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Duration::from_secs(60),
            ms => Duration::from_millis(ms),
        };
        let client = self.pooled().await?;
        let rows = self
            .within(client.query(
                "SELECT id FROM recast_nodes
                 WHERE seen_at > now() - make_interval(secs => $1) AND split_part(key_ids, ',', 1) <> $2",
                &[&alive.as_secs_f64(), &id.to_string()],
            ))
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Says that `node` stops: the others take its share at their next heartbeat.
    pub async fn leave(&self, node: Uuid) -> Result<(), DbError> {
        let client = self.pooled().await?;
        self.within(client.execute("DELETE FROM recast_nodes WHERE id = $1", &[&node])).await?;
        Ok(())
    }
}
