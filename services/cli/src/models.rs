//! Where the default models live and how the CLI loads them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use std::sync::{Once, OnceLock};

use candle_core::{DType, Device};
use tandem_engine::{BatchLimits, Engine, Placement, TargetFiles};
use tandem_gemma::{
    prepare_device, DeviceGemma3, DeviceOptions, Gemma3, LoadOptions, Precision, TargetHead,
};
use tandem_kernels::Isa;
use tandem_tokenizer::GemmaTokenizer;

/// File name of the default target inside the models folder.
const DEFAULT_GGUF: &str = "gemma-3-270m/gemma-3-270m-q4_k_m.gguf";
/// File name of the default tokenizer inside the models folder.
const DEFAULT_TOKENIZER: &str = "gemma-3-tokenizer/tokenizer.json";

/// Model selection flags shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Target model: a .gguf file or an HF directory (config.json + safetensors).
    #[arg(long, env = "TANDEM_MODEL")]
    pub model: Option<PathBuf>,
    /// tokenizer.json of the target.
    #[arg(long, env = "TANDEM_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,
    /// Folder that scripts/fetch-models.sh fills (default ~/.cache/tandem/models).
    #[arg(long, env = "TANDEM_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// Check the model file against this SHA-256 before loading.
    #[arg(long)]
    pub model_sha256: Option<String>,
    /// Activation precision of quantized matmuls: `exact` (f32, what transformers computes)
    /// or `int8` (llama.cpp-style 8-bit activations).
    #[arg(long, env = "TANDEM_PRECISION", value_enum, default_value_t = PrecisionArg::Exact)]
    pub precision: PrecisionArg,
    /// Where a Gemma 3 target runs, and a DSpark drafter with it: `cpu` (tandem's
    /// batch-invariant kernels) or `cuda` / `cuda:N` (candle's CUDA backend, in a build with
    /// `--features cuda`).
    #[arg(long, env = "TANDEM_DEVICE", default_value = "cpu")]
    pub device: DeviceArg,
    /// Weights and activations of a `cuda` target.
    #[arg(long, env = "TANDEM_DTYPE", value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// Run a `cuda` target's decode and verify steps (one sequence, at most 32 tokens, a
    /// context of at most 4,096) and a DSpark drafter's steps beside it as CUDA graphs,
    /// replayed in one launch each.
    #[arg(long, env = "TANDEM_CUDA_GRAPHS", default_value_t = true, action = clap::ArgAction::Set)]
    pub cuda_graphs: bool,
    /// Fastest family of CPU matmul kernels to use: `portable`, `avx2`, `avx-vnni` or `amx`
    /// (default: the fastest this CPU has). The family decides the last bits of the results;
    /// capping every replica at `avx-vnni` makes all x86-64 CPUs with AVX2 return the same
    /// bits.
    #[arg(long, env = "TANDEM_MAX_CPU_KERNELS")]
    pub max_cpu_kernels: Option<Isa>,
    /// The CUDA device once opened, so that a target and a drafter of one process share
    /// it (one setup, one cuBLAS handle, one set of loaded kernels).
    #[arg(skip)]
    opened: OnceLock<Device>,
}

/// `--device` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// The CPU kernels.
    Cpu,
    /// CUDA GPU with this ordinal.
    Cuda(usize),
}

impl std::str::FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| format!("unknown device {s:?}: expected cpu, cuda or cuda:N")),
        }
    }
}

impl std::fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// `--dtype` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeArg {
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl From<DtypeArg> for DType {
    fn from(d: DtypeArg) -> Self {
        match d {
            DtypeArg::F32 => DType::F32,
            DtypeArg::Bf16 => DType::BF16,
            DtypeArg::F16 => DType::F16,
        }
    }
}

/// `--precision` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrecisionArg {
    /// f32 activations, exactly dequantized weights.
    Exact,
    /// 8-bit activations per block (llama.cpp style).
    Int8,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Exact => Precision::Exact,
            PrecisionArg::Int8 => Precision::Int8,
        }
    }
}

