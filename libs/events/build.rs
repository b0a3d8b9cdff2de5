//! Compiles `proto/runyard/events/v1` with protox (no system `protoc`).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("runyard/events/v1/events.proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let fds = protox::compile([&file], [&root])?;
    // The allocator's workloads are sorted maps already; an event it
    // publishes per answer takes one as is.
    tonic_prost_build::configure()
        .btree_map(".runyard.events.v1.AllocationIssued.workload")
        .build_client(false)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
