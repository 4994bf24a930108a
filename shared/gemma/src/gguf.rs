//! Reading a GGUF header from untrusted bytes. candle's reader bounds every count and
//! length against the bytes it has, but it divides by the `general.alignment` the header
//! declares, so a header declaring 0 panics: the metadata is walked first (nothing kept,
//! nothing allocated but short keys) and an alignment of 0 refused. Each tensor's extent is
//! then computed with checked arithmetic and must end within the file, so dimensions or
//! offsets near 2^64 are an error, not an overflow.

use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, TensorInfo};

use crate::error::{candle_message, GemmaError, Result};
use crate::gemma3::gguf_config::{config_from_gguf, Header};
use crate::gemma3::GemmaConfig;

const ALIGNMENT_KEY: &[u8] = b"general.alignment";
/// Deepest nesting of arrays walked (candle's own limit).
const MAX_DEPTH: usize = 64;
/// GGUF value types 0..=5: the integer types candle reads `general.alignment` from.
const INTEGER_TYPES: std::ops::RangeInclusive<u32> = 0..=5;

/// Reads the header of the GGUF file `path` from `reader` and checks, as loading does, the
/// Gemma 3 config its metadata gives and that every tensor lies within the file.
pub fn inspect_gguf<R: Read + Seek>(reader: &mut R, path: &Path) -> Result<GemmaConfig> {
    let (content, _) = read_checked(reader, path)?;
    config_from_gguf(&Header {
        content: &content,
        path,
    })
}

/// The header of `reader` (a GGUF file at `path`) and the file's length, every tensor's
/// extent checked against that length.
pub(crate) fn read_checked<R: Read + Seek>(reader: &mut R, path: &Path) -> Result<(Content, u64)> {
    let bad =
        |reason: String| GemmaError::format(path, format!("not a readable GGUF file: {reason}"));
    let len = reader
        .seek(SeekFrom::End(0))
        .map_err(|e| GemmaError::io(path, e))?;
    reader.rewind().map_err(|e| GemmaError::io(path, e))?;
    let mut walk = Walk {
        reader: &mut *reader,
        pos: 0,
        end: len,
        wide: true,
    };
    walk.header().map_err(bad)?;
    reader.rewind().map_err(|e| GemmaError::io(path, e))?;
    let content = Content::read(reader).map_err(|e| bad(candle_message(&e)))?;
    for (name, info) in &content.tensor_infos {
        tensor_extent(&content, info, len).map_err(|e| bad(format!("tensor {name}: {e}")))?;
    }
    Ok((content, len))
}

/// Where `info`'s bytes lie in a file of `file_len` bytes.
pub(crate) fn tensor_extent(
    content: &Content,
    info: &TensorInfo,
    file_len: u64,
) -> std::result::Result<Range<usize>, String> {
    let overflow = || "its size or offset overflows".to_string();
    let elems = info
        .shape
        .dims()
        .iter()
        .try_fold(1u64, |n, d| n.checked_mul(*d as u64))
        .ok_or_else(overflow)?;
    let block = info.ggml_dtype.block_size() as u64;
    if elems % block != 0 {
        return Err(format!("{elems} elements is not a whole number of blocks"));
    }
    let bytes = (elems / block)
        .checked_mul(info.ggml_dtype.type_size() as u64)
        .ok_or_else(overflow)?;
    let start = content
        .tensor_data_offset
        .checked_add(info.offset)
        .ok_or_else(overflow)?;
    let end = start.checked_add(bytes).ok_or_else(overflow)?;
    if end > file_len {
        return Err(format!(
            "bytes {start}..{end} run past the end of the file ({file_len} bytes; truncated?)"
        ));
    }
    Ok(start as usize..end as usize)
}

/// A forward walk over a GGUF header's metadata that only looks for `general.alignment`.
struct Walk<'a, R> {
    reader: &'a mut R,
    pos: u64,
    end: u64,
    /// Lengths are u64 (GGUF v2 and v3) rather than u32 (v1).
    wide: bool,
}

type Walked<T> = std::result::Result<T, String>;

impl<R: Read + Seek> Walk<'_, R> {
    fn header(&mut self) -> Walked<()> {
        let _magic = self.u32()?;
        let version = self.u32()?;
        self.wide = version != 1;
        let _tensors = self.len()?;
        let kvs = self.len()?;
        for _ in 0..kvs {
            let alignment = self.key()? == ALIGNMENT_KEY;
            let ty = self.u32()?;
            if alignment && INTEGER_TYPES.contains(&ty) {
                let mut v = [0u8; 4];
                let size = scalar_size(ty).unwrap_or(4) as usize;
                self.read(&mut v[..size])?;
                if v.iter().all(|b| *b == 0) {
                    return Err("general.alignment is 0".into());
                }
            } else {
                self.value(ty, 0)?;
            }
        }
        Ok(())
    }

    /// A metadata key, as candle keeps it (trailing NULs dropped); longer keys than the
    /// alignment's are skipped and returned empty.
    fn key(&mut self) -> Walked<Vec<u8>> {
        let n = self.len()?;
        if n > ALIGNMENT_KEY.len() as u64 + 8 {
            self.skip(n)?;
            return Ok(Vec::new());
        }
        let mut key = vec![0u8; n as usize];
        self.read(&mut key)?;
        while key.last() == Some(&0) {
            key.pop();
        }
        Ok(key)
    }

    fn value(&mut self, ty: u32, depth: usize) -> Walked<()> {
        if let Some(size) = scalar_size(ty) {
            return self.skip(size);
        }
        match ty {
            8 => {
                let n = self.len()?;
                self.skip(n)
            }
            9 if depth < MAX_DEPTH => {
                let elem = self.u32()?;
                let n = self.len()?;
                match scalar_size(elem) {
                    Some(size) => self.skip(n.checked_mul(size).ok_or("an array overflows")?),
                    None => (0..n).try_for_each(|_| self.value(elem, depth + 1)),
                }
            }
            9 => Err(format!("arrays nest deeper than {MAX_DEPTH}")),
            other => Err(format!("unknown value type {other}")),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> Walked<()> {
        self.reader
            .read_exact(buf)
            .map_err(|e| format!("the header ends early: {e}"))?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn skip(&mut self, n: u64) -> Walked<()> {
        if n > self.end.saturating_sub(self.pos) {
            return Err(format!(
                "a length of {n} bytes runs past the end of the file"
            ));
        }
        let step = i64::try_from(n).map_err(|e| e.to_string())?;
        self.reader.seek_relative(step).map_err(|e| e.to_string())?;
        self.pos += n;
        Ok(())
    }

    fn u32(&mut self) -> Walked<u32> {
        let mut b = [0u8; 4];
        self.read(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn len(&mut self) -> Walked<u64> {
        if !self.wide {
            return self.u32().map(u64::from);
        }
        let mut b = [0u8; 8];
        self.read(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Bytes of a fixed-size GGUF value type; `None` for strings, arrays and unknown types.
fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
