//! The verifier's OpenAI-compatible HTTP API end to end, over raw HTTP/1.1 on 127.0.0.1
//! with the real Gemma 3 270M: greedy completions and chat, streamed and not, equal gRPC
//! Generate and plain decoding with speculation on; stop strings, `max_tokens`,
//! log-probabilities, seeds and `n`; models, tokenize, detokenize and health; bad requests
//! answered in OpenAI's error shape with the right status, counted by endpoint and status;
//! HTTPS with bearer tokens (401 in OpenAI's shape, counted; health open); a draining
//! server finishes a running stream and refuses new requests with 503.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::ops::ControlFlow;

use serde_json::{json, Value};
use tandem_e2e::http::{get, post, raw, raw_tls, Reply};
use tandem_e2e::*;
use tandem_engine::{GenerationRequest, Update};
use tandem_proto::v1 as pb;
use tandem_verifier::DEFAULT_SERVED_MODEL_NAME as MODEL;

const PROMPT: &str = "The capital of France is";
const NEW_TOKENS: u32 = 8;

/// Greedy plain decoding (no drafter) of `prompt`, in process.
fn plain(prompt: &str) -> String {
    let e = engine();
    let req = GenerationRequest {
        prompt: e.tokenizer().encode(prompt, true).unwrap(),
        max_tokens: NEW_TOKENS as usize,
        ignore_eos: true,
        ..GenerationRequest::default()
    };
    let out = e
        .generate(&req, None, &mut |_: &Update| ControlFlow::Continue(()))
        .unwrap();
    e.tokenizer().decode(&out.tokens).unwrap()
}

async fn verifier(drafters: Vec<String>) -> Node {
    start_verifier(VerifierSetup {
        drafters,
        http: true,
        ..Default::default()
    })
    .await
}

