//! The CLI's integration tests, one binary: each module is a concern
//! (NATS logins, `provider check`, the commands against a running stack,
//! scale-set pools in `pools` and `doctor`, the dev stack's address
//! file).

mod nats_access;
mod provider_check;
mod savings;
mod scale_set;
mod stack;
mod stack_env;
