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

pub mod secrets;

/// The prefix of every variable a service reads.
pub const ENV_PREFIX: &str = "RUNYARD_";

/// Loads a service's typed configuration: `T::default()`, then the TOML
/// `file` if given, then `RUNYARD_<KEY>` for every key of [`env_keys`].
/// Unknown keys in the file are refused by the type's
/// `deny_unknown_fields`; a bad value set in the environment is refused
/// naming its variable (`RUNYARD_TRACKER_BATCH_SIZE: ...`).
pub fn load<T>(file: Option<&Path>) -> Result<T, Box<figment::Error>>
where
    T: Serialize + DeserializeOwned + Default,
{
    let defaults = Figment::from(Serialized::defaults(T::default()));
    let keys = settable::<T>(&defaults);
    let mut base = defaults.clone();
    if let Some(file) = file {
        base = base.merge(Toml::file_exact(file));
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
                let key = e.path.join("_");
                let retry = matches!(e.kind, figment::error::Kind::InvalidType(..))
                    && from_environment(&e)
                    && no_default(&defaults, &key)
                    && !parsed.contains(&key.as_str());
                match keys.iter().find(|k| **k == key) {
                    Some(k) if retry => parsed.push(k),
                    _ => return Err(Box::new(naming_the_variable(e, &keys))),
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
    keys: &'a [&'static str],
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
            let var = format!("{ENV_PREFIX}{}", key.to_ascii_uppercase());
            let Some(text) = std::env::var_os(&var) else {
                continue;
            };
            let text = text
                .into_string()
                .map_err(|_| figment::Error::from(format!("{var}: not valid UTF-8")))?;
            let as_text = match self.defaults.find_value(key) {
                Ok(Value::String(..)) => true,
                _ if no_default(self.defaults, key) => !self.parsed.contains(key),
                _ => false,
            };
            let value = if as_text {
                Value::from(text)
            } else {
                text.parse::<Value>().unwrap_or_else(|never| match never {})
            };
            dict.insert((*key).to_owned(), value);
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// The keys of `T` that the environment may set: every field its
/// `Deserialize` reads (secrets the settings never serialize among them;
/// `#[serde(skip)]` fields are not read), except sections, the fields whose
/// default is a table, which only a file can give.
pub fn env_keys<T>() -> Vec<&'static str>
where
    T: Serialize + DeserializeOwned + Default,
{
    settable::<T>(&Figment::from(Serialized::defaults(T::default())))
}

/// [`env_keys`] with `T`'s defaults already read.
fn settable<T: DeserializeOwned>(defaults: &Figment) -> Vec<&'static str> {
    fields::<T>()
        .iter()
        .copied()
        .filter(|k| !matches!(defaults.find_value(k), Ok(Value::Dict(..))))
        .collect()
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

/// A figment error about a variable set in the environment, with the
/// variable's full name in front (figment names the key alone).
fn naming_the_variable(e: figment::Error, keys: &[&str]) -> figment::Error {
    let key = e.path.join("_");
    if from_environment(&e) && keys.contains(&key.as_str()) {
        figment::Error::from(format!("{ENV_PREFIX}{}: {e}", key.to_ascii_uppercase()))
    } else {
        e
    }
}

/// Whether `key` has no default value (an unset `Option`, or a secret the
/// settings never serialize).
fn no_default(defaults: &Figment, key: &str) -> bool {
    matches!(defaults.find_value(key), Err(_) | Ok(Value::Empty(..)))
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
    struct Settings {
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
    }

    impl Default for Settings {
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
            }
        }
    }

    #[test]
    fn the_environment_sets_every_field_but_sections_and_skipped_ones() {
        assert_eq!(
            env_keys::<Settings>(),
            [
                "demo_listen",
                "demo_batch",
                "demo_wait",
                "demo_token",
                "demo_namespace",
                "demo_fraction",
                "demo_id",
                "demo_name"
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
            let s: Settings = load(Some(Path::new("s.toml"))).map_err(|e| e.to_string())?;
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
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's own error type
    fn bad_values_are_refused_naming_where_they_came_from() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("RUNYARD_DEMO_BATCH", "many");
            let e = load::<Settings>(None).expect_err("refused").to_string();
            assert!(e.starts_with("RUNYARD_DEMO_BATCH: "), "{e}");
            assert!(e.contains("many"), "{e}");
            jail.clear_env();
            jail.set_env("RUNYARD_DEMO_ID", "seven");
            let e = load::<Settings>(None).expect_err("refused").to_string();
            assert!(
                e.starts_with("RUNYARD_DEMO_ID: ") && e.contains("seven"),
                "{e}"
            );
            jail.clear_env();
            jail.create_file("s.toml", "colour = 1\n")?;
            let e = load::<Settings>(Some(Path::new("s.toml")))
                .expect_err("refused")
                .to_string();
            assert!(e.contains("colour") && e.contains("s.toml"), "{e}");
            Ok(())
        });
    }
}
