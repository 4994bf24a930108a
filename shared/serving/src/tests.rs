//! Tests of the server runner: health before and after the warm-up, a failed warm-up,
//! the drain, a kill, TLS with a plaintext probe, and unusable TLS files.
use super::*;
use std::net::Ipv4Addr;
use std::sync::mpsc;

/// An app whose one service is the older reflection API (any service other than the
/// two every server gets will do) and whose warm-up is `warm_up`.
fn app(warm_up: WarmUp) -> App {
    let service = tonic_reflection::server::Builder::configure()
        .build_v1alpha()
        .expect("a reflection service");
    App {
        routes: Routes::new(service),
        name: "test.Service",
        registry: Arc::new(Registry::new()),
        warm_up,
        drain: Drain::new(),
        grace: Duration::from_secs(5),
        http: None,
    }
}

async fn listeners() -> Listeners {
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    Listeners::bind(any, any).await.expect("listeners")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_serving_only_after_the_warm_up() {
    let (release, gate) = mpsc::channel::<()>();
    let warm_up: WarmUp = Box::new(move || Ok(gate.recv()?));
    let running = spawn(app(warm_up), listeners().await).expect("spawn");
    let url = running.url();
    let mut status = None;
    for _ in 0..100 {
        status = health(&url).await;
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status,
        Some(WireStatus::NotServing),
        "cold: listening, not serving"
    );
    release.send(()).expect("release");
    running
        .wait_serving(Duration::from_secs(10))
        .await
        .expect("serving after the warm-up");
    running.shutdown().await.expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_drains_work_in_flight_before_the_server_ends() {
    let app = app(Box::new(|| Ok(())));
    let drain = Arc::clone(&app.drain);
    let running = spawn(app, listeners().await).expect("spawn");
    running
        .wait_serving(Duration::from_secs(10))
        .await
        .expect("serving");
    let work = drain.enter().expect("admitted before the shutdown");
    running.stop();
    let mut status = None;
    for _ in 0..100 {
        status = health(&running.url()).await;
        if status == Some(WireStatus::NotServing) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status,
        Some(WireStatus::NotServing),
        "draining: still answering"
    );
    assert!(drain.enter().is_none(), "new work is refused");
    drop(work);
    tokio::time::timeout(Duration::from_secs(10), running.shutdown())
        .await
        .expect("ends once the work is done")
        .expect("a clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_cuts_open_streams_at_once_and_frees_the_address() {
    let running = spawn(app(Box::new(|| Ok(()))), listeners().await).expect("spawn");
    running
        .wait_serving(Duration::from_secs(10))
        .await
        .expect("serving");
    let (grpc, url) = (running.grpc, running.url());
    let channel = tonic::transport::Endpoint::from_shared(url)
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let req = HealthCheckRequest {
        service: String::new(),
    };
    let mut watch = HealthClient::new(channel)
        .watch(req)
        .await
        .expect("watch")
        .into_inner();
    assert!(watch.message().await.expect("first status").is_some());
    running.kill().await;
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("the open stream ends at once");
    assert!(next.is_err(), "cut off, not ended cleanly: {next:?}");
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    Listeners::bind(grpc, any)
        .await
        .expect("the address is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_server_answers_health_over_tls_and_on_its_plaintext_probe() {
    let pki = tandem_testkit::Pki::new("serving-test");
    let leaf = pki.leaf("server");
    let identity = KeyPair {
        cert: leaf.cert,
        key: leaf.key,
    };
    let files = ServerTlsFiles {
        identity: identity.clone(),
        client_ca: None,
    };
    let security = Security {
        tls: Some(files.load().expect("server TLS")),
        tokens: None,
    };
    let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let listeners = listeners().await.with_security(security);
    let listeners = listeners.with_probe(any).await.expect("a probe listener");
    let probe = format!(
        "http://{}",
        listeners
            .probe
            .as_ref()
            .expect("probe")
            .local_addr()
            .expect("addr")
    );
    let running = spawn(app(Box::new(|| Ok(()))), listeners).expect("spawn");
    assert!(running.url().starts_with("https://"), "{}", running.url());
    let client = ClientTlsFiles {
        ca: pki.ca.clone(),
        identity: None,
        domain: None,
    };
    let client = client.load().expect("client TLS");
    running
        .wait_serving_over(Some(&client), Duration::from_secs(10))
        .await
        .expect("SERVING over TLS");
    wait_serving(&probe, Duration::from_secs(10))
        .await
        .expect("SERVING on the plaintext probe");
    assert_eq!(health(&running.url().replace("https", "http")).await, None);
    running.shutdown().await.expect("a clean stop");
}

#[test]
fn unusable_tls_files_are_one_clear_error() {
    let pki = tandem_testkit::Pki::new("serving-test");
    let leaf = pki.leaf("server");
    let garbage = pki.file("garbage.pem", "not a PEM file");
    let load = |cert: &std::path::Path, key: &std::path::Path| {
        let identity = KeyPair {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        };
        let files = ServerTlsFiles {
            identity,
            client_ca: None,
        };
        files.load().map(drop).expect_err("refused").to_string()
    };
    let missing = load(std::path::Path::new("/nonexistent.pem"), &leaf.key);
    assert!(
        missing.contains("cannot read TLS certificate /nonexistent.pem"),
        "{missing}"
    );
    let bad_key = load(&leaf.cert, &garbage);
    assert!(
        bad_key.contains("garbage.pem") || bad_key.contains("server.pem"),
        "{bad_key}"
    );
    assert!(!bad_key.contains('\n'), "{bad_key}");
    let bad_ca = ClientTlsFiles {
        ca: garbage,
        identity: None,
        domain: None,
    };
    let bad_ca = bad_ca.load().map(drop).expect_err("refused").to_string();
    assert!(bad_ca.contains("garbage.pem"), "{bad_ca}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_warm_up_stops_the_server_with_its_error() {
    let warm_up: WarmUp = Box::new(|| Err("no model".into()));
    let running = spawn(app(warm_up), listeners().await).expect("spawn");
    let url = running.url();
    let mut stopped = false;
    for _ in 0..250 {
        if health(&url).await.is_none() {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stopped, "the server stops by itself");
    let err = running.shutdown().await.expect_err("the warm-up's error");
    assert!(
        err.to_string().contains("warm-up failed: no model"),
        "{err}"
    );
}
