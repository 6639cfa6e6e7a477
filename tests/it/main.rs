//! recast's integration tests: one binary, one module per area.

#[path = "../../benches/common/baseline.rs"]
mod baseline;
mod support;

mod conformance;
mod preview;
mod properties;
mod server;
