//! runyard-bus's integration tests, one binary: each module is a concern
//! (NATS access, the consumer, publishing), against a real nats-server.

mod access;
mod consumer;
mod publish;
