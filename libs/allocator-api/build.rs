//! Compiles `proto/runyard/allocator/v1` with protox (no system `protoc`),
//! keeping the descriptor set for gRPC server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("runyard/allocator/v1/allocator.proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let fds = protox::compile([&file], [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("allocator_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // The workload arrives as, and the variables are answered from, sorted
    // maps: decoding straight into them saves a hashed map per call.
    tonic_prost_build::configure()
        .btree_map(".runyard.allocator.v1.RecommendRequest.workload")
        .btree_map(".runyard.allocator.v1.Recommendation.variables")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
