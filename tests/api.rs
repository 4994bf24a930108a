//! The gRPC API's sampling controls and calls beyond Generate, end to end over real sockets
//! with the real Gemma 3 270M and two drafters: penalties, min_tokens, stop token ids and
//! log-probabilities through a speculating verifier equal the in-process plain generation;
//! the unary call equals the stream; a seeded sampled request repeats its text with or
//! without speculation; chat prompts are the rendered template; Tokenize and
//! Detokenize round-trip; out-of-range controls are refused with INVALID_ARGUMENT naming
//! the field.
#![allow(clippy::unwrap_used)]

use std::ops::ControlFlow;

use tandem_core::Penalties;
use tandem_e2e::*;
use tandem_engine::{GenerationRequest, Update};
use tandem_proto::v1 as pb;
use tandem_tokenizer::ChatMessage;

type Client = pb::generation_client::GenerationClient<tonic::transport::Channel>;

async fn client(url: &str) -> Client {
    Client::connect(url.to_string()).await.unwrap()
}

/// Greedy with penalties, min_tokens, a stop id and three log-probabilities per token.
fn controlled(prompt: &str, stop_id: Option<u32>) -> pb::GenerateRequest {
    pb::GenerateRequest {
        sampling: Some(pb::SamplingParams {
            repetition_penalty: Some(1.3),
            presence_penalty: Some(0.4),
            frequency_penalty: Some(0.3),
            ..Default::default()
        }),
        ignore_eos: false,
        min_tokens: Some(4),
        stop_token_ids: stop_id.into_iter().collect(),
        logprobs: Some(3),
        ..request(prompt, 24, true)
    }
}

