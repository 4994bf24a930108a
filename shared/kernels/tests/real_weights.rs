//! The kernels on the real Gemma 3 270M weights (fetched by scripts/fetch-models.sh): for each
//! storage type the model uses, `matmul` (8-bit activations) and the exact `LaneMatrix`
//! product (f32 activations) against an f64 product of the dequantized weights.

use candle_core::quantized::gguf_file;
use tandem_kernels::{LaneMatrix, QMatrix, QType};
use tandem_testkit::real_gguf;

/// The first `max_rows` rows of a GGUF tensor as a [`QMatrix`].
fn load(name: &str, max_rows: usize) -> QMatrix {
    let path = real_gguf();
    let mut file = std::fs::File::open(&path).expect("open");
    let content = gguf_file::Content::read(&mut file).expect("gguf");
    let info = &content.tensor_infos[name];
    let dims = info.shape.dims();
    let (n, k) = (dims[0].min(max_rows), dims[1]);
    let qtype = QType::from_ggml_id(ggml_id(info.ggml_dtype)).expect("type");
    let row_bytes = qtype.row_bytes(k).expect("row bytes");
    let bytes = std::fs::read(&path).expect("read");
    let start = (content.tensor_data_offset + info.offset) as usize;
    QMatrix::new(qtype, n, k, bytes[start..start + n * row_bytes].to_vec()).expect("matrix")
}

fn ggml_id(t: candle_core::quantized::GgmlDType) -> u32 {
    use candle_core::quantized::GgmlDType::*;
    match t {
        F32 => 0,
        F16 => 1,
        Q4_0 => 2,
        Q5_0 => 6,
        Q8_0 => 8,
        Q4K => 12,
        Q5K => 13,
        Q6K => 14,
        Q8K => 15,
        other => panic!("type {other:?} not used by this model"),
    }
}

/// Activations shaped like a real hidden state: mostly small, a few large outliers.
fn activations(m: usize, k: usize) -> Vec<f32> {
    (0..m * k)
        .map(|i| {
            let x = ((i as f32 * 0.618_034).fract() - 0.5) * 4.0;
            if i % 97 == 0 {
                x * 40.0
            } else {
                x
            }
        })
        .collect()
}

/// Worst error of `got` relative to Σ|w·x| of each output, against the f64 product.
fn worst_rel_error(w: &QMatrix, x: &[f32], m: usize, got: &[f32]) -> f64 {
    let (n, k) = (w.n(), w.k());
    let deq = w.dequantize();
    let mut worst = 0f64;
    for r in 0..m {
        for j in 0..n {
            let (mut dot, mut mag) = (0f64, 0f64);
            for e in 0..k {
                let p = deq[j * k + e] as f64 * x[r * k + e] as f64;
                dot += p;
                mag += p.abs();
            }
            worst = worst.max((got[r * n + j] as f64 - dot).abs() / mag.max(1e-30));
        }
    }
    worst
}

#[test]
fn real_weight_types_match_the_f64_reference() {
    let m = 9;
    for (name, rows) in [
        ("blk.0.attn_q.weight", 1024),
        ("blk.0.attn_v.weight", 256),
        ("blk.0.attn_output.weight", 640),
        ("blk.0.ffn_down.weight", 640),
        ("token_embd.weight", 2048),
    ] {
        let w = load(name, rows);
        let x = activations(m, w.k());
        let mut out = vec![0f32; m * w.n()];
        w.matmul(&x, m, &mut out).expect("matmul");
        let int8 = worst_rel_error(&w, &x, m, &out);
        let lanes = LaneMatrix::pack(&w).expect("quantized");
        lanes.matmul(&x, m, &mut out).expect("lane matmul");
        let exact = worst_rel_error(&w, &x, m, &out);
        // 8-bit activations: a per-block rounding of up to half a step of amax/127;
        // f32 activations: only f32 summation error.
        assert!(int8 < 2e-2, "{name} ({:?}) int8 error {int8}", w.qtype());
        assert!(exact < 1e-5, "{name} ({:?}) exact error {exact}", w.qtype());
        assert!(
            exact < int8,
            "{name}: exact path not tighter ({exact} vs {int8})"
        );
    }
}
