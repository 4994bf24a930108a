//! Fuzz targets for every decoder of untrusted bytes in tandem: one pure function per
//! target, taking `&[u8]` and returning nothing. A target never panics and never allocates
//! beyond a bound set by its input, on any input: that is what fuzzing checks. Targets also
//! assert what a decoder promises of what it accepts (finite rows of the declared shape,
//! probabilities in `[0, 1]`), so an accepted-but-wrong value is a crash too.
//!
//! * [`wire`]: gRPC messages (the verifier's `GenerateRequest` through to the engine's plan
//!   on the real Gemma 3 270M, the drafter's stream messages, the drafter's answers to the
//!   verifier).
//! * [`files`]: model and drafter files (GGUF headers, HF `config.json`, the DSpark
//!   manifest, its calibration, safetensors indexes and files, a routed set's router).
//!
//! [`TARGETS`] names each with its seeds ([`seeds`]); [`mutate`] is the deterministic
//! mutator of the brief CI run (`tests/smoke.rs`). Long runs go through cargo-fuzz
//! (`fuzz/`, docs/fuzzing.md).

pub mod files;
pub mod mutate;
pub mod seeds;
pub mod wire;

/// A fuzz target: its name (as cargo-fuzz knows it), the function and its seed inputs.
pub struct Target {
    /// The cargo-fuzz target name.
    pub name: &'static str,
    /// Decodes and checks one input; panics only on a bug.
    pub run: fn(&[u8]),
    /// Small valid inputs to start from.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "generate_request",
        run: wire::generate_request,
        seeds: seeds::generate_requests,
    },
    Target {
        name: "draft_request",
        run: wire::draft_request,
        seeds: seeds::draft_requests,
    },
    Target {
        name: "draft_response",
        run: wire::draft_response,
        seeds: seeds::draft_responses,
    },
    Target {
        name: "gguf_header",
        run: files::gguf_header,
        seeds: seeds::gguf_headers,
    },
    Target {
        name: "hf_config",
        run: files::hf_config,
        seeds: seeds::hf_configs,
    },
    Target {
        name: "dspark_manifest",
        run: files::dspark_manifest,
        seeds: seeds::dspark_manifests,
    },
    Target {
        name: "calibration",
        run: files::calibration,
        seeds: seeds::calibrations,
    },
    Target {
        name: "safetensors_index",
        run: files::safetensors_index,
        seeds: seeds::safetensors_indexes,
    },
    Target {
        name: "safetensors",
        run: files::safetensors,
        seeds: seeds::safetensors_files,
    },
    Target {
        name: "router_manifest",
        run: files::router_manifest,
        seeds: seeds::router_manifests,
    },
];