/// The same generation in process, without speculation.
fn plain(prompt: &str, stop_id: Option<u32>) -> (Vec<u32>, Vec<tandem_core::TokenLogprob>) {
    let e = engine();
    let req = GenerationRequest {
        prompt: e.tokenizer().encode(prompt, true).unwrap(),
        max_tokens: 24,
        penalties: Penalties {
            repetition: 1.3,
            presence: 0.4,
            frequency: 0.3,
        },
        min_tokens: 4,
        stop_token_ids: stop_id.into_iter().collect(),
        logprobs: Some(3),
        ..GenerationRequest::default()
    };
    let mut lps = Vec::new();
    let out = e
        .generate(&req, None, &mut |u: &Update| {
            lps.extend(u.logprobs.clone());
            ControlFlow::Continue(())
        })
        .unwrap();
    (out.tokens, lps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controls_unary_chat_and_tokenizer_calls_through_the_services() {
    let (d1, d2) = (start_drafter().await, start_drafter().await);
    let setup = VerifierSetup {
        drafters: vec![d1.url.clone(), d2.url.clone()],
        ..Default::default()
    };
    let v = start_verifier(setup).await;
    let mut c = client(&v.url).await;
    for prompt in ["1, 2, 3, 4,", "Here is a shopping list:\n- eggs\n-"] {
        let (free, _) = tokio::task::spawn_blocking(move || plain(prompt, None))
            .await
            .unwrap();
        let stop_id = free[4..].iter().find(|t| !free[..4].contains(t)).copied();
        let (want, want_lps) = tokio::task::spawn_blocking(move || plain(prompt, stop_id))
            .await
            .unwrap();
        let mut stream = c
            .generate(controlled(prompt, stop_id))
            .await
            .unwrap()
            .into_inner();
        let (mut ids, mut lps, mut finished) = (Vec::new(), Vec::new(), None);
        while let Some(msg) = stream.message().await.unwrap() {
            assert_eq!(msg.logprobs.len(), msg.token_ids.len());
            ids.extend(msg.token_ids);
            lps.extend(msg.logprobs);
            finished = msg.finished.or(finished);
        }
        assert_eq!(ids, want, "{prompt:?}: speculative gRPC vs plain");
        assert_eq!(ids.last().copied(), stop_id);
        let finished = finished.unwrap();
        assert_eq!(finished.reason, pb::FinishReason::Stop as i32);
        assert!(finished.speculation.unwrap().drafts > 0);
        let want_lps: Vec<pb::TokenLogprob> = want_lps.iter().map(Into::into).collect();
        assert_eq!(lps, want_lps, "{prompt:?}");
        let unary = c
            .generate_unary(controlled(prompt, stop_id))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((unary.token_ids, unary.logprobs), (want, want_lps));
        assert_eq!(
            unary.finished.unwrap().reason,
            pb::FinishReason::Stop as i32
        );
    }
    check_seeded(&mut c).await;
    check_chat(&mut c).await;
    check_tokenizer_calls(&mut c).await;
    check_refusals(&mut c).await;
}

/// A seeded sampled request gives one text, speculating or not, every time.
async fn check_seeded(c: &mut Client) {
    let sampled = |seed: u64, speculative: bool| pb::GenerateRequest {
        sampling: Some(pb::SamplingParams {
            temperature: Some(0.9),
            seed: Some(seed),
            ..Default::default()
        }),
        ..request("Once upon a time,", 24, speculative)
    };
    let mut texts = Vec::new();
    for (seed, speculative) in [(4, true), (4, true), (4, false), (5, true)] {
        let out = c.generate_unary(sampled(seed, speculative)).await.unwrap();
        let out = out.into_inner();
        let spec = out.finished.unwrap().speculation.unwrap();
        assert!(!speculative || spec.drafts > 0, "{spec:?}");
        texts.push(out.token_ids);
    }
    assert_eq!(texts[0], texts[1]);
    assert_eq!(texts[0], texts[2], "the seed's text without speculation");
    assert_ne!(texts[0], texts[3], "another seed");
}

async fn check_chat(c: &mut Client) {
    let messages = vec![
        ChatMessage {
            role: "system".into(),
            content: "Answer briefly.".into(),
        },
        ChatMessage {
            role: "user".into(),
            content: "What is the capital of France?".into(),
        },
    ];
    let rendered = engine()
        .tokenizer()
        .chat_template()
        .unwrap()
        .render(&messages, true)
        .unwrap();
    let chat = pb::Chat {
        messages: messages
            .iter()
            .map(|m| pb::ChatMessage {
                role: m.role.clone(),
                content: m.content.clone(),
            })
            .collect(),
        add_generation_prompt: None,
    };
    let mut req = request("", 16, true);
    req.prompt = Some(pb::generate_request::Prompt::Chat(chat.clone()));
    let by_chat = c.generate_unary(req).await.unwrap().into_inner();
    let by_text = c
        .generate_unary(request(&rendered, 16, true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_chat.token_ids, by_text.token_ids);
    assert!(!by_chat.text.is_empty());
    let mut wrong = chat;
    wrong.messages.swap(0, 1);
    wrong.messages[0].role = "assistant".into();
    let mut req = request("", 16, true);
    req.prompt = Some(pb::generate_request::Prompt::Chat(wrong));
    let refused = c.generate_unary(req).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("alternate"), "{refused:?}");
}

async fn check_tokenizer_calls(c: &mut Client) {
    let text = "Grüße, world! 1 + 1 = 2";
    let tokens = c
        .tokenize(pb::TokenizeRequest {
            text: text.into(),
            add_special_tokens: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(tokens.ids, engine().tokenizer().encode(text, true).unwrap());
    assert_eq!(tokens.tokens[0], "<bos>");
    assert_eq!(tokens.tokens.len(), tokens.ids.len());
    let bare = c
        .tokenize(pb::TokenizeRequest {
            text: text.into(),
            add_special_tokens: Some(false),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bare.ids, tokens.ids[1..]);
    let detok = |ids: Vec<u32>, skip| pb::DetokenizeRequest {
        ids,
        skip_special_tokens: skip,
    };
    let back = c.detokenize(detok(tokens.ids.clone(), true)).await.unwrap();
    assert_eq!(back.into_inner().text, text);
    let with_bos = c.detokenize(detok(tokens.ids, false)).await.unwrap();
    assert_eq!(with_bos.into_inner().text, format!("<bos>{text}"));
    let refused = c.detokenize(detok(vec![5, 1 << 30], true)).await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::InvalidArgument);
}

async fn check_refusals(c: &mut Client) {
    let sampling = |f: fn(&mut pb::SamplingParams)| {
        let mut s = pb::SamplingParams::default();
        f(&mut s);
        Some(s)
    };
    let cases: Vec<(pb::GenerateRequest, &str)> = vec![
        (
            pb::GenerateRequest {
                sampling: sampling(|s| s.min_p = Some(1.5)),
                ..request("Hi", 8, true)
            },
            "min_p",
        ),
        (
            pb::GenerateRequest {
                sampling: sampling(|s| s.repetition_penalty = Some(0.0)),
                ..request("Hi", 8, true)
            },
            "repetition_penalty",
        ),
        (
            pb::GenerateRequest {
                sampling: sampling(|s| s.frequency_penalty = Some(3.0)),
                ..request("Hi", 8, true)
            },
            "frequency_penalty",
        ),
        (
            pb::GenerateRequest {
                logprobs: Some(21),
                ..request("Hi", 8, true)
            },
            "logprobs",
        ),
        (
            pb::GenerateRequest {
                min_tokens: Some(9),
                ..request("Hi", 8, true)
            },
            "min_tokens",
        ),
        (
            pb::GenerateRequest {
                stop_token_ids: vec![u32::MAX],
                ..request("Hi", 8, true)
            },
            "stop token",
        ),
    ];
    for (req, field) in cases {
        let refused = c.generate_unary(req).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(refused.message().contains(field), "{field}: {refused:?}");
    }
}
