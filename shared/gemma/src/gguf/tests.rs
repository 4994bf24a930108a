//! Hand-built headers of the shapes candle's reader or our extents cannot take as they are,
//! and the real GGUF through the same checks.

use std::io::Cursor;

use super::*;

/// A GGUF v3 header with `kvs` (key, type, value bytes) and `tensors` (name, dims, dtype,
/// offset), padded with `data` bytes of tensor data.
fn header(
    kvs: &[(&str, u32, Vec<u8>)],
    tensors: &[(&str, &[u64], u32, u64)],
    data: usize,
) -> Vec<u8> {
    let string = |s: &str| {
        [
            (s.len() as u64).to_le_bytes().to_vec(),
            s.as_bytes().to_vec(),
        ]
        .concat()
    };
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (key, ty, value) in kvs {
        out.extend(string(key));
        out.extend(ty.to_le_bytes());
        out.extend(value);
    }
    for (name, dims, dtype, offset) in tensors {
        out.extend(string(name));
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(dtype.to_le_bytes());
        out.extend(offset.to_le_bytes());
    }
    out.resize(out.len().div_ceil(32) * 32 + data, 0);
    out
}

fn read(bytes: Vec<u8>) -> Result<(Content, u64)> {
    read_checked(&mut Cursor::new(bytes), Path::new("fuzz.gguf"))
}

fn refusal(bytes: Vec<u8>) -> String {
    read(bytes).expect_err("refused").to_string()
}

#[test]
fn an_alignment_of_zero_is_refused_before_candle_divides_by_it() {
    for (ty, value) in [(4, vec![0; 4]), (0, vec![0]), (2, vec![0; 2])] {
        let e = refusal(header(&[("general.alignment", ty, value)], &[], 0));
        assert!(e.contains("general.alignment is 0"), "{e}");
    }
    let nul_padded = header(&[("general.alignment\0", 4, vec![0; 4])], &[], 0);
    assert!(refusal(nul_padded).contains("general.alignment is 0"));
    let (content, _) = read(header(
        &[("general.alignment", 4, 64u32.to_le_bytes().to_vec())],
        &[],
        0,
    ))
    .expect("an alignment of 64 reads");
    assert_eq!(content.tensor_data_offset % 64, 0);
}

#[test]
fn tensor_sizes_that_overflow_are_refused() {
    let huge: &[u64] = &[1 << 40, 1 << 40];
    let e = refusal(header(&[], &[("t", huge, 0, 0)], 0));
    assert!(e.contains("overflows"), "{e}");
    let e = refusal(header(&[], &[("t", &[4], 0, u64::MAX - 8)], 16));
    assert!(e.contains("overflows"), "{e}");
}

#[test]
fn tensors_past_the_end_of_the_file_are_refused() {
    let e = refusal(header(&[], &[("t", &[8], 0, 0)], 16));
    assert!(e.contains("past the end"), "{e}");
    let (content, len) = read(header(&[], &[("t", &[4], 0, 0)], 16)).expect("fits");
    let extent = tensor_extent(&content, &content.tensor_infos["t"], len).expect("fits");
    assert_eq!(extent.len(), 16);
}

#[test]
fn lengths_past_the_end_of_the_file_are_refused() {
    let string_of = |n: u64| n.to_le_bytes().to_vec();
    let e = refusal(header(&[("k", 8, string_of(1 << 60))], &[], 0));
    assert!(e.contains("past the end"), "{e}");
    let array = [
        4u32.to_le_bytes().to_vec(),
        (1u64 << 62).to_le_bytes().to_vec(),
    ]
    .concat();
    let e = refusal(header(&[("k", 9, array)], &[], 0));
    assert!(e.contains("overflows") || e.contains("past the end"), "{e}");
}

#[test]
fn the_real_gguf_passes_the_checks() {
    let path = tandem_testkit::real_gguf();
    let mut file = std::io::BufReader::new(std::fs::File::open(&path).expect("opens"));
    let cfg = inspect_gguf(&mut file, &path).expect("the real model reads");
    assert_eq!((cfg.hidden_size, cfg.num_hidden_layers), (640, 18));
}
