//! The addresses of a stack `scripts/dev.sh up` started: it writes them,
//! as `RUNYARD_*=value` lines, to `.runyard/dev/stack.env`, and the CLI
//! takes each as the default of the flag that variable sets. A flag or a
//! variable in the environment still wins. The file is looked for in the
//! working directory and its parents, or named by `RUNYARD_STACK_ENV`
//! (set empty: no stack file).

use std::path::{Path, PathBuf};

use clap::{CommandFactory as _, FromArgMatches as _};

use crate::Cli;

/// Names the stack file instead of the search.
pub const FILE_VAR: &str = "RUNYARD_STACK_ENV";

/// Where `dev.sh up` writes it, from the repository's root.
pub const DEFAULT_PATH: &str = ".runyard/dev/stack.env";

/// The stack file in force: `RUNYARD_STACK_ENV` (none when it is set
/// empty), else the nearest [`DEFAULT_PATH`] from the working directory
/// up.
pub fn find() -> Option<PathBuf> {
    if let Some(named) = std::env::var_os(FILE_VAR) {
        return (!named.is_empty()).then(|| PathBuf::from(named));
    }
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .map(|dir| dir.join(DEFAULT_PATH))
        .find(|path| path.is_file())
}

/// The `NAME=value` lines of `path` (blank lines and `#` comments
/// skipped). A line of another shape is refused, naming it.
pub fn read(path: &Path) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read the stack file: {e}", path.display()))?;
    let mut vars = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((name, value))
                if !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
            {
                vars.push((name.to_owned(), value.to_owned()));
            }
            _ => {
                return Err(format!(
                    "{}:{}: not a NAME=value line (the stack file `scripts/dev.sh up` writes; \
                     remove it or set {FILE_VAR} to another)",
                    path.display(),
                    n + 1
                ));
            }
        }
    }
    Ok(vars)
}

/// The command line, with the stack file's values as the defaults of the
/// flags whose variables are not set. A stack file that cannot be read
/// is reported and ends the process with the usage code.
pub fn parse() -> Cli {
    let mut cmd = Cli::command();
    if let Some(path) = find() {
        let vars = match read(&path) {
            Ok(vars) => vars,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(i32::from(crate::EXIT_USAGE));
            }
        };
        let defaults: Vec<(clap::Id, &'static str)> = cmd
            .get_arguments()
            .filter_map(|arg| {
                let name = arg.get_env()?.to_str()?;
                if std::env::var_os(name).is_some() {
                    return None;
                }
                let (_, value) = vars.iter().find(|(n, _)| n == name)?;
                // Once per process: the defaults live as long as it does.
                Some((
                    arg.get_id().clone(),
                    &*Box::leak(value.clone().into_boxed_str()),
                ))
            })
            .collect();
        for (id, value) in defaults {
            cmd = cmd.mut_arg(id, |a| a.default_value(value).hide_default_value(true));
        }
    }
    let matches = cmd.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}
