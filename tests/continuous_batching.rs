//! Continuous batching through the services: a verifier whose generations share batched
//! target steps, speculating through two drafters, serves concurrent clients — greedy and
//! seeded sampled, of different lengths, joining a few steps apart and leaving at different
//! times — and every client gets exactly what an unbatched verifier without drafters gives
//! the same request alone. Its /metrics show steps that held several generations, and the
//! drafters' show drafting steps that held several sessions' blocks.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tandem_e2e::*;
use tandem_engine::{BatchLimits, Engine, Placement, TargetFiles};
use tandem_proto::v1 as pb;
use tandem_testkit::{real_gguf, real_tokenizer};

/// The real target, batched with small prefill chunks (so prompts take several steps) or
/// not batched at all.
fn real_engine(batching: Option<BatchLimits>) -> Engine {
    let files = TargetFiles {
        model: real_gguf(),
        tokenizer: real_tokenizer(),
    };
    Engine::load_batched(&files, &Placement::Cpu(Default::default()), batching)
        .expect("the real target")
}

const PROMPTS: [&str; 6] = [
    "The history of the printing press begins",
    "User: How do I boil an egg?\nAssistant:",
    "def quicksort(items):\n",
    "Dear Anna,\n\nThank you for the lovely",
    "Q: Why is the sky blue?\nA:",
    "The three most important rules of writing are",
];

/// Client `i`'s request: greedy or seeded sampling, of its own length.
fn request_of(i: usize, speculative: bool) -> pb::GenerateRequest {
    let mut req = request(PROMPTS[i], 10 + 7 * i as u32, speculative);
    if i % 2 == 1 {
        req.sampling = Some(pb::SamplingParams {
            temperature: Some(0.8),
            top_p: Some(0.95),
            seed: Some(40 + i as u64),
            ..Default::default()
        });
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_speculating_verifier_equals_unbatched_plain_runs() {
    let reference = start_verifier_for(real_engine(None), VerifierSetup::default()).await;
    let mut want = Vec::new();
    for i in 0..PROMPTS.len() {
        let (ids, ..) = generate(&reference.url, request_of(i, false))
            .await
            .unwrap();
        want.push(ids);
    }
    let d1 = start_drafter_on("127.0.0.1", shipped_drafter(), target()).await;
    let d2 = start_drafter_on("127.0.0.1", shipped_drafter(), target()).await;
    let setup = VerifierSetup {
        drafters: vec![d1.url.clone(), d2.url.clone()],
        gamma: 4,
        ..VerifierSetup::default()
    };
    let limits = BatchLimits {
        prefill_chunk: 8,
        ..BatchLimits::default()
    };
    let verifier = start_verifier_for(real_engine(Some(limits)), setup).await;
    let clients: Vec<_> = (0..PROMPTS.len())
        .map(|i| {
            let url = verifier.url.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(60 * i as u64)).await;
                generate_owned(url, request_of(i, true)).await
            })
        })
        .collect();
    for (i, client) in clients.into_iter().enumerate() {
        let (ids, _, finished) = client.await.unwrap().expect("a batched generation");
        assert_eq!(
            ids, want[i],
            "client {i} differs from its unbatched plain run"
        );
        assert_eq!(
            finished.usage.unwrap().completion_tokens as usize,
            want[i].len()
        );
    }
    let m = scrape(verifier.metrics).await;
    let steps = total(&m, "tandem_batch_sessions_per_step_count");
    let single = m
        .get("tandem_batch_sessions_per_step_bucket{le=\"1\"}")
        .copied()
        .unwrap_or(0.0);
    assert!(steps > 0.0, "no batched step was recorded");
    assert!(
        single < steps,
        "no step held two generations ({steps} steps)"
    );
    assert!(
        total(&m, "tandem_spec_draft_tokens_total") > 0.0,
        "nothing was drafted"
    );
    // The two drafter services share one batched proposer here, so each one's metrics see
    // every drafting step.
    let d = scrape(d1.metrics).await;
    let steps = total(&d, "tandem_drafter_batch_sessions_per_step_count");
    let sessions = total(&d, "tandem_drafter_batch_sessions_per_step_sum");
    assert!(steps > 0.0, "no batched drafting step was recorded");
    assert!(
        sessions > steps,
        "no drafting step held two sessions' blocks ({steps} steps)"
    );
}
