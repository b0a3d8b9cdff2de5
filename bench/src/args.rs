//! Command-line pieces every benchmark shares, for its `clap` arguments.

/// Flags `cargo` passes to a benchmark binary (`harness = false`): flatten
/// into the benchmark's arguments with `#[command(flatten)]`.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct Cargo {
    /// Passed by `cargo bench`; absent under `cargo test --benches`.
    #[arg(long, hide = true)]
    pub bench: bool,
}

/// Parses `KEY=VALUE` (an environment variable for a child process).
pub fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// Parses a count of at least 1.
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Parses a number above zero (a rate).
pub fn above_zero(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        Ok(_) => Err("must be above zero".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(key_value("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(key_value("A="), Ok(("A".into(), String::new())));
        assert!(key_value("=b").is_err() && key_value("ab").is_err());
        assert_eq!(at_least_one("3"), Ok(3));
        assert!(at_least_one("0").is_err() && at_least_one("x").is_err());
        assert_eq!(above_zero("2.5"), Ok(2.5));
        assert!(above_zero("0").is_err() && above_zero("inf").is_err());
    }
}
