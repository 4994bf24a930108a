//! Weight sources: GGUF files (quantized blocks kept as they are) and HF safetensors
//! directories (f32 / f16 / bf16, sharded or not), behind one small trait the model
//! builder asks for tensors by role.

use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::quantized::GgmlDType;
use candle_core::safetensors::MmapedSafetensors;
use sha2::{Digest, Sha256};
use tandem_kernels::{QMatrix, QType};

use crate::error::{candle_message, GemmaError, Result};
use crate::gemma3::gguf_config::{config_from_gguf, Header};
use crate::gemma3::names::Role;
use crate::gemma3::GemmaConfig;
use crate::gguf::{read_checked, tensor_extent};

/// Where a model's tensors come from.
pub(crate) trait TensorSource {
    /// A `n × k` weight matrix (row-major, `n` outputs).
    fn matrix(&self, role: Role, n: usize, k: usize) -> Result<QMatrix>;
    /// A vector of `len` floats; for RMSNorm weights, the multiplier `1 + w`.
    fn vector(&self, role: Role, len: usize) -> Result<Vec<f32>>;
}

/// Opens a `.gguf` file or an HF directory and reads its config.
pub(crate) fn open(path: &Path) -> Result<(Box<dyn TensorSource>, GemmaConfig)> {
    if path.is_dir() {
        let (src, cfg) = HfSource::open(path)?;
        Ok((Box::new(src), cfg))
    } else {
        let src = GgufSource::open(path)?;
        let cfg = src.config()?;
        Ok((Box::new(src), cfg))
    }
}

