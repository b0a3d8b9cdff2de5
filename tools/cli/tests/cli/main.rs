//! The CLI's integration tests, one binary: each module is a concern
//! (NATS logins, `provider check`, the commands against a running stack).

mod nats_access;
mod provider_check;
mod stack;
