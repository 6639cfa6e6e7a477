//! The database schema, created and migrated by recast itself. Migrations run in one transaction
//! that first takes an advisory lock, so nodes starting at once apply each migration once: the
//! others wait for the lock, then find it applied.

use tokio_postgres::Client;
use uuid::Uuid;

/// The advisory lock every node takes while migrating ("recast" in ASCII).
const MIGRATION_LOCK: i64 = 0x7265_6361_7374;

/// The migrations, in order; version N is `MIGRATIONS[N - 1]`. Never edit one that shipped:
/// add the next.
const MIGRATIONS: &[&str] = &[
    // 1: the counter row (with the database's epoch and the key check), and routes with their
    // revisions. A deleted route stays as a tombstone (`record` NULL) until it is pruned.
    "CREATE TABLE recast_meta (
         id smallint PRIMARY KEY CHECK (id = 1),
         epoch uuid NOT NULL,
         revision bigint NOT NULL,
         pruned_through bigint NOT NULL DEFAULT 0,
         key_check bytea
     );
     CREATE TABLE recast_routes (
         uuid uuid PRIMARY KEY,
         revision bigint NOT NULL,
         created_at bigint NOT NULL,
         updated_at bigint NOT NULL,
         record bytea,
         deleted_at timestamptz
     );
     CREATE UNIQUE INDEX recast_routes_by_revision ON recast_routes (revision);
     CREATE INDEX recast_routes_newest_first ON recast_routes (created_at DESC, uuid)
         WHERE record IS NOT NULL;",
    // 2: the history, a random id for the change each revision ends, so a node can tell the
    // history it followed from one a restore from a backup put in its place. Its first row, for
    // the counter as it stands, is written below. A history left behind by a schema dropped
    // without it belongs to revisions that are gone.
    "DROP TABLE IF EXISTS recast_history;
     CREATE TABLE recast_history (
         revision bigint PRIMARY KEY,
         change uuid NOT NULL,
         at timestamptz NOT NULL DEFAULT now()
     );",
    // 3: the nodes alive, each with the time it last said so (`nodes.rs`). A table left behind by
    // a schema dropped without it holds nothing worth keeping.
    "DROP TABLE IF EXISTS recast_nodes;
     CREATE TABLE recast_nodes (
         id uuid PRIMARY KEY,
         started_at timestamptz NOT NULL DEFAULT now(),
         seen_at timestamptz NOT NULL DEFAULT now()
     );",
    // 4: the ids of the keys each node's ring holds (comma-separated), published with its
    // heartbeat, so that a re-seal can tell whether every live node opens what it writes.
    "ALTER TABLE recast_nodes ADD COLUMN key_ids text NOT NULL DEFAULT '';",
    // 5: consumers and their keys' digests (SPEC §2.4), each change with the next number of its
    // own sequence; a deleted consumer keeps its row, without a record, so every node learns of
    // the deletion (`consumers.rs`). Consumers left behind by a schema dropped without them are
    // kept: they are what callers call with.
    "CREATE SEQUENCE IF NOT EXISTS recast_consumer_revisions;
     CREATE TABLE IF NOT EXISTS recast_consumers (
         name text PRIMARY KEY,
         revision bigint NOT NULL,
         record text
     );
     CREATE INDEX IF NOT EXISTS recast_consumers_by_revision ON recast_consumers (revision);",
    // 6: a route's `name` (SPEC §2.5), unique among the routes there are, so that two nodes
    // registering one name at once store one route. Routes stored before have none.
    "ALTER TABLE recast_routes ADD COLUMN IF NOT EXISTS name text;
     CREATE UNIQUE INDEX IF NOT EXISTS recast_routes_by_name ON recast_routes (name)
         WHERE record IS NOT NULL;",
];

/// Why the schema could not be made ready.
pub(super) enum SchemaError {
    Database(tokio_postgres::Error),
    /// The database holds a newer schema than this recast knows.
    TooNew(i32),
}

impl From<tokio_postgres::Error> for SchemaError {
    fn from(e: tokio_postgres::Error) -> SchemaError {
        SchemaError::Database(e)
    }
}

/// Creates the schema or brings it up to date. A new schema gets a new epoch, so nodes that
/// followed an earlier database notice it was recreated.
pub(super) async fn migrate(client: &mut Client) -> Result<(), SchemaError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS recast_schema (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let current: i32 = tx.query_one("SELECT coalesce(max(version), 0) FROM recast_schema", &[]).await?.get(0);
    let known = MIGRATIONS.len() as i32;
    if current > known {
        return Err(SchemaError::TooNew(current));
    }
    for version in current + 1..=known {
        tx.batch_execute(MIGRATIONS[version as usize - 1]).await?;
        match version {
            1 => {
                tx.execute(
                    "INSERT INTO recast_meta (id, epoch, revision) VALUES (1, $1, 0)",
                    &[&Uuid::new_v4()],
                )
                .await?;
            }
            // The counter's revision gets its history row, so there is always one where the
            // database stands (nodes that followed it before then load everything once).
            2 => {
                tx.execute(
                    "INSERT INTO recast_history (revision, change) SELECT revision, $1 FROM recast_meta WHERE id = 1",
                    &[&Uuid::new_v4()],
                )
                .await?;
            }
            _ => {}
        }
        tx.execute("INSERT INTO recast_schema (version) VALUES ($1)", &[&version]).await?;
        tracing::info!(version, "database schema migrated");
    }
    tx.commit().await?;
    Ok(())
}

/// The schema version this recast writes.
pub(super) fn latest() -> usize {
    MIGRATIONS.len()
}
