//! Targets for the model and drafter files a service reads at start: a GGUF header (the
//! loader's checks and the Gemma 3 config of its metadata), an HF `config.json`, the
//! DSpark manifest (checked against the real target's dimensions), its calibration (then
//! applied), a safetensors index, a safetensors file and a routed set's `router.json` (then
//! routing prompts).

use std::io::Cursor;
use std::path::Path;
use std::sync::OnceLock;

use candle_core::Device;
use tandem_core::calibration::Calibration;
use tandem_core::DraftSource;
use tandem_dspark::{check_manifest, index_shards, RouterManifest, TargetDims};
use tandem_gemma::{inspect_gguf, GemmaConfig};

use crate::seeds::SHIPPED_MANIFEST;

/// The real target's dimensions, as the shipped drafter's manifest records them.
pub fn real_dims() -> &'static TargetDims {
    static DIMS: OnceLock<TargetDims> = OnceLock::new();
    DIMS.get_or_init(|| {
        let m: serde_json::Value =
            serde_json::from_str(SHIPPED_MANIFEST).expect("the shipped manifest is JSON");
        serde_json::from_value(m["dims"].clone()).expect("the shipped manifest has dims")
    })
}

/// A GGUF file's header, as loading a target reads and checks it.
pub fn gguf_header(data: &[u8]) {
    if let Ok(cfg) = inspect_gguf(&mut Cursor::new(data), Path::new("fuzz.gguf")) {
        assert!(cfg.validate().is_ok());
    }
}

/// An HF `config.json` of a Gemma 3 target.
pub fn hf_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = GemmaConfig::from_hf_json(text) {
        assert!(cfg.validate().is_ok());
    }
}

/// A DSpark manifest, checked as loading does against the real target.
pub fn dspark_manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = check_manifest(text, real_dims()) {
        assert!(cfg.gamma >= 2 && !cfg.tap_layers.is_empty());
    }
}

/// A drafter's calibration, read and applied to confidences in and out of `[0, 1]`.
pub fn calibration(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cal) = Calibration::from_json(text) else {
        return;
    };
    let raw = [0.0f32, 0.3, 1.0, f32::NAN, -1.0, 2.0, f32::INFINITY];
    for r in &cal.regimes {
        for source in [DraftSource::Model, DraftSource::Lookup] {
            let mut c = raw;
            r.apply(source, &mut c);
            let inside = raw.iter().zip(&c).filter(|(x, _)| (0.0..=1.0).contains(*x));
            assert!(
                inside.clone().all(|(_, y)| (0.0..=1.0).contains(y)),
                "{c:?}"
            );
        }
    }
}

/// A drafter's safetensors index: the shard names it gives.
pub fn safetensors_index(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(files) = index_shards(text) {
        assert!(files
            .iter()
            .all(|f| !f.contains('/') && f != ".." && f != "."));
    }
}

/// A safetensors file, read into tensors as the drafter's loader reads its shards.
pub fn safetensors(data: &[u8]) {
    let _ = candle_core::safetensors::load_buffer(data, &Device::Cpu);
}

/// A routed set's `router.json`, then prompts of several lengths routed by it.
pub fn router_manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(m) = RouterManifest::parse(text) else {
        return;
    };
    assert!(m.default_index().is_some());
    let ids = m.router.ids.iter().copied().take(64);
    let prompts: [Vec<u32>; 4] = [
        Vec::new(),
        vec![u32::MAX],
        ids.chain([0, 2, 262_143]).collect(),
        (0..300).collect(),
    ];
    for p in &prompts {
        let route = m.router.route(p);
        assert!(route.is_none_or(|r| r < m.routes.len()), "{route:?}");
        assert!(m.router.scores(p).iter().all(|s| s.is_finite()));
    }
}
