//! Security end to end over real sockets on 127.0.0.1, with the real Gemma 3 270M and a
//! randomly initialised DSpark drafter, certificates made at test time: a verifier drafting
//! with a drafter over mutual TLS while serving its clients over TLS with bearer tokens; a
//! drafter refusing a verifier that presents no client certificate (or one of another CA);
//! tokens refused UNAUTHENTICATED and counted, health open without one.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use tandem_e2e::*;
use tandem_proto::v1 as pb;
use tandem_serving::{ClientTls, ClientTlsFiles, KeyPair, Security, ServerTlsFiles, Tokens};
use tandem_testkit::{Leaf, Pki};
use tonic::Code;

const TOKEN: &str = "s3cret-client-token";

fn pair(leaf: &Leaf) -> KeyPair {
    KeyPair {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
    }
}

/// Server TLS presenting `leaf`, requiring client certificates of `client_ca` if given.
fn server_tls(leaf: &Leaf, client_ca: Option<&Pki>) -> Security {
    let files = ServerTlsFiles {
        identity: pair(leaf),
        client_ca: client_ca.map(|p| p.ca.clone()),
    };
    Security {
        tls: Some(files.load().unwrap()),
        tokens: None,
    }
}

/// Client TLS trusting `pki`, presenting `identity` if given.
fn client_tls(pki: &Pki, identity: Option<&Leaf>) -> ClientTls {
    ClientTlsFiles {
        ca: pki.ca.clone(),
        identity: identity.map(pair),
        domain: None,
    }
    .load()
    .unwrap()
}

fn tokens() -> Option<Arc<Tokens>> {
    Some(Arc::new(
        Tokens::parse(&format!("# clients\n{TOKEN}\n")).unwrap(),
    ))
}

/// A drafter that accepts only clients with a certificate of `pki`.
async fn mtls_drafter(pki: &Pki) -> Node {
    let secure = Secure {
        security: server_tls(&pki.leaf("drafter"), Some(pki)),
        client: Some(client_tls(pki, Some(&pki.leaf("prober")))),
    };
    start_drafter_secured("127.0.0.1", random_drafter(), target(), "dspark", secure).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_verifier_drafts_over_mutual_tls_and_serves_clients_over_tls_with_a_token() {
    let pki = Pki::new("tandem-test");
    let drafter = mtls_drafter(&pki).await;
    assert!(drafter.url.starts_with("https://"), "{}", drafter.url);
    let client = client_tls(&pki, None);
    let mut security = server_tls(&pki.leaf("verifier"), None);
    security.tokens = tokens();
    let verifier = start_verifier(VerifierSetup {
        drafters: vec![drafter.url.clone()],
        drafter_tls: Some(client_tls(&pki, Some(&pki.leaf("verifier-client")))),
        secure: Secure {
            security,
            client: Some(client.clone()),
        },
        ..Default::default()
    })
    .await;
    let req = request("The capital of France is", 16, true);
    let (ids, _, finished) = generate_as(&verifier.url, Some(&client), Some(TOKEN), req)
        .await
        .unwrap();
    assert_eq!(ids.len(), 16);
    let spec = finished.speculation.unwrap();
    assert!(spec.drafts > 0 && spec.proposer_failures == 0, "{spec:?}");
    let vm = scrape(verifier.metrics).await;
    assert_eq!(vm["tandem_drafters_available"], 1.0);
    let plain = generate(
        &verifier.url.replace("https", "http"),
        request("x", 2, false),
    )
    .await;
    assert!(plain.is_err(), "the TLS listener refuses plaintext");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drafter_refuses_a_verifier_without_a_client_certificate_of_its_ca() {
    let pki = Pki::new("tandem-test");
    let drafter = mtls_drafter(&pki).await;
    let info = |tls: ClientTls| {
        let url = drafter.url.clone();
        async move {
            let channel = tandem_serving::endpoint(&url, Some(&tls))
                .unwrap()
                .connect_lazy();
            let mut client = pb::drafter_client::DrafterClient::new(channel);
            client.info(pb::InfoRequest {}).await
        }
    };
    assert!(
        info(client_tls(&pki, None)).await.is_err(),
        "no certificate"
    );
    let other = Pki::new("other");
    let stranger = client_tls(&pki, Some(&other.leaf("stranger")));
    assert!(info(stranger).await.is_err(), "a certificate of another CA");
    info(client_tls(&pki, Some(&pki.leaf("friend"))))
        .await
        .expect("a certificate of its CA");

    // A verifier without a client certificate has no drafter: it serves plain, and its
    // metrics say so (the TandemDrafterUnreachable alert fires on this gauge).
    let verifier = start_verifier(VerifierSetup {
        drafters: vec![drafter.url.clone()],
        drafter_tls: Some(client_tls(&pki, None)),
        ..Default::default()
    })
    .await;
    let (_, _, finished) = generate(&verifier.url, request("1, 2, 3,", 4, true))
        .await
        .unwrap();
    assert_eq!(finished.speculation.unwrap_or_default().drafts, 0);
    let vm = scrape(verifier.metrics).await;
    assert_eq!(vm["tandem_drafters_available"], 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bearer_tokens_are_checked_counted_and_health_stays_open() {
    let verifier = start_verifier(VerifierSetup {
        secure: Secure {
            security: Security {
                tls: None,
                tokens: tokens(),
            },
            client: None,
        },
        ..Default::default()
    })
    .await;
    let url = verifier.url.as_str();
    let call = |token: Option<&'static str>| generate_as(url, None, token, request("Hi", 2, false));
    let missing = call(None).await.expect_err("no token");
    assert_eq!(missing.code(), Code::Unauthenticated, "{missing:?}");
    assert!(missing.message().contains("bearer token"), "{missing:?}");
    let invalid = call(Some("not-the-token"))
        .await
        .expect_err("a wrong token");
    assert_eq!(invalid.code(), Code::Unauthenticated, "{invalid:?}");
    let (ids, _, _) = call(Some(TOKEN)).await.expect("the right token");
    assert_eq!(ids.len(), 2);
    assert_eq!(
        health(url).await,
        1,
        "health answers SERVING without a token"
    );
    let vm = scrape(verifier.metrics).await;
    assert_eq!(vm[r#"tandem_auth_failures_total{reason="missing"}"#], 1.0);
    assert_eq!(vm[r#"tandem_auth_failures_total{reason="invalid"}"#], 1.0);
    assert_eq!(
        total(&vm, "tandem_requests_total"),
        1.0,
        "only the right token got in"
    );
}
