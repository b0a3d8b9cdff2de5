//! The services and tools (the workspace members under `services/` and
//! `tools/`) stand side by side over `libs/`: none of them appears under
//! the normal or build dependencies of another workspace crate, only under
//! `[dev-dependencies]` (tests may start one). Read from
//! `cargo metadata --no-deps`, so a new service or tool is covered without
//! editing this list. docs/architecture.md ("Where things live") draws the
//! graph this keeps.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_owned());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON")
}

/// Every `(from, to, kind)` where `to` is a service or tool and `kind` is
/// not `dev`, for the workspace described by `meta`.
fn service_edges(meta: &Value) -> Vec<(String, String, String)> {
    let root = PathBuf::from(meta["workspace_root"].as_str().expect("workspace_root"));
    let packages = meta["packages"].as_array().expect("packages");
    let services: BTreeSet<&str> = packages
        .iter()
        .filter(|p| {
            let manifest = Path::new(p["manifest_path"].as_str().expect("manifest_path"));
            manifest.starts_with(root.join("services")) || manifest.starts_with(root.join("tools"))
        })
        .map(|p| p["name"].as_str().expect("name"))
        .collect();
    assert!(
        services.contains("runyard-ingest") && services.contains("runyard-cli"),
        "the services and tools were not found under services/ and tools/: {services:?}"
    );
    let mut edges = Vec::new();
    for p in packages {
        let from = p["name"].as_str().expect("name");
        for d in p["dependencies"].as_array().expect("dependencies") {
            let to = d["name"].as_str().expect("dependency name");
            // null is a normal dependency; "build" a build dependency.
            let kind = d["kind"].as_str().unwrap_or("normal");
            if kind != "dev" && services.contains(to) {
                edges.push((from.to_owned(), to.to_owned(), kind.to_owned()));
            }
        }
    }
    edges.sort();
    edges.dedup();
    edges
}

#[test]
fn no_service_depends_on_another_outside_dev_dependencies() {
    let edges = service_edges(&metadata());
    let offending: Vec<String> = edges
        .iter()
        .map(|(from, to, kind)| format!("{from} -> {to} ({kind} dependency)"))
        .collect();
    assert!(
        offending.is_empty(),
        "a service or tool is a normal/build dependency of another workspace crate; \
         move what it is used for into a lib under libs/, or make it a \
         [dev-dependency]:\n  {}",
        offending.join("\n  ")
    );
}
