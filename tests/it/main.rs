//! recast's integration tests: one binary, one module per area.

#[path = "../../benches/common/baseline.rs"]
mod baseline;
#[path = "../../benches/common/ordered_json.rs"]
mod ordered_json;
mod process;
mod support;

mod architecture;
mod binary;
mod bounds;
mod breaker;
mod cache;
mod caller_value;
mod callers;
mod cli;
mod cluster;
mod composition;
mod compression;
mod config_files;
mod conformance;
mod crash;
mod edges;
mod expressions;
mod faults;
mod fuzz_corpus;
mod h2_abuse;
mod http2;
mod https;
mod json_suite;
mod keys;
mod lane;
mod limits;
mod nginx;
mod oauth;
mod observability;
mod openapi;
mod outbound;
mod pages;
mod playground;
mod postgres;
mod preview;
mod properties;
mod rate_limit;
mod readme;
mod retry;
mod routes;
mod rules_doc;
mod secrets;
mod server;
mod tls;
mod tokens;
mod traces;
mod wire;
