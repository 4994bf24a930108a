//! `tandem generate --server URL`: the same request sent to a verifier over gRPC (TLS for
//! an `https://` URL, a bearer token when the verifier wants one), its text streamed to
//! stdout and its statistics to stderr.

use crate::controls::ControlArgs;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use pb::generation_client::GenerationClient;
use tandem_core::{SamplingParams, Verification};
use tandem_proto::codec::sampling_to_pb;
use tandem_proto::v1 as pb;
use tandem_serving::{endpoint, ClientTlsFiles};
use tonic::metadata::{Ascii, MetadataValue};

/// How the client reaches a secured verifier.
#[derive(Args, Debug, Clone)]
pub struct ServerAccess {
    /// PEM CA bundle the verifier's certificate must chain to (for an `https://` --server).
    #[arg(long, env = "TANDEM_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Name the verifier's certificate carries, when it differs from the URL's host.
    #[arg(long, env = "TANDEM_TLS_DOMAIN", requires = "tls_ca")]
    tls_domain: Option<String>,
    /// Bearer token sent as `authorization: Bearer <token>` (prefer the environment
    /// variable: a flag shows in the process list).
    #[arg(long, env = "TANDEM_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

impl ServerAccess {
    /// A client of the verifier at `url`.
    async fn connect(&self, url: &str) -> Result<GenerationClient<Authorized>> {
        let tls = match &self.tls_ca {
            Some(ca) => Some(
                ClientTlsFiles {
                    ca: ca.clone(),
                    identity: None,
                    domain: self.tls_domain.clone(),
                }
                .load()?,
            ),
            None => None,
        };
        let token: Option<MetadataValue<Ascii>> = match &self.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .context("the token has characters a header cannot carry")?,
            ),
            None => None,
        };
        let channel = endpoint(url, tls.as_ref())?
            .connect()
            .await
            .with_context(|| format!("cannot connect to {url}"))?;
        Ok(GenerationClient::with_interceptor(
            channel,
            Authorization(token),
        ))
    }
}

/// Adds the bearer token, when there is one, to every call.
#[derive(Clone)]
struct Authorization(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Authorization {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            req.metadata_mut().insert("authorization", token.clone());
        }
        Ok(req)
    }
}

type Authorized =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Authorization>;

/// What the client sends.
pub struct RemoteRequest {
    /// Prompt text.
    pub prompt: String,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep going past EOS.
    pub ignore_eos: bool,
    /// Speculation on or off, and a γ cap.
    pub speculative: bool,
    /// γ cap.
    pub gamma: usize,
    /// How sampled rounds verify drafts (unset: the server's default).
    pub verification: Option<Verification>,
    /// Confidence cuts on or off (unset: the server's default).
    pub confidence_cuts: Option<bool>,
    /// Penalties, min-p, min_tokens and stop token ids.
    pub controls: ControlArgs,
}

/// Streams a generation from the verifier at `url`, reached as `access` says.
pub fn generate(url: &str, access: &ServerAccess, r: &RemoteRequest) -> Result<pb::Finished> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut client = access.connect(url).await?;
        let mut req = pb::GenerateRequest {
            prompt: Some(pb::generate_request::Prompt::Text(r.prompt.clone())),
            sampling: Some(sampling_to_pb(&r.sampling)),
            max_tokens: Some(r.max_tokens as u32),
            stop: r.stop.clone(),
            ignore_eos: r.ignore_eos,
            speculative: Some(r.speculative),
            max_gamma: Some(r.gamma as u32),
            verification: r
                .verification
                .map_or(pb::Verification::Unspecified, Into::into) as i32,
            confidence_cuts: r.confidence_cuts,
            ..pb::GenerateRequest::default()
        };
        r.controls.apply_pb(&mut req);
        let mut stream = client
            .generate(req)
            .await
            .map_err(|s| anyhow::anyhow!("{}", s.message()))?
            .into_inner();
        let mut stdout = std::io::stdout().lock();
        while let Some(msg) = stream
            .message()
            .await
            .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        {
            stdout.write_all(msg.text.as_bytes())?;
            stdout.flush()?;
            if let Some(f) = msg.finished {
                return Ok(f);
            }
        }
        bail!("the server ended the stream without a finish message")
    })
}

/// Sends `req` through `client` and returns the finish message of its stream, ignoring the
/// chunks before it.
pub async fn finished(
    client: &mut GenerationClient<tonic::transport::Channel>,
    req: pb::GenerateRequest,
) -> Result<pb::Finished> {
    let mut stream = client.generate(req).await?.into_inner();
    let mut finished = None;
    while let Some(msg) = stream.message().await? {
        finished = msg.finished.or(finished);
    }
    finished.context("the verifier ended a stream without a finish message")
}

/// One line of figures from the finish message.
pub fn summary(f: &pb::Finished) -> String {
    let reason = pb::FinishReason::try_from(f.reason).map_or("unknown", |r| r.as_str_name());
    let usage = f.usage.unwrap_or_default();
    let spec = f.speculation.clone().unwrap_or_default();
    let decode_s = (f.total_seconds - f.ttft_seconds).max(1e-9);
    format!(
        "prompt {} tokens | generated {} tokens ({}), ttft {:.0} ms, decode {:.1} tok/s | mean acceptance length {:.2} over {} rounds",
        usage.prompt_tokens,
        usage.completion_tokens,
        reason.trim_start_matches("FINISH_REASON_").to_lowercase(),
        f.ttft_seconds * 1000.0,
        usage.completion_tokens.saturating_sub(1) as f64 / decode_s,
        spec.mean_acceptance_length,
        spec.drafts,
    )
}
