//! Consumers in the database (SPEC §2.4): one row per consumer, its record as JSON text (its
//! keys are digests), and the number of its last change from a sequence of their own. A deleted
//! consumer keeps its row without a record, so a node that reads the changes after the number it
//! holds learns of deletions too. Every node reads them every `RECAST_SYNC_INTERVAL_MS`
//! (`server/sync.rs`), so a new, changed or revoked key is honoured or refused on every node
//! within that interval and a statement's time.

use super::{Database, DbError};
use crate::callers::StoredConsumer;

/// A consumer's change: its name, the number of the change, and the record (`None`: deleted).
pub struct ConsumerChange {
    pub name: String,
    pub revision: i64,
    pub consumer: Option<StoredConsumer>,
}

/// Changes read in one statement.
const CHANGES_PAGE: i64 = 1000;

fn record(consumer: &StoredConsumer) -> Result<String, DbError> {
    serde_json::to_string(consumer).map_err(|e| DbError::Failed(e.to_string()))
}

fn read(name: &str, text: Option<String>) -> Result<Option<StoredConsumer>, DbError> {
    text.map(|text| {
        serde_json::from_str(&text)
            .map_err(|e| DbError::Failed(format!("the stored consumer `{name}` cannot be read: {e}")))
    })
    .transpose()
}

impl Database {
    /// Stores `consumer` in place of what was stored of it.
    pub(crate) async fn put_consumer(&self, consumer: &StoredConsumer) -> Result<(), DbError> {
        let client = self.pooled().await?;
        let record = record(consumer)?;
        self.within(client.execute(
            "INSERT INTO recast_consumers (name, revision, record)
             VALUES ($1, nextval('recast_consumer_revisions'), $2)
             ON CONFLICT (name) DO UPDATE SET revision = excluded.revision, record = excluded.record",
            &[&consumer.name, &record],
        ))
        .await?;
        Ok(())
    }

    /// Deletes a consumer (its row stays, without a record); whether there was one.
    pub(crate) async fn delete_consumer(&self, name: &str) -> Result<bool, DbError> {
        let client = self.pooled().await?;
        let deleted = self
            .within(client.execute(
                "UPDATE recast_consumers SET revision = nextval('recast_consumer_revisions'), record = NULL
                 WHERE name = $1 AND record IS NOT NULL",
                &[&name],
            ))
            .await?;
        Ok(deleted > 0)
    }

    /// Every consumer there is.
    pub(crate) async fn live_consumers(&self) -> Result<Vec<StoredConsumer>, DbError> {
        let client = self.pooled().await?;
        let rows = self
            .within(client.query(
                "SELECT name, record FROM recast_consumers WHERE record IS NOT NULL ORDER BY name",
                &[],
            ))
            .await?;
        let mut consumers = Vec::with_capacity(rows.len());
        for row in rows {
            let name: String = row.get(0);
            if let Some(consumer) = read(&name, row.get(1))? {
                consumers.push(consumer);
            }
        }
        Ok(consumers)
    }

    /// The changes after the one numbered `after`, oldest first, a page at a time.
    pub async fn consumer_changes(&self, after: i64) -> Result<Vec<ConsumerChange>, DbError> {
        let client = self.pooled().await?;
        let rows = self
            .within(client.query(
                "SELECT name, revision, record FROM recast_consumers WHERE revision > $1 ORDER BY revision LIMIT $2",
                &[&after, &CHANGES_PAGE],
            ))
            .await?;
        let mut changes = Vec::with_capacity(rows.len());
        for row in rows {
            let name: String = row.get(0);
            let consumer = read(&name, row.get(2))?;
            changes.push(ConsumerChange { revision: row.get(1), consumer, name });
        }
        Ok(changes)
    }
}
