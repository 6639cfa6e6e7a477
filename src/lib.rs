//! recast: an HTTP middleware that calls upstream JSON APIs and reshapes their answers by stored
//! mapping rules. See `ARCHITECTURE.md` for the map of modules and their invariants.

// `unsafe` is allowed in two modules only: the JSON writer (`json::write`) and the vector
// kernels of the structural index (`json::simd`).
#![deny(unsafe_code)]

pub mod cache;
pub mod callers;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod exec;
pub mod expr;
pub mod flight;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod hex;
pub(crate) mod http1;
pub mod json;
pub mod logging;
pub mod metrics;
pub mod plan;
pub mod policy;
pub mod route;
pub mod routes_file;
pub mod rules;
pub mod secrets;
pub mod server;
pub mod storage;
pub mod store;
pub mod suggest;
pub mod table;
pub mod tasks;
pub mod telemetry;
pub mod trace_context;
pub mod upstream;
pub mod workers;
