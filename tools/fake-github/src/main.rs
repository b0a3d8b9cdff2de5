//! `runyard-fake-github`: a stand-in for GitHub's REST API on loopback, for
//! the local stack (`scripts/dev.sh up`) and demos: it hands out JIT runner
//! configs, lists and deletes runners, and reports every registered runner
//! online a second after it registers, as a booting machine would. It prints
//! its base URL on the first line of stdout, then serves until interrupted.

use std::io::Write as _;
use std::time::Duration;

use runyard_testkit::fake_github::FakeGitHub;

#[tokio::main]
async fn main() {
    let github = FakeGitHub::start().await;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", github.url());
    let _ = out.flush();
    let shutdown = runyard_telemetry::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        for runner in github.runners() {
            if runner.status != "online" {
                github.set_online(runner.id);
            }
        }
    }
}
