//! Typed, layered configuration (defaults → TOML → `RUNYARD_*` env).

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::auth::Tokens;
use crate::model::Params;

/// Everything `runyard-allocator` can be told.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The event log: `RUNYARD_NATS_URL` and `RUNYARD_NAMESPACE`.
    pub bus: runyard_config::Bus,
    /// The projection job-tracker writes: `RUNYARD_DATABASE_URL`.
    pub database: runyard_config::Database,
    /// `RUNYARD_ALLOCATOR_LISTEN`: gRPC.
    pub allocator_listen: SocketAddr,
    /// `RUNYARD_ALLOCATOR_HTTP_LISTEN`: gantry-compatible HTTP and `/metrics`.
    pub allocator_http_listen: SocketAddr,
    /// `RUNYARD_ALLOCATOR_PROTECTED_REFS`: comma-separated refs whose jobs
    /// train the model (pull requests cannot poison it).
    pub allocator_protected_refs: String,
    /// `RUNYARD_ALLOCATOR_PUBLISH_ALLOCATIONS`: publish every answer as an
    /// `AllocationIssued` event.
    pub allocator_publish_allocations: bool,
    /// `RUNYARD_ALLOCATOR_EVENTS_PER_SECOND`: `AllocationIssued` events
    /// published per client (token, else address) per second; answers past
    /// it are served but not published (0 = no limit).
    pub allocator_events_per_second: u32,
    /// `RUNYARD_ALLOCATOR_EVENTS_BURST`: how many a client may have
    /// published at once before the rate applies.
    pub allocator_events_burst: u32,
    /// `RUNYARD_ALLOCATOR_MAX_BATCH`: most requests in one `RecommendBatch`.
    pub allocator_max_batch: usize,
    /// `RUNYARD_ALLOCATOR_TARGET_OOM`: the share of first attempts the
    /// operator accepts to see OOM-killed (0 < t < 0.5); the model's
    /// `target_oom`.
    pub allocator_target_oom: f64,
    /// `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY`: `GET /v1/allocation` answers
    /// without a token while tokens are set (pipelines that cannot send
    /// headers); every other call still needs one.
    pub allocator_anonymous_gantry: bool,
    /// `RUNYARD_ALLOCATOR_MAX_IN_FLIGHT`: `Allocator` gRPC calls handled at
    /// once; one more is answered `RESOURCE_EXHAUSTED` at once.
    pub allocator_max_in_flight: usize,
    /// `RUNYARD_ALLOCATOR_MAX_WORKLOADS`: most workloads the model keeps
    /// state for (the model's `max_workloads`); the least recently observed
    /// are forgotten past it.
    pub allocator_max_workloads: usize,
    /// `RUNYARD_ALLOCATOR_HISTORY_DAYS`: days of usage samples loaded at
    /// start (0 = all of them).
    pub allocator_history_days: u32,
    /// The bearer tokens accepted (`RUNYARD_ALLOCATOR_TOKENS` or
    /// `RUNYARD_ALLOCATOR_TOKENS_FILE`, read from the environment only:
    /// never from the TOML file, never serialized); none → anonymous.
    #[serde(skip)]
    pub allocator_tokens: Tokens,
    /// `RUNYARD_ALLOCATOR_TLS_CERT`, `_KEY` and `_CLIENT_CA`: both listeners
    /// speak TLS; with `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY` on,
    /// `GET /v1/allocation` is answered without a client certificate.
    pub tls: runyard_config::Tls,
    /// The recommendation maths (`[model]` in the TOML file;
    /// `model.target_oom` is taken from `allocator_target_oom`).
    pub model: Params,
    /// `RUNYARD_INSECURE_DEV=1`: start with weak tokens (a WARN names
    /// them); from the environment only, never the TOML file.
    #[serde(skip)]
    pub insecure_dev: bool,
}

