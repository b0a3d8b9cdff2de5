//! The scaler's integration tests, one binary. Most run the scaler
//! in-process against a real nats-server (a namespace per test), a fake
//! GitHub/GitLab on loopback and real runner processes (`support`), some
//! with the fake garm provider (`fake`); the OOM retry loop and the
//! end-to-end trace run every service as a real process (`retry`).

mod allocator_token;
mod budgets;
mod credentials;
mod fake;
mod gitlab;
mod groups;
mod lifecycle;
mod metadata;
mod oom_retry;
mod provider;
mod queue;
mod reconcile;
mod retry;
mod scaleset;
mod scaling;
mod support;
mod trace;
