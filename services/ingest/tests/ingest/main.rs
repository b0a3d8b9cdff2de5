//! ingest's integration tests, one binary against a real nats-server: the
//! routes and answers of the ingest contract, the binary's logs, and usage
//! reports signed with OIDC identity tokens.

mod contract;
mod logs;
mod oidc;
