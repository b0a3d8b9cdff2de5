//! The settings more than one service reads, declared once. Each service's
//! `Config` holds them as sections whose fields are top-level keys
//! ([`crate::Settings::flat`]), so the variables and the file's keys are
//! the same for every service: `RUNYARD_NATS_URL`, `RUNYARD_NAMESPACE`,
//! `RUNYARD_DATABASE_URL`, `RUNYARD_STREAM_REPLICAS`, and a listener's
//! `RUNYARD_<SERVICE>_TLS_CERT`, `_KEY` and `_CLIENT_CA`.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Flat;
use crate::redact;

/// The event log every service reads or writes.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bus {
    /// `RUNYARD_NATS_URL`: the NATS server, or a comma-separated list of a
    /// cluster's; credentials may be in the URL (never shown).
    pub nats_url: String,
    /// `RUNYARD_NAMESPACE`: the prefix of every stream, consumer and
    /// bucket, so stacks can share a NATS.
    pub namespace: String,
}

impl Bus {
    /// The section `bus`, read as `nats_url` and `namespace`.
    pub fn flat() -> Flat {
        Flat::of::<Self>("bus", "")
    }

    /// Adds the settings to a service's `Debug` under their keys, the URL
    /// redacted.
    pub fn show(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        d.field("nats_url", &redact::urls(&self.nats_url))
            .field("namespace", &self.namespace);
    }
}

impl Default for Bus {
    fn default() -> Self {
        Self {
            nats_url: "nats://127.0.0.1:4222".into(),
            namespace: "runyard".into(),
        }
    }
}

/// Credentials redacted.
impl fmt::Debug for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Bus");
        self.show(&mut d);
        d.finish()
    }
}

/// The projection's Postgres database.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Database {
    /// `RUNYARD_DATABASE_URL`: `postgres://user:password@host:port/name`
    /// (never shown with its password).
    pub url: String,
}

impl Database {
    /// The section `database`, read as `database_url`.
    pub fn flat() -> Flat {
        Flat::of::<Self>("database", "database_")
    }

    /// Adds the setting to a service's `Debug` under its key, redacted.
    pub fn show(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        d.field("database_url", &redact::url(&self.url));
    }
}

impl Default for Database {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/runyard".into(),
        }
    }
}

/// Credentials redacted.
impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Database");
        self.show(&mut d);
        d.finish()
    }
}

/// How the streams and buckets a service creates are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Streams {
    /// `RUNYARD_STREAM_REPLICAS`: the replicas of each (3 on a 3-node NATS
    /// cluster).
    pub replicas: usize,
}

impl Streams {
    /// The section `streams`, read as `stream_replicas`.
    pub fn flat() -> Flat {
        Flat::of::<Self>("streams", "stream_")
    }

    /// Adds the setting to a service's `Debug` under its key.
    pub fn show(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        d.field("stream_replicas", &self.replicas);
    }
}

impl Default for Streams {
    fn default() -> Self {
        Self { replicas: 1 }
    }
}

/// A listener's TLS: with a certificate and its key it speaks TLS (the
/// files are read again when they change); with a client CA too, clients
/// need a certificate that CA signed (mTLS).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// `RUNYARD_<SERVICE>_TLS_CERT`: the PEM certificate chain.
    pub cert: Option<PathBuf>,
    /// `RUNYARD_<SERVICE>_TLS_KEY`: its private key.
    pub key: Option<PathBuf>,
    /// `RUNYARD_<SERVICE>_TLS_CLIENT_CA`: the CA client certificates must
    /// chain to.
    pub client_ca: Option<PathBuf>,
}

impl Tls {
    /// The section `tls`, read as `<prefix>cert`, `<prefix>key` and
    /// `<prefix>client_ca` (`prefix` is `tracker_tls_` for the
    /// job-tracker).
    pub fn flat(prefix: &'static str) -> Flat {
        Flat::of::<Self>("tls", prefix)
    }

    /// Adds the settings to a service's `Debug` under their keys, with the
    /// same `prefix` as [`Tls::flat`].
    pub fn show(&self, d: &mut fmt::DebugStruct<'_, '_>, prefix: &str) {
        d.field(&format!("{prefix}cert"), &self.cert)
            .field(&format!("{prefix}key"), &self.key)
            .field(&format!("{prefix}client_ca"), &self.client_ca);
    }
}
