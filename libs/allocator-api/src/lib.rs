//! The allocator's gRPC API, `runyard.allocator.v1`
//! (`proto/runyard/allocator/v1/allocator.proto`): the messages, the client
//! (`allocator_client::AllocatorClient`), the server trait
//! (`allocator_server::Allocator`) and the encoded descriptor set the
//! allocator serves for reflection. The allocator serves it; the scaler and
//! the CLI call it without depending on the allocator.

pub mod client;

#[allow(missing_docs, clippy::all, missing_debug_implementations)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/runyard.allocator.v1.rs"));
}
pub use generated::*;

/// The encoded descriptor set, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/allocator_descriptor.bin"));
