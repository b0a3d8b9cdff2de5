//! The allocator's integration tests, one binary against a real
//! nats-server and a real Postgres: the allocator with ingest and the
//! job-tracker, bearer tokens, gRPC reflection, the binary at start, TLS,
//! and property tests of `parse_spec`.

mod auth;
mod prop_spec;
mod reflection;
mod stack;
mod start;
mod tls;
