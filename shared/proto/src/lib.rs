//! The tandem.v1 wire contract, generated from proto/tandem/v1 at build time.
#![allow(missing_docs, clippy::all)]

/// Package `tandem.v1`.
pub mod v1 {
    tonic::include_proto!("tandem.v1");

    /// Encoded file descriptors, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("tandem_v1_descriptor");
}
