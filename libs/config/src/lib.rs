//! How every runyard service is configured, the same way: [`load`] reads a
//! service's typed settings (defaults, then a TOML file, then `RUNYARD_*`
//! environment variables), and [`secrets`] reads and checks the secrets the
//! operator chooses (the one `*_FILE` reader, and the refusal of weak
//! values at start).
//!
//! The variables a service reads are its settings' own field names
//! ([`env_keys`]), upper-cased after `RUNYARD_`: a field added to a
//! service's `Config` can be set from the environment at once, with no list
//! to keep, and other services' variables in the same environment are left
//! alone.

use std::path::Path;

use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Serialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

pub mod redact;
pub mod secrets;
mod shared;

pub use shared::{Bus, Database, Streams, Tls};

/// The prefix of every variable a service reads.
pub const ENV_PREFIX: &str = "RUNYARD_";

/// A service's settings, as [`load`] reads them.
pub trait Settings: Serialize + DeserializeOwned + Default {
    /// The sections whose fields are read as top-level keys, in the file
    /// and in the environment: the shared [`Bus`], [`Database`] and
    /// [`Streams`], and a listener's [`Tls`] under its service's prefix
    /// (`tracker_tls_cert` for the field `tls.cert`).
    fn flat() -> Vec<Flat> {
        Vec::new()
    }
}

/// A section of a service's settings whose fields are top-level keys
/// named `<prefix><field>`.
#[derive(Debug, Clone, Copy)]
pub struct Flat {
    section: &'static str,
    prefix: &'static str,
    fields: &'static [&'static str],
}

impl Flat {
    /// The section `section` (the settings' field holding an `S`), its
    /// fields read as `<prefix><field>`.
    pub fn of<'de, S: de::Deserialize<'de>>(section: &'static str, prefix: &'static str) -> Self {
        Self {
            section,
            prefix,
            fields: fields::<S>(),
        }
    }
}

/// A setting the environment may set: its key, which names its variable
/// (`nats_url`, `tracker_tls_cert`), and where the settings hold it
/// (`bus.nats_url`, `tls.cert`).
#[derive(Debug, Clone, PartialEq)]
struct Key {
    name: String,
    path: String,
}

/// Loads a service's typed configuration: `T::default()`, then the TOML
/// `file` if given, then `RUNYARD_<KEY>` for every key of [`env_keys`].
/// Unknown keys in the file are refused by the type's
/// `deny_unknown_fields`; a bad value set in the environment is refused
/// naming its variable (`RUNYARD_TRACKER_BATCH_SIZE: ...`), and one in the
/// file naming its key as the file spells it.
pub fn load<T: Settings>(file: Option<&Path>) -> Result<T, Box<figment::Error>> {
    let defaults = Figment::from(Serialized::defaults(T::default()));
    let flat = T::flat();
    let keys = settable::<T>(&defaults, &flat);
    let mut base = defaults.clone();
    if let Some(file) = file {
        base = base.merge(File {
            toml: Toml::file_exact(file),
            flat: &flat,
        });
    }
    // A setting without a default value (an unset `Option`, a secret) is
    // first given its variable's text; one that wants something else (a
    // number) is given the parsed value on the next round. One round per
    // such setting at most.
    let mut parsed: Vec<&str> = Vec::new();
    loop {
        let env = Environment {
            keys: &keys,
            defaults: &defaults,
            parsed: &parsed,
        };
        match base.clone().merge(env).extract() {
            Ok(config) => return Ok(config),
            Err(e) => {
                let path = e.path.join(".");
                let key = keys.iter().find(|k| k.path == path);
                let retry = matches!(e.kind, figment::error::Kind::InvalidType(..))
                    && from_environment(&e)
                    && no_default(&defaults, &path)
                    && !parsed.contains(&path.as_str());
                match key {
                    Some(k) if retry => parsed.push(&k.path),
                    _ => return Err(Box::new(as_spelled(e, key))),
                }
            }
        }
    }
}

/// The `RUNYARD_<KEY>` variables of `keys`. A setting whose default is a
/// string, or that has no default value, takes the variable's text as it
/// is, so a namespace, a name or a secret made of digits stays a string
/// (`RUNYARD_NAMESPACE=2026`); the others, and those in `parsed`, are
/// parsed as figment parses a variable (numbers, booleans, arrays).
struct Environment<'a> {
    keys: &'a [Key],
    defaults: &'a Figment,
    parsed: &'a [&'a str],
}