impl ModelArgs {
    fn models_dir(&self) -> PathBuf {
        self.models_dir.clone().unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
            home.join(".cache/tandem/models")
        })
    }

    fn resolve(&self, explicit: &Option<PathBuf>, default: &str, what: &str) -> Result<PathBuf> {
        let path = explicit
            .clone()
            .unwrap_or_else(|| self.models_dir().join(default));
        if !path.exists() {
            bail!(
                "{what} not found at {}; run scripts/fetch-models.sh or pass --{what}",
                path.display()
            );
        }
        Ok(path)
    }

    /// The target model's path, checked against `--model-sha256` when given.
    pub fn model_path(&self) -> Result<PathBuf> {
        let path = self.resolve(&self.model, DEFAULT_GGUF, "model")?;
        if let Some(sum) = &self.model_sha256 {
            tandem_gemma::verify_sha256(&path, sum)?;
        }
        Ok(path)
    }

    /// Applies `--max-cpu-kernels` and returns the CPU kernels that will run (logged once
    /// per process).
    pub fn cpu_kernels(&self) -> Result<Isa> {
        static LOGGED: Once = Once::new();
        if let Some(max) = self.max_cpu_kernels {
            Isa::set_max(max)?;
        }
        let isa = Isa::detect();
        LOGGED.call_once(|| tracing::info!(kernels = %isa, "CPU kernels"));
        Ok(isa)
    }

    /// Loads only the target's embedding and output head (what a drafter needs).
    pub fn load_head(&self) -> Result<TargetHead> {
        self.cpu_kernels()?;
        let path = self.model_path()?;
        TargetHead::load(&path).with_context(|| format!("loading {}", display(&path)))
    }

    /// Loads the target (Gemma 4 when `--model` is an HF directory whose config says
    /// `gemma4*`, Gemma 3 otherwise, on `--device`) and its tokenizer into an engine.
    pub fn load_engine(&self) -> Result<Engine> {
        self.load_engine_batched(None)
    }

    /// [`Self::load_engine`], with concurrent generations' forwards batched within
    /// `batching` (Gemma 3 targets).
    pub fn load_engine_batched(&self, batching: Option<BatchLimits>) -> Result<Engine> {
        let files = TargetFiles {
            model: self.model_path()?,
            tokenizer: self.tokenizer_path()?,
        };
        Ok(Engine::load_batched(&files, &self.placement()?, batching)?)
    }

    /// Where `--device`, `--precision` and `--dtype` place the target.
    fn placement(&self) -> Result<Placement> {
        Ok(match self.device {
            DeviceArg::Cpu => {
                self.cpu_kernels()?;
                Placement::Cpu(LoadOptions {
                    precision: self.precision.into(),
                })
            }
            DeviceArg::Cuda(n) => Placement::Device(self.device_options(n)?),
        })
    }

    /// Loads the Gemma 3 target onto the `--device` GPU, and its tokenizer.
    pub fn load_device(&self) -> Result<(DeviceGemma3, GemmaTokenizer)> {
        let DeviceArg::Cuda(n) = self.device else {
            bail!("--device cpu has no device model: pass --device cuda");
        };
        let (path, tok) = (self.model_path()?, self.load_tokenizer()?);
        Ok((self.device_gemma3_at(&path, n)?, tok))
    }

    /// Loads the Gemma 3 target on the CPU kernels (whatever `--device` says) and its
    /// tokenizer.
    pub fn load(&self) -> Result<(Gemma3, GemmaTokenizer)> {
        let (path, tok) = (self.model_path()?, self.load_tokenizer()?);
        Ok((self.gemma3_at(&path)?, tok))
    }

    fn tokenizer_path(&self) -> Result<PathBuf> {
        self.resolve(&self.tokenizer, DEFAULT_TOKENIZER, "tokenizer")
    }

    /// The target's tokenizer.
    pub fn load_tokenizer(&self) -> Result<GemmaTokenizer> {
        Ok(GemmaTokenizer::from_file(&self.tokenizer_path()?)?)
    }

    /// The Gemma 3 at the checked `path` on the CPU kernels.
    fn gemma3_at(&self, path: &Path) -> Result<Gemma3> {
        self.cpu_kernels()?;
        let opts = LoadOptions {
            precision: self.precision.into(),
        };
        Gemma3::load_with(path, &opts).with_context(|| format!("loading {}", display(path)))
    }

    /// The candle device `--device` names, `None` for the CPU kernels.
    pub fn candle_device(&self) -> Result<Option<Device>> {
        match self.device {
            DeviceArg::Cpu => Ok(None),
            DeviceArg::Cuda(n) => self.cuda(n).map(Some),
        }
    }

    /// The Gemma 3 at the checked `path` on CUDA device `n`.
    fn device_gemma3_at(&self, path: &Path, n: usize) -> Result<DeviceGemma3> {
        DeviceGemma3::load(path, self.device_options(n)?)
            .with_context(|| format!("loading {} onto cuda:{n}", display(path)))
    }

    /// How a target runs on CUDA device `n` (`--dtype`, `--cuda-graphs`).
    fn device_options(&self, n: usize) -> Result<DeviceOptions> {
        Ok(DeviceOptions {
            graphs: self.cuda_graphs,
            ..DeviceOptions::new(self.cuda(n)?, self.dtype.into())
        })
    }

    /// CUDA device `n`, opened and prepared for launch-bound work ([`prepare_device`]) on
    /// first use.
    fn cuda(&self, n: usize) -> Result<Device> {
        if let Some(device) = self.opened.get() {
            return Ok(device.clone());
        }
        let device = Device::new_cuda(n).with_context(|| {
            format!("opening CUDA device {n} (is this a build with --features cuda?)")
        })?;
        prepare_device(&device)?;
        Ok(self.opened.get_or_init(|| device).clone())
    }

    /// How the target runs, for reports: `cpu exact avx-vnni`, `cuda:0 f32`, ...
    pub fn backend(&self) -> String {
        match self.device {
            DeviceArg::Cpu => format!("cpu {:?} {}", self.precision, Isa::detect()).to_lowercase(),
            DeviceArg::Cuda(_) => format!("{} {:?}", self.device, self.dtype).to_lowercase(),
        }
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}
