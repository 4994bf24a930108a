//! The shared half of the proposer: the assistant, the target's embedding and where each
//! snapshot part sits, checked once against the target's config.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use tandem_core::calibration::Calibration;
use tandem_core::TargetIdentity;
use tandem_core::{
    PartSpec, ProposeError, Proposer, ProposerSession, Sampler, SamplingParams, SnapshotPart,
    SnapshotSpec,
};
use tandem_gemma::gemma4::{AssistantConfig, Gemma4Assistant, Gemma4Config, Gemma4Embedding};

use crate::error::AssistantError;
use crate::session::AssistantSession;

/// XORed into the request seed, so that a session's draws are not the verifier's.
pub const DRAFT_SEED_MIX: u64 = 0xA55_1574_D7AF_7E44;

/// Settings of an [`AssistantProposer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssistantOptions {
    /// The largest γ one proposal may ask for.
    pub max_gamma: usize,
}

impl Default for AssistantOptions {
    fn default() -> Self {
        Self { max_gamma: 8 }
    }
}

/// One donor layer of the target: its index and key/value geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DonorLayer {
    pub(crate) layer: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
}

impl DonorLayer {
    pub(crate) fn width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// Where each part sits in a snapshot row.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) hidden: Range<usize>,
    /// Keys and values of the sliding donor, then of the full donor.
    pub(crate) donors: [(Range<usize>, Range<usize>); 2],
}

/// What sessions share.
pub(crate) struct Shared {
    pub(crate) model: Arc<Gemma4Assistant>,
    pub(crate) embedding: Gemma4Embedding,
    pub(crate) spec: SnapshotSpec,
    pub(crate) layout: Layout,
    /// The sliding donor, then the full one.
    pub(crate) donors: [DonorLayer; 2],
    pub(crate) max_gamma: usize,
}

/// The Gemma 4 assistant drafter as a proposer for one Gemma 4 target.
pub struct AssistantProposer {
    shared: Arc<Shared>,
    identity: TargetIdentity,
    calibration: Option<Arc<Calibration>>,
}

impl AssistantProposer {
    /// Loads the assistant from `assistant_dir` and only the config and input embedding of
    /// the target from `target_dir`, and checks that they fit each other.
    pub fn load(
        assistant_dir: &Path,
        target_dir: &Path,
        opts: AssistantOptions,
    ) -> Result<Self, AssistantError> {
        let model = Arc::new(Gemma4Assistant::load(assistant_dir)?);
        let (cfg, embedding) = Gemma4Embedding::load(target_dir)?;
        Self::new(model, &cfg, embedding, opts)
    }

    /// A proposer over a loaded assistant, for the target described by `target` whose input
    /// embedding is `embedding`.
    pub fn new(
        model: Arc<Gemma4Assistant>,
        target: &Gemma4Config,
        embedding: Gemma4Embedding,
        opts: AssistantOptions,
    ) -> Result<Self, AssistantError> {
        check_sizes(model.config(), target, &embedding, opts)?;
        let sliding = donor(model.config(), target, true)?;
        let full = donor(model.config(), target, false)?;
        let (h, w) = (target.hidden_size, [sliding.width(), full.width()]);
        let mut parts = vec![PartSpec {
            part: SnapshotPart::Tap(target.num_layers()),
            width: h,
        }];
        for (d, width) in [sliding, full].into_iter().zip(w) {
            for part in [
                SnapshotPart::DonorKey(d.layer),
                SnapshotPart::DonorValue(d.layer),
            ] {
                parts.push(PartSpec { part, width });
            }
        }
        let range = |start: usize, len: usize| start..start + len;
        let full_at = h + 2 * w[0];
        let layout = Layout {
            hidden: 0..h,
            donors: [
                (range(h, w[0]), range(h + w[0], w[0])),
                (range(full_at, w[1]), range(full_at + w[1], w[1])),
            ],
        };
        let identity = embedding.identity()?;
        let shared = Shared {
            model,
            embedding,
            spec: SnapshotSpec { parts },
            layout,
            donors: [sliding, full],
            max_gamma: opts.max_gamma,
        };
        Ok(Self {
            shared: Arc::new(shared),
            identity,
            calibration: None,
        })
    }

    /// The target this proposer drafts for.
    pub fn target(&self) -> &TargetIdentity {
        &self.identity
    }

    /// The same proposer calibrating its confidences with `calibration` (none: raw).
    pub fn with_calibration(self, calibration: Option<Calibration>) -> Self {
        Self {
            calibration: calibration.map(Arc::new),
            ..self
        }
    }
}

fn mismatch<T>(msg: String) -> Result<T, AssistantError> {
    Err(AssistantError::Mismatch(msg))
}

fn check_sizes(
    a: &AssistantConfig,
    target: &Gemma4Config,
    embedding: &Gemma4Embedding,
    opts: AssistantOptions,
) -> Result<(), AssistantError> {
    if a.backbone_hidden_size != target.hidden_size || embedding.width() != target.hidden_size {
        return mismatch(format!(
            "backbone_hidden_size {} is not the target's hidden size {}",
            a.backbone_hidden_size, target.hidden_size
        ));
    }
    if a.text.vocab_size != target.vocab_size {
        return mismatch(format!(
            "vocabulary of {} tokens, the target has {}",
            a.text.vocab_size, target.vocab_size
        ));
    }
    if opts.max_gamma == 0 {
        return mismatch("max_gamma must be at least 1".into());
    }
    Ok(())
}

/// The target's donor layer of one type, checked against the assistant's layers of it.
fn donor(
    a: &AssistantConfig,
    target: &Gemma4Config,
    sliding: bool,
) -> Result<DonorLayer, AssistantError> {
    let kind = if sliding { "sliding" } else { "full" };
    let Some(layer) = target.donor_layer(sliding) else {
        return mismatch(format!("the target has no non-shared {kind} layer"));
    };
    let spec = target.layers[layer];
    let heads = a.text.num_attention_heads;
    for (i, l) in a.text.layers.iter().enumerate() {
        if l.sliding == sliding
            && (l.head_dim != spec.head_dim || !heads.is_multiple_of(spec.kv_heads))
        {
            return mismatch(format!(
                "assistant layer {i} has {heads} heads of {}, the target's {kind} donor \
                 (layer {layer}) has {} key/value heads of {}",
                l.head_dim, spec.kv_heads, spec.head_dim
            ));
        }
    }
    Ok(DonorLayer {
        layer,
        kv_heads: spec.kv_heads,
        head_dim: spec.head_dim,
    })
}

impl Proposer for AssistantProposer {
    fn snapshot_spec(&self) -> SnapshotSpec {
        self.shared.spec.clone()
    }

    fn max_gamma(&self) -> usize {
        self.shared.max_gamma
    }

    /// A session drafting with `sampling`, its random stream seeded from
    /// `sampling.seed ^` [`DRAFT_SEED_MIX`], not the verifier's.
    fn open(&self, sampling: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        let params = SamplingParams {
            seed: sampling.seed ^ DRAFT_SEED_MIX,
            ..*sampling
        };
        let sampler = Sampler::new(params).map_err(|e| ProposeError::Invalid(e.to_string()))?;
        let regime = self
            .calibration
            .as_ref()
            .and_then(|c| c.regime(sampling.temperature))
            .cloned();
        Ok(Box::new(AssistantSession::new(
            Arc::clone(&self.shared),
            sampler,
            regime,
        )))
    }
}
