//! Tests against the real Gemma 3 tokenizer (fetched by scripts/fetch-models.sh).

use proptest::prelude::*;
use tandem_testkit::real_tokenizer;
use tandem_tokenizer::{ChatMessage, GemmaTokenizer};

fn tok() -> &'static GemmaTokenizer {
    static TOK: std::sync::OnceLock<GemmaTokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| GemmaTokenizer::from_file(&real_tokenizer()).expect("load tokenizer"))
}

fn stream_all(ids: &[u32]) -> (String, Vec<String>) {
    let mut dec = tok().stream();
    let mut pieces = Vec::new();
    for id in ids {
        if let Some(p) = dec.push(*id).expect("push") {
            pieces.push(p);
        }
    }
    if let Some(p) = dec.finish().expect("finish") {
        pieces.push(p);
    }
    (pieces.concat(), pieces)
}

#[test]
fn special_ids_and_bos() {
    let t = tok();
    assert_eq!(t.bos_id(), 2);
    assert_eq!(t.stop_ids(), &[1, 106]);
    // 262,144 embedding rows plus added tokens (the image soft token sits past them).
    assert!(t.vocab_size() >= 262_144, "{}", t.vocab_size());
    let ids = t.encode("Hello world", true).expect("encode");
    assert_eq!(ids[0], 2);
    assert_eq!(t.encode("Hello world", false).expect("encode"), ids[1..]);
    assert_eq!(t.decode(&ids).expect("decode"), "Hello world");
}

#[test]
fn stream_never_splits_multibyte_characters() {
    let text = "Café 東京 🦀🦀 naïve — ok";
    let ids = tok().encode(text, false).expect("encode");
    let (joined, pieces) = stream_all(&ids);
    assert_eq!(joined, text);
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
}

#[test]
fn byte_fallback_bytes_are_held_until_complete() {
    let t = tok();
    let bytes: Vec<u32> = "🦀"
        .bytes()
        .map(|b| t.token_id(&format!("<0x{b:02X}>")).expect("byte token"))
        .collect();
    let mut dec = t.stream();
    for id in &bytes[..3] {
        assert_eq!(dec.push(*id).expect("push"), None);
    }
    assert_eq!(dec.push(bytes[3]).expect("push").as_deref(), Some("🦀"));
}

#[test]
fn missing_file_is_a_clear_error() {
    let err = GemmaTokenizer::from_file(std::path::Path::new("/nonexistent/tokenizer.json"))
        .err()
        .expect("must fail");
    assert!(err.to_string().contains("file not found"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn streaming_equals_full_decode(text in "\\PC{0,40}") {
        let ids = tok().encode(&text, false).expect("encode");
        let (joined, _) = stream_all(&ids);
        prop_assert_eq!(joined, tok().decode(&ids).expect("decode"));
    }
}

/// Conversations rendered with the tokenizer's chat template equal Jinja2's rendering as
/// transformers does it (fixtures/chat_template.json, made by
/// scripts/golden/chat_template_jinja2.py), and the template's refusals come back as errors
/// with its message.
#[test]
fn chat_prompts_render_as_jinja2_renders_them() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/chat_template.json")).expect("fixture");
    let template = tok()
        .chat_template()
        .expect("the tokenizer ships a chat template");
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 6);
    for case in cases {
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| ChatMessage {
                role: m["role"].as_str().expect("role").into(),
                content: m["content"].as_str().expect("content").into(),
            })
            .collect();
        let open = case["add_generation_prompt"].as_bool().expect("flag");
        let got = template.render(&messages, open);
        match (case["text"].as_str(), case["error"].as_str()) {
            (Some(want), _) => {
                assert_eq!(got.expect("renders"), want);
                let ids = tok().encode_chat(&messages, open).expect("encode");
                assert_eq!(ids.iter().filter(|t| **t == tok().bos_id()).count(), 1);
                assert_eq!(ids[0], tok().bos_id());
                assert_eq!(tok().decode_with(&ids, false).expect("decode"), want);
            }
            (None, Some(why)) => {
                let err = got.expect_err("refused").to_string();
                assert!(err.contains(why), "{err}");
            }
            _ => panic!("a case has text or an error"),
        }
    }
}
