//! The address file `scripts/dev.sh up` writes: the CLI finds it from the
//! working directory up and takes its addresses, unless a variable or a
//! flag says otherwise.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::Output;

/// `runyard pools` run in `dir` with `env` only.
async fn pools(dir: &std::path::Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard"));
    cmd.env_clear().current_dir(dir).arg("pools").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("running runyard")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn the_dev_stacks_file_gives_the_addresses_a_flag_or_variable_overrides() {
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join(".runyard/dev");
    std::fs::create_dir_all(&state).unwrap();
    let sub = root.path().join("services/scaler");
    std::fs::create_dir_all(&sub).unwrap();
    let (file, env, flag) = (
        runyard_testkit::free_port(),
        runyard_testkit::free_port(),
        runyard_testkit::free_port(),
    );
    std::fs::write(
        state.join("stack.env"),
        format!("# written by scripts/dev.sh up\nRUNYARD_SCALER_URL=http://127.0.0.1:{file}\n"),
    )
    .unwrap();

    // From a directory below the repository's root: the file's address.
    let o = pools(&sub, &[], &[]).await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("127.0.0.1:{file}")),
        "{}",
        stderr(&o)
    );

    // A variable wins over the file, a flag over both.
    let url = format!("http://127.0.0.1:{env}");
    let o = pools(&sub, &[("RUNYARD_SCALER_URL", &url)], &[]).await;
    assert!(
        stderr(&o).contains(&format!("127.0.0.1:{env}")),
        "{}",
        stderr(&o)
    );
    let flagged = format!("http://127.0.0.1:{flag}");
    let o = pools(
        &sub,
        &[("RUNYARD_SCALER_URL", &url)],
        &["--scaler-url", &flagged],
    )
    .await;
    assert!(
        stderr(&o).contains(&format!("127.0.0.1:{flag}")),
        "{}",
        stderr(&o)
    );

    // RUNYARD_STACK_ENV set empty: no file, the built-in default.
    let o = pools(&sub, &[(runyard_cli::stack_env::FILE_VAR, "")], &[]).await;
    assert!(stderr(&o).contains("127.0.0.1:8083"), "{}", stderr(&o));

    // A line that is no NAME=value stops the CLI, naming the file and line.
    std::fs::write(
        state.join("stack.env"),
        "RUNYARD_SCALER_URL=x\nnot a setting\n",
    )
    .unwrap();
    let o = pools(&sub, &[], &[]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("stack.env:2"), "{}", stderr(&o));
}