impl Provider for Environment<'_> {
    fn metadata(&self) -> Metadata {
        Metadata::named(format!("`{ENV_PREFIX}` environment variable(s)")).interpolater(
            |_: &Profile, keys: &[&str]| {
                format!("{ENV_PREFIX}{}", keys.join("_").to_ascii_uppercase())
            },
        )
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut dict = Dict::new();
        for key in self.keys {
            let var = format!("{ENV_PREFIX}{}", key.name.to_ascii_uppercase());
            let Some(text) = std::env::var_os(&var) else {
                continue;
            };
            let text = text
                .into_string()
                .map_err(|_| figment::Error::from(format!("{var}: not valid UTF-8")))?;
            let path = key.path.as_str();
            let as_text = match self.defaults.find_value(path) {
                Ok(Value::String(..)) => true,
                _ if no_default(self.defaults, path) => !self.parsed.contains(&path),
                _ => false,
            };
            let value = if as_text {
                Value::from(text)
            } else {
                text.parse::<Value>().unwrap_or_else(|never| match never {})
            };
            insert(&mut dict, path, value);
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// The TOML file, its flat sections' keys moved into their sections.
struct File<'a> {
    toml: figment::providers::Data<Toml>,
    flat: &'a [Flat],
}

impl Provider for File<'_> {
    fn metadata(&self) -> Metadata {
        self.toml.metadata()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut data = self.toml.data()?;
        for dict in data.values_mut() {
            for flat in self.flat {
                // The section's keys are top-level: a table of that name is
                // not one of the settings.
                if dict.contains_key(flat.section) {
                    let keys: Vec<String> = flat
                        .fields
                        .iter()
                        .map(|f| format!("{}{f}", flat.prefix))
                        .collect();
                    let mut e = figment::Error::from(format!(
                        "unknown field `{}`: its settings are top-level keys ({})",
                        flat.section,
                        keys.join(", ")
                    ));
                    e.metadata = Some(self.metadata());
                    return Err(e);
                }
                for field in flat.fields {
                    if let Some(value) = dict.remove(&format!("{}{field}", flat.prefix)) {
                        insert(dict, &format!("{}.{field}", flat.section), value);
                    }
                }
            }
        }
        Ok(data)
    }
}

/// Puts `value` at the dotted `path` of `dict` (one level of section at
/// most), making the section if it is not there.
fn insert(dict: &mut Dict, path: &str, value: Value) {
    match path.split_once('.') {
        None => {
            dict.insert(path.to_owned(), value);
        }
        Some((section, field)) => {
            let entry = dict
                .entry(section.to_owned())
                .or_insert_with(|| Value::from(Dict::new()));
            if let Value::Dict(_, inner) = entry {
                inner.insert(field.to_owned(), value);
            }
        }
    }
}

/// The keys of `T` that the environment may set: every field its
/// `Deserialize` reads (secrets the settings never serialize among them;
/// `#[serde(skip)]` fields are not read), except sections, the fields whose
/// default is a table, which only a file can give; and the fields of its
/// [`Settings::flat`] sections, named with their prefix.
pub fn env_keys<T: Settings>() -> Vec<String> {
    let defaults = Figment::from(Serialized::defaults(T::default()));
    settable::<T>(&defaults, &T::flat())
        .into_iter()
        .map(|k| k.name)
        .collect()
}

/// [`env_keys`] with `T`'s defaults already read.
fn settable<T: DeserializeOwned>(defaults: &Figment, flat: &[Flat]) -> Vec<Key> {
    let mut keys = Vec::new();
    for &field in fields::<T>() {
        if let Some(section) = flat.iter().find(|f| f.section == field) {
            keys.extend(section.fields.iter().map(|f| Key {
                name: format!("{}{f}", section.prefix),
                path: format!("{field}.{f}"),
            }));
        } else if !matches!(defaults.find_value(field), Ok(Value::Dict(..))) {
            keys.push(Key {
                name: field.to_owned(),
                path: field.to_owned(),
            });
        }
    }
    keys
}

/// The field names a struct's `Deserialize` asks for, as serde's derive
/// hands them to `deserialize_struct` (empty for anything but a struct).
pub fn fields<'de, T: de::Deserialize<'de>>() -> &'static [&'static str] {
    let mut names = Fields(&[]);
    // The deserializer always fails once it has the names: nothing is built.
    let _ = T::deserialize(&mut names);
    names.0
}