/// A greedy completion body for `prompt` with `extra` fields.
fn completion(prompt: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL, "prompt": prompt, "max_tokens": NEW_TOKENS,
        "temperature": 0, "ignore_eos": true,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL, "messages": [{"role": "user", "content": content}],
        "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": true,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The JSON payloads of a stream, which must end with `[DONE]`.
fn chunks(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let mut events = reply.events();
    assert_eq!(events.pop().as_deref(), Some("[DONE]"), "{}", reply.body);
    events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

async fn ok(addr: SocketAddr, path: &str, body: &Value) -> Value {
    let reply = post(addr, path, body).await;
    assert_eq!(reply.status, 200, "{path} {body}: {}", reply.body);
    reply.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn greedy_http_equals_grpc_and_plain_decoding_with_speculation() {
    let d = start_drafter().await;
    let v = verifier(vec![d.url.clone()]).await;
    let addr = v.http.unwrap();
    let want = tokio::task::spawn_blocking(|| plain(PROMPT)).await.unwrap();
    let (_, grpc, _) = generate(&v.url, request(PROMPT, NEW_TOKENS, true))
        .await
        .unwrap();
    assert_eq!(grpc, want, "gRPC vs plain");

    let r = ok(addr, "/v1/completions", &completion(PROMPT, json!({}))).await;
    assert_eq!(r["object"], "text_completion");
    assert!(r["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(r["model"], MODEL);
    assert_eq!(r["choices"][0]["text"], want, "HTTP vs plain");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["choices"][0]["index"], 0);
    let usage = &r["usage"];
    assert_eq!(usage["completion_tokens"], NEW_TOKENS);
    let sum = usage["prompt_tokens"].as_u64().unwrap() + u64::from(NEW_TOKENS);
    assert_eq!(usage["total_tokens"], sum);

    let body = completion(
        PROMPT,
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let events = chunks(&post(addr, "/v1/completions", &body).await);
    let text: String = events
        .iter()
        .flat_map(|e| e["choices"].as_array().unwrap())
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, want, "streamed HTTP vs plain");
    let (usage_chunk, rest) = events.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], NEW_TOKENS);
    assert_eq!(
        rest.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert!(events.iter().all(|e| e["object"] == "text_completion"));

    let question = "What is the capital of France?";
    let wire = pb::GenerateRequest {
        prompt: Some(pb::generate_request::Prompt::Chat(pb::Chat {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: question.into(),
            }],
            add_generation_prompt: Some(true),
        })),
        ..request("", NEW_TOKENS, true)
    };
    let (_, grpc_chat, _) = generate(&v.url, wire).await.unwrap();
    let r = ok(addr, "/v1/chat/completions", &chat(question, json!({}))).await;
    assert_eq!(r["object"], "chat.completion");
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["choices"][0]["message"]["content"], grpc_chat);
    assert_eq!(r["choices"][0]["finish_reason"], "length");

    let parts = json!([{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]);
    let mut body = chat("", json!({"stream": true}));
    body["messages"][0]["content"] = parts;
    let events = chunks(&post(addr, "/v1/chat/completions", &body).await);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, grpc_chat, "streamed chat (text parts joined) vs gRPC");
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert!(events
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk"));

    let m = scrape(v.metrics).await;
    assert!(
        total(&m, "tandem_spec_drafts_total") > 0.0,
        "speculation ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_length_logprobs_seeds_and_n() {
    let v = verifier(Vec::new()).await;
    let addr = v.http.unwrap();
    let text = |r: &Value, i: usize| r["choices"][i]["text"].as_str().unwrap().to_string();

    let full = text(
        &ok(
            addr,
            "/v1/completions",
            &completion("1, 2, 3, 4,", json!({})),
        )
        .await,
        0,
    );
    let cut = full
        .char_indices()
        .map(|(i, _)| i)
        .find(|i| *i >= full.len() / 2)
        .unwrap();
    let stop: String = full[cut..].chars().take(2).collect();
    let expected = &full[..full.find(&stop).unwrap()];
    let r = ok(
        addr,
        "/v1/completions",
        &completion("1, 2, 3, 4,", json!({"stop": [stop]})),
    )
    .await;
    assert_eq!(
        text(&r, 0),
        expected,
        "cut before the stop string {stop:?} of {full:?}"
    );
    assert_eq!(r["choices"][0]["finish_reason"], "stop");

    let r = ok(
        addr,
        "/v1/completions",
        &completion(PROMPT, json!({"max_tokens": 3})),
    )
    .await;
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 3);

    let r = ok(
        addr,
        "/v1/completions",
        &completion(PROMPT, json!({"logprobs": 3})),
    )
    .await;
    let lp = &r["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), NEW_TOKENS as usize);
    assert_eq!(
        tokens
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<String>(),
        text(&r, 0)
    );
    for (i, token) in tokens.iter().enumerate() {
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen <= 0.0);
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 3);
        let best = top
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((top[token.as_str().unwrap()].as_f64().unwrap() - best).abs() < 1e-6);
    }
    assert_eq!(lp["text_offset"][0], 0);

    let body = chat(
        "Name a color.",
        json!({"logprobs": true, "top_logprobs": 2}),
    );
    let r = ok(addr, "/v1/chat/completions", &body).await;
    for entry in r["choices"][0]["logprobs"]["content"].as_array().unwrap() {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        assert!(
            top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64(),
            "sorted"
        );
        assert_eq!(
            top[0]["token"], entry["token"],
            "greedy picks the most likely"
        );
        assert_eq!(top[0]["logprob"], entry["logprob"]);
        let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).unwrap();
        assert_eq!(bytes, entry["token"].as_str().unwrap().as_bytes());
    }

    let sampled = |seed: u64, n: u32| {
        completion(
            "Once upon a time,",
            json!({"temperature": 0.8, "seed": seed, "n": n}),
        )
    };
    let a = ok(addr, "/v1/completions", &sampled(11, 1)).await;
    let again = ok(addr, "/v1/completions", &sampled(11, 1)).await;
    let b = ok(addr, "/v1/completions", &sampled(12, 1)).await;
    assert_eq!(text(&a, 0), text(&again, 0), "the same seed, the same text");
    assert_ne!(text(&a, 0), text(&b, 0), "another seed, another text");
    let two = ok(addr, "/v1/completions", &sampled(11, 2)).await;
    assert_eq!(two["choices"].as_array().unwrap().len(), 2);
    assert_eq!(two["choices"][1]["index"], 1);
    assert_eq!(
        text(&two, 0),
        text(&a, 0),
        "choice 0 is seeded with the seed"
    );
    assert_eq!(text(&two, 1), text(&b, 0), "choice 1 with seed + 1");
    assert_eq!(two["usage"]["completion_tokens"], 2 * NEW_TOKENS);
}