/// Every field under its key, URLs with their credentials redacted (by
/// [`runyard_config::redact`]):
/// a logged or printed configuration shows no password or token.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured, so a new field cannot be left out unseen.
        let Self {
            bus,
            database,
            allocator_listen,
            allocator_http_listen,
            allocator_protected_refs,
            allocator_publish_allocations,
            allocator_events_per_second,
            allocator_events_burst,
            allocator_max_batch,
            allocator_target_oom,
            allocator_anonymous_gantry,
            allocator_max_in_flight,
            allocator_max_workloads,
            allocator_history_days,
            allocator_tokens,
            tls,
            model,
            insecure_dev,
        } = self;
        let mut d = f.debug_struct("Config");
        bus.show(&mut d);
        database.show(&mut d);
        tls.show(&mut d, TLS_PREFIX);
        d.field("allocator_listen", allocator_listen)
            .field("allocator_http_listen", allocator_http_listen)
            .field("allocator_protected_refs", allocator_protected_refs)
            .field(
                "allocator_publish_allocations",
                allocator_publish_allocations,
            )
            .field("allocator_events_per_second", allocator_events_per_second)
            .field("allocator_events_burst", allocator_events_burst)
            .field("allocator_max_batch", allocator_max_batch)
            .field("allocator_target_oom", allocator_target_oom)
            .field("allocator_anonymous_gantry", allocator_anonymous_gantry)
            .field("allocator_max_in_flight", allocator_max_in_flight)
            .field("allocator_max_workloads", allocator_max_workloads)
            .field("allocator_history_days", allocator_history_days)
            .field("allocator_tokens", allocator_tokens)
            .field("model", model)
            .field("insecure_dev", insecure_dev)
            .finish()
    }
}

/// The keys of the listener's TLS settings start with this.
const TLS_PREFIX: &str = "allocator_tls_";

impl runyard_config::Settings for Config {
    fn flat() -> Vec<runyard_config::Flat> {
        vec![
            runyard_config::Bus::flat(),
            runyard_config::Database::flat(),
            runyard_config::Tls::flat(TLS_PREFIX),
        ]
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bus: runyard_config::Bus::default(),
            database: runyard_config::Database::default(),
            allocator_listen: SocketAddr::from(([0, 0, 0, 0], 50051)),
            allocator_http_listen: SocketAddr::from(([0, 0, 0, 0], 8081)),
            allocator_protected_refs: "develop,main,master".into(),
            allocator_publish_allocations: true,
            allocator_events_per_second: 100,
            allocator_events_burst: 10_000,
            allocator_max_batch: 10_000,
            allocator_target_oom: 0.03,
            allocator_anonymous_gantry: false,
            allocator_max_in_flight: 1024,
            allocator_max_workloads: 200_000,
            allocator_history_days: 180,
            allocator_tokens: Tokens::default(),
            tls: runyard_config::Tls::default(),
            model: Params::default(),
            insecure_dev: false,
        }
    }
}

impl Config {
    /// Loads defaults, then `file` (TOML) if given, then the environment,
    /// and the accepted tokens from the environment; refuses a value of the
    /// wrong type, a target OOM rate outside (0, 0.5), an in-flight limit of
    /// 0 and an unusable token setting, naming the variable.
    pub fn load(file: Option<&Path>) -> Result<Self, Box<figment::Error>> {
        let mut config: Self = runyard_config::load(file)?;
        let refuse = |e: String| Box::new(figment::Error::from(e));
        config
            .apply_target_oom()
            .map_err(|e| refuse(e.to_string()))?;
        if config.allocator_max_in_flight == 0 {
            return Err(refuse(
                "RUNYARD_ALLOCATOR_MAX_IN_FLIGHT: 0 would refuse every call; at least 1".into(),
            ));
        }
        if config.allocator_max_workloads == 0 {
            return Err(refuse(
                "RUNYARD_ALLOCATOR_MAX_WORKLOADS: 0 would keep no history; at least 1".into(),
            ));
        }
        config.model.max_workloads = config.allocator_max_workloads;
        config.allocator_tokens =
            crate::auth::tokens_from_env().map_err(|e| refuse(e.to_string()))?;
        config.insecure_dev =
            runyard_config::secrets::insecure_dev_from_env().map_err(|e| refuse(e.to_string()))?;
        Ok(config)
    }

    /// Refuses an empty, short or placeholder token among those accepted
    /// (none at all is anonymous, with its own WARN), unless
    /// `insecure_dev` ([`runyard_config::secrets::enforce`]).
    pub fn check_secrets(&self) -> Result<(), runyard_config::secrets::SecretError> {
        runyard_config::secrets::enforce(
            [],
            self.allocator_tokens.weak().to_vec(),
            self.insecure_dev,
        )
        .map(drop)
    }

    /// Checks `allocator_target_oom` and hands it to the model.
    pub fn apply_target_oom(&mut self) -> Result<(), runyard_events::FieldError> {
        let t = self.allocator_target_oom;
        if !(t.is_finite() && t > 0.0 && t < 0.5) {
            return Err(runyard_events::FieldError::new(
                "RUNYARD_ALLOCATOR_TARGET_OOM",
                format!("{t} is not a fraction between 0 and 0.5 (exclusive), e.g. 0.03"),
            ));
        }
        self.model.target_oom = t;
        Ok(())
    }