struct Fields(&'static [&'static str]);

impl<'de> Deserializer<'de> for &mut Fields {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = fields;
        Err(de::Error::custom("fields read"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// A figment error about a setting, as the operator spells it: a flat
/// section's key by its top-level name (`tracker_tls_cert`, not
/// `tls.cert`), and a variable set in the environment with its full name
/// in front (figment names the key alone).
fn as_spelled(mut e: figment::Error, key: Option<&Key>) -> figment::Error {
    let Some(key) = key else {
        return e;
    };
    e.path = vec![key.name.clone()];
    if from_environment(&e) {
        figment::Error::from(format!(
            "{ENV_PREFIX}{}: {e}",
            key.name.to_ascii_uppercase()
        ))
    } else {
        e
    }
}

/// Whether the setting at `path` has no default value (an unset `Option`,
/// or a secret the settings never serialize).
fn no_default(defaults: &Figment, path: &str) -> bool {
    matches!(defaults.find_value(path), Err(_) | Ok(Value::Empty(..)))
}

/// Whether figment's error is about a value of the environment.
fn from_environment(e: &figment::Error) -> bool {
    e.metadata
        .as_ref()
        .is_some_and(|m| m.name.contains("environment"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use secrecy::SecretString;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Section {
        depth: u32,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Demo {
        demo_listen: String,
        demo_batch: u32,
        #[serde(with = "humantime_serde")]
        demo_wait: Duration,
        #[serde(skip_serializing)]
        demo_token: Option<SecretString>,
        demo_namespace: String,
        demo_fraction: f64,
        demo_id: Option<u64>,
        demo_name: Option<String>,
        section: Section,
        #[serde(skip)]
        from_elsewhere: bool,
        bus: Bus,
        streams: Streams,
        tls: Tls,
    }

    impl Settings for Demo {
        fn flat() -> Vec<Flat> {
            vec![Bus::flat(), Streams::flat(), Tls::flat("demo_tls_")]
        }
    }

    impl Default for Demo {
        fn default() -> Self {
            Self {
                demo_listen: "0.0.0.0:1".into(),
                demo_batch: 10,
                demo_wait: Duration::from_secs(1),
                demo_token: None,
                demo_namespace: "runyard".into(),
                demo_fraction: 0.5,
                demo_id: None,
                demo_name: None,
                section: Section { depth: 1 },
                from_elsewhere: false,
                bus: Bus::default(),
                streams: Streams::default(),
                tls: Tls::default(),
            }
        }
    }

    #[test]
    fn the_environment_sets_every_field_but_sections_and_skipped_ones() {
        assert_eq!(
            env_keys::<Demo>(),
            [
                "demo_listen",
                "demo_batch",
                "demo_wait",
                "demo_token",
                "demo_namespace",
                "demo_fraction",
                "demo_id",
                "demo_name",
                "nats_url",
                "namespace",
                "stream_replicas",
                "demo_tls_cert",
                "demo_tls_key",
                "demo_tls_client_ca",
            ]
        );
        assert!(fields::<u32>().is_empty());
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn defaults_then_file_then_environment_and_nothing_else() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("s.toml", "demo_batch = 20\n[section]\ndepth = 3\n")?;
            jail.set_env("RUNYARD_DEMO_WAIT", "5s");
            jail.set_env("RUNYARD_DEMO_TOKEN", "4242");
            jail.set_env("RUNYARD_DEMO_NAMESPACE", "12");
            jail.set_env("RUNYARD_DEMO_FRACTION", "0.03");
            jail.set_env("RUNYARD_DEMO_ID", "77");
            jail.set_env("RUNYARD_DEMO_NAME", "true");
            // Another service's variable and a section's name are not read.
            jail.set_env("RUNYARD_OTHER_LISTEN", "x");
            jail.set_env("RUNYARD_SECTION", "7");
            jail.set_env("RUNYARD_FROM_ELSEWHERE", "true");
            let s: Demo = load(Some(Path::new("s.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(s.demo_listen, "0.0.0.0:1");
            assert_eq!(s.demo_batch, 20);
            assert_eq!(s.demo_wait, Duration::from_secs(5));
            let token = s
                .demo_token
                .as_ref()
                .map(secrecy::ExposeSecret::expose_secret);
            assert_eq!(token, Some("4242"));
            assert_eq!(s.demo_namespace, "12");
            assert!((s.demo_fraction - 0.03).abs() < 1e-12);
            assert_eq!(s.demo_id, Some(77));
            assert_eq!(s.demo_name.as_deref(), Some("true"));
            assert_eq!(s.section, Section { depth: 3 });
            assert!(!s.from_elsewhere);
            assert_eq!(s.bus, Bus::default());
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn bad_values_are_refused_naming_where_they_came_from() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("RUNYARD_DEMO_BATCH", "many");
            let e = load::<Demo>(None).expect_err("refused").to_string();
            assert!(e.starts_with("RUNYARD_DEMO_BATCH: "), "{e}");
            assert!(e.contains("many"), "{e}");
            jail.clear_env();
            jail.set_env("RUNYARD_DEMO_ID", "seven");
            let e = load::<Demo>(None).expect_err("refused").to_string();
            assert!(
                e.starts_with("RUNYARD_DEMO_ID: ") && e.contains("seven"),
                "{e}"
            );
            jail.clear_env();
            jail.create_file("s.toml", "colour = 1\n")?;
            let e = load::<Demo>(Some(Path::new("s.toml")))
                .expect_err("refused")
                .to_string();
            assert!(e.contains("colour") && e.contains("s.toml"), "{e}");
            Ok(())
        });
    }
}

#[cfg(test)]
mod flat_tests {
    use super::*;
    use std::path::PathBuf;

    use serde::Deserialize;

    #[derive(Debug, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Service {
        service_batch: u32,
        bus: Bus,
        database: Database,
        streams: Streams,
        tls: Tls,
    }

    impl Settings for Service {
        fn flat() -> Vec<Flat> {
            vec![
                Bus::flat(),
                Database::flat(),
                Streams::flat(),
                Tls::flat("service_tls_"),
            ]
        }
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn shared_sections_are_read_as_top_level_keys_from_file_and_environment() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "s.toml",
                "nats_url = \"nats://n1:4222\"\nstream_replicas = 3\nservice_tls_cert = \"/f.crt\"\n",
            )?;
            jail.set_env("RUNYARD_NAMESPACE", "2026");
            jail.set_env("RUNYARD_DATABASE_URL", "postgres://u:p@db/x");
            jail.set_env("RUNYARD_SERVICE_TLS_KEY", "/e.key");
            // The fields' own names are not variables.
            jail.set_env("RUNYARD_URL", "postgres://other/y");
            jail.set_env("RUNYARD_CERT", "/other.crt");
            let s: Service = load(Some(Path::new("s.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(s.bus.nats_url, "nats://n1:4222");
            assert_eq!(s.bus.namespace, "2026");
            assert_eq!(s.database.url, "postgres://u:p@db/x");
            assert_eq!(s.streams.replicas, 3);
            assert_eq!(s.tls.cert, Some(PathBuf::from("/f.crt")));
            assert_eq!(s.tls.key, Some(PathBuf::from("/e.key")));
            assert_eq!(s.tls.client_ca, None);
            let shown = format!("{s:?}");
            assert!(shown.contains("postgres://u:***@db/x"), "{shown}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn a_bad_shared_value_is_refused_by_the_name_the_operator_used() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("RUNYARD_STREAM_REPLICAS", "many");
            let e = load::<Service>(None).expect_err("refused").to_string();
            assert!(e.starts_with("RUNYARD_STREAM_REPLICAS: "), "{e}");
            jail.clear_env();
            jail.create_file("bad.toml", "stream_replicas = \"three\"\n")?;
            let e = load::<Service>(Some(Path::new("bad.toml")))
                .expect_err("refused")
                .to_string();
            assert!(
                e.contains("stream_replicas") && !e.contains("streams.") && e.contains("bad.toml"),
                "{e}"
            );
            // The sections are not tables of the file.
            jail.create_file("nested.toml", "[bus]\nnats_url = \"nats://x\"\n")?;
            let e = load::<Service>(Some(Path::new("nested.toml")))
                .expect_err("refused")
                .to_string();
            assert!(e.contains("`bus`") && e.contains("nats_url"), "{e}");
            jail.create_file("unknown.toml", "service_tls_chain = \"/x\"\n")?;
            let e = load::<Service>(Some(Path::new("unknown.toml")))
                .expect_err("refused")
                .to_string();
            assert!(e.contains("service_tls_chain"), "{e}");
            Ok(())
        });
    }
}