/// The status and OpenAI error of a refused request.
fn refused(reply: &Reply, status: u16, what: &str) -> Value {
    assert_eq!(reply.status, status, "{what}: {}", reply.body);
    let body = reply.json();
    let error = &body["error"];
    assert!(error["message"].is_string(), "{what}: {body}");
    assert!(error["type"].is_string(), "{what}: {body}");
    assert!(
        error.get("param").is_some() && error.get("code").is_some(),
        "{what}: {body}"
    );
    error.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn models_tokenize_and_bad_requests_in_openai_shape() {
    let v = verifier(Vec::new()).await;
    let addr = v.http.unwrap();
    assert_eq!(get(addr, "/health").await.status, 200);
    let models = get(addr, "/v1/models").await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["owned_by"], "tandem");
    let one = get(addr, &format!("/v1/models/{MODEL}")).await;
    assert_eq!(one.json()["id"], MODEL);
    let e = refused(&get(addr, "/v1/models/gpt-4").await, 404, "unknown model");
    assert_eq!(e["code"], "model_not_found");

    let t = ok(addr, "/tokenize", &json!({"prompt": PROMPT})).await;
    let ids = engine().tokenizer().encode(PROMPT, true).unwrap();
    assert_eq!(t["tokens"], json!(ids));
    assert_eq!(t["count"], ids.len());
    assert!(t["max_model_len"].as_u64().unwrap() > 0);
    let d = ok(addr, "/detokenize", &json!({"tokens": ids[1..]})).await;
    assert_eq!(d["prompt"], PROMPT);

    let c = "/v1/completions";
    let ch = "/v1/chat/completions";
    for (path, body, status, what) in [
        (ch, json!({"model": MODEL}), 400, "missing messages"),
        (c, json!({"model": MODEL}), 400, "missing prompt"),
        (
            c,
            completion(PROMPT, json!({"max_tokens": "x"})),
            400,
            "max_tokens of the wrong type",
        ),
        (
            c,
            completion(PROMPT, json!({"temperature": -1})),
            400,
            "temperature -1",
        ),
        (ch, chat("Hi", json!({"top_p": 2})), 400, "top_p 2"),
        (
            ch,
            chat("Hi", json!({"logprobs": true, "top_logprobs": 50})),
            400,
            "top_logprobs 50",
        ),
        (c, completion(PROMPT, json!({"echo": true})), 400, "echo"),
        (c, completion(PROMPT, json!({"n": 0})), 400, "n 0"),
        (c, json!({"prompt": ["a", "b"]}), 400, "several prompts"),
        (
            ch,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            400,
            "an image part",
        ),
        (
            c,
            completion(PROMPT, json!({"model": "gpt-4"})),
            404,
            "unknown model",
        ),
    ] {
        let e = refused(&post(addr, path, &body).await, status, what);
        if status == 400 {
            assert_eq!(e["type"], "invalid_request_error", "{what}");
        }
    }
    let json_header = [("content-type", "application/json")];
    let malformed = raw(addr, "POST", c, &json_header, b"{\"prompt\": ").await;
    refused(&malformed, 400, "malformed JSON");
    let big = vec![b' '; 5 << 20];
    refused(
        &raw(addr, "POST", c, &json_header, &big).await,
        413,
        "a 5 MiB body",
    );
    let timeout = [
        ("content-type", "application/json"),
        ("x-request-timeout-ms", "1"),
    ];
    let body = completion(PROMPT, json!({})).to_string();
    let late = raw(addr, "POST", c, &timeout, body.as_bytes()).await;
    assert_eq!(refused(&late, 504, "a 1 ms deadline")["type"], "timeout");
    refused(&get(addr, c).await, 405, "GET on a POST route");
    refused(&get(addr, "/v2/nothing").await, 404, "an unknown route");

    let m = scrape(v.metrics).await;
    let count = |endpoint: &str, status: &str| -> f64 {
        m.iter()
            .filter(|(k, _)| k.starts_with("tandem_http_requests_total{"))
            .filter(|(k, _)| k.contains(&format!("endpoint=\"{endpoint}\"")))
            .filter(|(k, _)| k.contains(&format!("status=\"{status}\"")))
            .map(|(_, v)| v)
            .sum()
    };
    assert_eq!(count("tokenize", "200"), 1.0);
    assert!(count("completions", "400") >= 6.0);
    assert_eq!(count("completions", "413"), 1.0);
    assert_eq!(count("completions", "504"), 1.0);
    assert_eq!(count("chat_completions", "400"), 4.0);
    assert_eq!(count("models", "404"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn https_with_bearer_tokens_refuses_clients_without_one() {
    let pki = tandem_testkit::Pki::new("http-test");
    let leaf = pki.leaf("verifier");
    let files = tandem_serving::ServerTlsFiles {
        identity: tandem_serving::KeyPair {
            cert: leaf.cert.clone(),
            key: leaf.key.clone(),
        },
        client_ca: None,
    };
    let tokens = tandem_serving::Tokens::parse("t0k\n").unwrap();
    let security = tandem_serving::Security {
        tls: Some(files.load().unwrap()),
        tokens: Some(std::sync::Arc::new(tokens)),
    };
    let client = tandem_serving::ClientTlsFiles {
        ca: pki.ca.clone(),
        identity: None,
        domain: None,
    };
    let v = start_verifier(VerifierSetup {
        http: true,
        secure: Secure {
            security,
            client: Some(client.load().unwrap()),
        },
        ..Default::default()
    })
    .await;
    let addr = v.http.unwrap();
    let call = |path: &'static str, token: Option<&'static str>| {
        let ca = pki.ca.clone();
        async move {
            let header = token.map(|t| format!("Bearer {t}"));
            let headers: Vec<(&str, &str)> = header
                .iter()
                .map(|h| ("authorization", h.as_str()))
                .collect();
            raw_tls(addr, &ca, "GET", path, &headers).await
        }
    };
    assert_eq!(call("/health", None).await.status, 200, "health is open");
    let e = refused(&call("/v1/models", None).await, 401, "no token");
    assert_eq!(e["code"], "invalid_api_key");
    refused(
        &call("/v1/models", Some("wrong")).await,
        401,
        "a wrong token",
    );
    let models = call("/v1/models", Some("t0k")).await;
    assert_eq!(models.status, 200, "{}", models.body);
    assert_eq!(models.json()["data"][0]["id"], MODEL);
    let plain = plaintext_answer(addr).await;
    assert!(
        !plain.starts_with("HTTP/1.1 200"),
        "plaintext is not served: {plain:?}"
    );
    let m = scrape(v.metrics).await;
    assert_eq!(total(&m, "tandem_auth_failures_total"), 2.0);
}

/// What a TLS listener answers a plaintext `GET /health` with (the start of it).
async fn plaintext_answer(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = tcp
        .write_all(b"GET /health HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_server_finishes_its_stream_and_refuses_new_requests() {
    let v = verifier(Vec::new()).await;
    let addr = v.http.unwrap();
    let body = completion(PROMPT, json!({"max_tokens": 96, "stream": true}));
    let running = tokio::spawn(async move { post(addr, "/v1/completions", &body).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    v.stop();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let e = refused(
        &post(addr, "/v1/completions", &completion(PROMPT, json!({}))).await,
        503,
        "draining",
    );
    assert_eq!(e["type"], "service_unavailable");
    assert_eq!(
        get(addr, "/health").await.status,
        503,
        "health while draining"
    );
    let events = chunks(&running.await.unwrap());
    let last = events.last().unwrap();
    assert_eq!(
        last["choices"][0]["finish_reason"], "length",
        "the stream ran to its end"
    );
}