    /// The protected refs as a list.
    pub fn protected_refs(&self) -> Vec<String> {
        self.allocator_protected_refs
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn debug_shows_no_secret() {
        let secret = "a1f0c9d27be84e53a1f0c9d27be84e53";
        let config = Config {
            bus: runyard_config::Bus {
                nats_url: format!("nats://allocator:{secret}@nats:4222"),
                ..Default::default()
            },
            database: runyard_config::Database {
                url: format!("postgres://runyard:{secret}@db:5432/runyard"),
            },
            allocator_tokens: crate::auth::tokens([secret]),
            ..Config::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains(secret), "{shown}");
        // The rest still shows, the URLs with their hosts.
        assert!(shown.contains("nats://allocator:***@nats:4222"), "{shown}");
        assert!(shown.contains("allocator_max_batch: 10000"), "{shown}");
    }

    // As `openssl rand -hex 32` makes them (weak tokens are refused).
    const ONE: &str = "7fbe67a0414ee367909a37b91ebeef2669b40986716931a2b6c530484dbf8459";
    const TWO: &str = "939f7d9e1cecd18b2913224ac516b8d77e8457f4ed37166b8a591ad06311ab24";

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn weak_tokens_refuse_to_start_unless_insecure_dev_is_1() {
        figment::Jail::expect_with(|jail| {
            for (tokens, why) in [
                (
                    "change-me",
                    "RUNYARD_ALLOCATOR_TOKENS item 1 is a known placeholder",
                ),
                (
                    "k7Q2mZ9xR4vB",
                    "RUNYARD_ALLOCATOR_TOKENS item 1 is 12 bytes long",
                ),
            ] {
                jail.set_env("RUNYARD_ALLOCATOR_TOKENS", format!("{tokens},{ONE}"));
                let c = Config::load(None).map_err(|e| e.to_string())?;
                let e = c.check_secrets().err().ok_or("accepted")?.to_string();
                assert!(e.contains(why) && e.contains("openssl rand -hex 32"), "{e}");
                assert!(!e.contains(tokens), "{e}");
            }
            jail.set_env("RUNYARD_INSECURE_DEV", "1");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert!(c.insecure_dev);
            c.check_secrets().map_err(|e| e.to_string())?;
            jail.set_env("RUNYARD_INSECURE_DEV", "on");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.starts_with("RUNYARD_INSECURE_DEV:"), "{e}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn contract_defaults_and_env_override() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.allocator_listen.to_string(), "0.0.0.0:50051");
            assert_eq!(c.allocator_http_listen.to_string(), "0.0.0.0:8081");
            assert_eq!(c.protected_refs(), ["develop", "main", "master"]);
            jail.set_env("RUNYARD_ALLOCATOR_PROTECTED_REFS", "trunk, release ");
            jail.set_env("RUNYARD_USAGE_TOKEN", "another service's");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.protected_refs(), ["trunk", "release"]);
            assert_eq!(c.model.target_oom, 0.03);
            jail.set_env("RUNYARD_ALLOCATOR_TARGET_OOM", "0.05");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!((c.allocator_target_oom, c.model.target_oom), (0.05, 0.05));
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn a_target_oom_outside_zero_to_a_half_refuses_to_start() {
        figment::Jail::expect_with(|jail| {
            for bad in ["0", "0.5", "-0.01", "1", "3"] {
                jail.set_env("RUNYARD_ALLOCATOR_TARGET_OOM", bad);
                let e = Config::load(None).err().ok_or("accepted")?.to_string();
                assert!(e.contains("RUNYARD_ALLOCATOR_TARGET_OOM"), "{bad}: {e}");
            }
            jail.set_env("RUNYARD_ALLOCATOR_TARGET_OOM", "three percent");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.to_lowercase().contains("target_oom"), "{e}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn gantry_and_in_flight_settings_and_their_errors_name_the_variable() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert!(!c.allocator_anonymous_gantry);
            assert_eq!(c.allocator_max_in_flight, 1024);
            assert_eq!(c.model.max_workloads, 200_000);
            assert_eq!(c.allocator_history_days, 180);
            assert!(c.allocator_tokens.is_empty());
            jail.set_env("RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY", "true");
            jail.set_env("RUNYARD_ALLOCATOR_MAX_IN_FLIGHT", "8");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert!(c.allocator_anonymous_gantry);
            assert_eq!(c.allocator_max_in_flight, 8);
            jail.set_env("RUNYARD_ALLOCATOR_MAX_WORKLOADS", "5000");
            jail.set_env("RUNYARD_ALLOCATOR_HISTORY_DAYS", "30");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.model.max_workloads, 5000);
            assert_eq!(c.allocator_history_days, 30);
            jail.set_env("RUNYARD_ALLOCATOR_MAX_WORKLOADS", "0");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(e.starts_with("RUNYARD_ALLOCATOR_MAX_WORKLOADS:"), "{e}");
            jail.set_env("RUNYARD_ALLOCATOR_MAX_WORKLOADS", "5000");
            for bad in ["yes", "maybe", "2"] {
                jail.set_env("RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY", bad);
                let e = Config::load(None).err().ok_or("accepted")?.to_string();
                assert!(
                    e.starts_with("RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY:"),
                    "{bad}: {e}"
                );
            }
            jail.set_env("RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY", "false");
            for bad in ["0", "many"] {
                jail.set_env("RUNYARD_ALLOCATOR_MAX_IN_FLIGHT", bad);
                let e = Config::load(None).err().ok_or("accepted")?.to_string();
                assert!(
                    e.starts_with("RUNYARD_ALLOCATOR_MAX_IN_FLIGHT:"),
                    "{bad}: {e}"
                );
            }
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn token_settings_that_cannot_work_refuse_to_start() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("RUNYARD_ALLOCATOR_TOKENS", format!("{ONE},{TWO}"));
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.allocator_tokens.len(), 2);
            assert!(
                c.allocator_tokens
                    .check(Some(format!("Bearer {TWO}").as_bytes()))
                    .is_ok()
            );
            c.check_secrets().map_err(|e| e.to_string())?;
            // The configuration's Debug (logged on errors) shows no token.
            assert!(!format!("{c:?}").contains(&ONE[..8]));

            jail.create_file("tokens", "# nothing yet\n\n")?;
            jail.set_env("RUNYARD_ALLOCATOR_TOKENS_FILE", "tokens");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(
                e.contains("RUNYARD_ALLOCATOR_TOKENS ")
                    && e.contains("RUNYARD_ALLOCATOR_TOKENS_FILE"),
                "both set: {e}"
            );
            assert!(!e.contains(&ONE[..8]), "{e}");

            // Set but empty: an empty list, refused.
            jail.set_env("RUNYARD_ALLOCATOR_TOKENS_FILE", "");
            jail.set_env("RUNYARD_ALLOCATOR_TOKENS", "");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(
                e.starts_with("RUNYARD_ALLOCATOR_TOKENS:"),
                "empty list: {e}"
            );
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.create_file("tokens", "# nothing yet\n\n")?;
            jail.set_env("RUNYARD_ALLOCATOR_TOKENS_FILE", "tokens");
            let e = Config::load(None).err().ok_or("accepted")?.to_string();
            assert!(
                e.starts_with("RUNYARD_ALLOCATOR_TOKENS_FILE:"),
                "empty file: {e}"
            );

            jail.create_file("tokens", &format!("{ONE}\n# next\n{TWO}\n"))?;
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.allocator_tokens.len(), 2);
            // A numeric token is a token, not a number.
            let numeric = "1234567890".repeat(4);
            jail.set_env("RUNYARD_ALLOCATOR_TOKENS_FILE", "");
            jail.set_env("RUNYARD_ALLOCATOR_TOKENS", &numeric);
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert!(
                c.allocator_tokens
                    .check(Some(format!("Bearer {numeric}").as_bytes()))
                    .is_ok()
            );
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn tls_files_come_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.tls.cert, None);
            jail.set_env("RUNYARD_ALLOCATOR_TLS_CERT", "/tls/tls.crt");
            jail.set_env("RUNYARD_ALLOCATOR_TLS_KEY", "/tls/tls.key");
            jail.set_env("RUNYARD_ALLOCATOR_TLS_CLIENT_CA", "/tls/ca.crt");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.tls.cert, Some(PathBuf::from("/tls/tls.crt")));
            assert_eq!(c.tls.key, Some(PathBuf::from("/tls/tls.key")));
            assert_eq!(c.tls.client_ca, Some(PathBuf::from("/tls/ca.crt")));
            Ok(())
        });
    }
}
