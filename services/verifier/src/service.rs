//! The `tandem.v1.Generation` service: thin handlers over [`Generations`], the core the
//! HTTP front end shares. The unary call is the stream gathered into one message.

use std::sync::Arc;
use std::time::Instant;

use tandem_proto::v1 as pb;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::client_stream::Item;
use crate::deadline;
use crate::error::VerifierError;
use crate::generations::Generations;

/// The client-facing gRPC service.
#[derive(Clone)]
pub struct GenerationService {
    core: Arc<Generations>,
}

impl GenerationService {
    /// The service over the generation core.
    pub fn new(core: Arc<Generations>) -> Self {
        Self { core }
    }

    /// A generation of `request` within its `grpc-timeout`.
    async fn start(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<tokio::sync::mpsc::Receiver<Item>, Status> {
        let started = Instant::now();
        let deadline =
            deadline::timeout(request.metadata())?.map(|t| started + deadline::answer_within(t));
        self.core.start(request.into_inner(), deadline).await
    }
}

type GenerateStream = ReceiverStream<Item>;

#[tonic::async_trait]
impl pb::generation_server::Generation for GenerationService {
    type GenerateStream = GenerateStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<GenerateStream>, Status> {
        let rx = self.start(request).await?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn generate_unary(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<pb::GenerateResponse>, Status> {
        let rx = self.start(request).await?;
        Ok(Response::new(gather(rx).await?))
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        Ok(Response::new(self.core.tokenize(&request.into_inner())?))
    }

    async fn detokenize(
        &self,
        request: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        Ok(Response::new(self.core.detokenize(&request.into_inner())?))
    }

    async fn get_model_info(
        &self,
        _: Request<pb::GetModelInfoRequest>,
    ) -> Result<Response<pb::ModelInfo>, Status> {
        Ok(Response::new(self.core.model_info()))
    }
}

/// A generation's stream gathered into one message: every token, the whole text, every
/// log-probability and the finish; the status that ended it otherwise.
pub(crate) async fn gather(
    mut rx: tokio::sync::mpsc::Receiver<Item>,
) -> Result<pb::GenerateResponse, Status> {
    let mut all = pb::GenerateResponse::default();
    while let Some(item) = rx.recv().await {
        let msg = item?;
        all.token_ids.extend(msg.token_ids);
        all.text.push_str(&msg.text);
        all.logprobs.extend(msg.logprobs);
        if msg.finished.is_some() {
            all.finished = msg.finished;
            return Ok(all);
        }
    }
    Err(VerifierError::Unavailable("the generation ended without a finish".into()).into())
}