fn check_shape(role_name: &str, actual: &[usize], expected: &[usize]) -> Result<()> {
    if actual != expected {
        return Err(GemmaError::ShapeMismatch {
            tensor: role_name.to_string(),
            actual: actual.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

fn qtype_of(dtype: GgmlDType, tensor: &str) -> Result<QType> {
    Ok(match dtype {
        GgmlDType::F32 => QType::F32,
        GgmlDType::F16 => QType::F16,
        GgmlDType::Q4_0 => QType::Q4_0,
        GgmlDType::Q5_0 => QType::Q5_0,
        GgmlDType::Q8_0 => QType::Q8_0,
        GgmlDType::Q4K => QType::Q4_K,
        GgmlDType::Q5K => QType::Q5_K,
        GgmlDType::Q6K => QType::Q6_K,
        GgmlDType::Q8K => QType::Q8_K,
        other => {
            return Err(GemmaError::UnsupportedType {
                tensor: tensor.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    })
}

/// A memory-mapped GGUF file.
pub(crate) struct GgufSource {
    path: PathBuf,
    mmap: memmap2::Mmap,
    content: gguf_file::Content,
}

impl GgufSource {
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| GemmaError::io(path, e))?;
        // Buffered: the header holds the whole vocabulary (262k strings, scores and types),
        // which candle reads a field at a time: unbuffered, one system call each.
        let mut reader = std::io::BufReader::with_capacity(1 << 20, &file);
        let (content, _) = read_checked(&mut reader, path)?;
        // SAFETY: the file is opened read-only and the map lives as long as this source;
        // a model file being rewritten under a running process is outside our contract.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| GemmaError::io(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            mmap,
            content,
        })
    }

    /// The Gemma 3 config of the file's metadata.
    pub(crate) fn config(&self) -> Result<GemmaConfig> {
        config_from_gguf(&Header {
            content: &self.content,
            path: &self.path,
        })
    }

    fn raw(&self, name: &str) -> Result<(QType, Vec<usize>, &[u8])> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| GemmaError::MissingTensor(name.to_string()))?;
        let qtype = qtype_of(info.ggml_dtype, name)?;
        let extent = tensor_extent(&self.content, info, self.mmap.len() as u64)
            .map_err(|e| GemmaError::format(&self.path, format!("tensor {name}: {e}")))?;
        let bytes = &self.mmap[extent];
        Ok((qtype, info.shape.dims().to_vec(), bytes))
    }
}

impl TensorSource for GgufSource {
    fn matrix(&self, role: Role, n: usize, k: usize) -> Result<QMatrix> {
        let name = role.gguf_name();
        let (qtype, dims, bytes) = self.raw(&name)?;
        check_shape(&name, &dims, &[n, k])?;
        Ok(QMatrix::new(qtype, n, k, bytes.to_vec())?)
    }

    fn vector(&self, role: Role, len: usize) -> Result<Vec<f32>> {
        let name = role.gguf_name();
        let (qtype, dims, bytes) = self.raw(&name)?;
        check_shape(&name, &dims, &[len])?;
        let m = QMatrix::new(qtype, 1, len, bytes.to_vec()).map_err(|_| {
            GemmaError::UnsupportedType {
                tensor: name.clone(),
                dtype: format!("{qtype:?} (as a vector)"),
            }
        })?;
        let mut out = vec![0f32; len];
        m.dequantize_row(0, &mut out)?;
        Ok(out)
    }
}

/// A directory in the HF layout: `config.json` plus `model.safetensors` or shards listed by
/// `model.safetensors.index.json`.
pub(crate) struct HfSource {
    dir: PathBuf,
    tensors: MmapedSafetensors,
}

impl HfSource {
    pub(crate) fn open(dir: &Path) -> Result<(Self, GemmaConfig)> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| GemmaError::io(&cfg_path, e))?;
        let cfg = GemmaConfig::from_hf_json(&text).map_err(|e| match e {
            GemmaError::Config(reason) => GemmaError::format(&cfg_path, reason),
            other => other,
        })?;
        Ok((Self::open_tensors(dir)?, cfg))
    }

    /// Maps the safetensors files of `dir` without reading its config.
    pub(crate) fn open_tensors(dir: &Path) -> Result<Self> {
        let files = Self::shard_files(dir)?;
        // SAFETY: files are mapped read-only for the lifetime of the source.
        let tensors = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| {
            GemmaError::format(
                dir,
                format!("unreadable safetensors: {}", candle_message(&e)),
            )
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            tensors,
        })
    }

    /// Whether the checkpoint has a tensor called `name`.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.tensors.get(name).is_ok()
    }

    fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| GemmaError::io(&index, e))?;
            let value: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| GemmaError::format(&index, e.to_string()))?;
            let map = value
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| GemmaError::format(&index, "no weight_map object"))?;
            let mut files: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            files.sort();
            files.dedup();
            return files
                .into_iter()
                .map(|f| {
                    let p = dir.join(&f);
                    if p.is_file() {
                        Ok(p)
                    } else {
                        Err(GemmaError::io(&p, std::io::ErrorKind::NotFound.into()))
                    }
                })
                .collect();
        }
        let single = dir.join("model.safetensors");
        if !single.is_file() {
            return Err(GemmaError::io(&single, std::io::ErrorKind::NotFound.into()));
        }
        Ok(vec![single])
    }

    /// Tensor `name`, which must have shape `expected`, as f32 values.
    pub(crate) fn load_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let t = self.load_checked(name, expected)?;
        let t = t.to_dtype(candle_core::DType::F32)?.flatten_all()?;
        Ok(t.to_vec1::<f32>()?)
    }

    /// Integer tensor `name`, which must have shape `expected`, as i64 values.
    pub(crate) fn load_i64(&self, name: &str, expected: &[usize]) -> Result<Vec<i64>> {
        let t = self.load_checked(name, expected)?;
        if t.dtype().is_float() {
            return Err(GemmaError::UnsupportedType {
                tensor: name.to_string(),
                dtype: format!("{:?} (integers expected)", t.dtype()),
            });
        }
        let t = t.to_dtype(candle_core::DType::I64)?.flatten_all()?;
        Ok(t.to_vec1::<i64>()?)
    }

    fn load_checked(&self, name: &str, expected: &[usize]) -> Result<candle_core::Tensor> {
        let view = self
            .tensors
            .get(name)
            .map_err(|_| GemmaError::MissingTensor(name.to_string()))?;
        check_shape(name, view.shape(), expected)?;
        self.tensors
            .load(name, &candle_core::Device::Cpu)
            .map_err(|e| {
                GemmaError::format(&self.dir, format!("tensor {name}: {}", candle_message(&e)))
            })
    }
}

impl TensorSource for HfSource {
    fn matrix(&self, role: Role, n: usize, k: usize) -> Result<QMatrix> {
        let name = role.hf_name();
        let data = self.load_f32(&name, &[n, k])?;
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(QMatrix::new(QType::F32, n, k, bytes)?)
    }

    fn vector(&self, role: Role, len: usize) -> Result<Vec<f32>> {
        let mut v = self.load_f32(&role.hf_name(), &[len])?;
        if role.is_norm() {
            v.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok(v)
    }
}

/// Checks that `path` hashes to `expected` (hex SHA-256, case-insensitive).
pub fn verify_sha256(path: &Path, expected: &str) -> Result<()> {
    let mut file = std::fs::File::open(path).map_err(|e| GemmaError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| GemmaError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let actual: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if !actual.eq_ignore_ascii_case(expected.trim()) {
        return Err(GemmaError::Checksum {
            path: path.to_path_buf(),
            expected: expected.trim().to_lowercase(),
            actual,
        });
    }
    Ok(())
}
