//! The tandem.v1 wire contract, generated from proto/tandem/v1 at build time, and the codec
//! between wire messages and tandem's core types (rows and blocks in `codec`, the snapshot
//! declaration in `spec`).

/// Package `tandem.v1`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("tandem.v1");

    /// Encoded file descriptors, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("tandem_v1_descriptor");
}

pub mod codec;
pub mod spec;
