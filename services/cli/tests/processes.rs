//! The services as real processes when things go wrong: a verifier drafting with two
//! `tandem drafter` processes loses one to SIGKILL in the middle of a generation (the client
//! sees no error, the text equals plain decoding, speculation goes on with the other
//! drafter, one failover and no proposer failure are counted); a verifier told SIGTERM in
//! the middle of a generation finishes it, refuses new requests, then exits cleanly.

#[allow(dead_code)]
mod common;

use std::time::{Duration, Instant};

use common::{command, stderr, tandem};
use tandem_testkit::metrics::scrape;

const PROMPT: &str = "The history of the printing press begins";

/// A `tandem drafter` or `tandem verifier` process; killed when dropped.
struct Service {
    /// The process.
    child: std::process::Child,
    /// Its gRPC endpoint, `http://ip:port`.
    url: String,
    /// Its `/metrics` address.
    metrics: std::net::SocketAddr,
}

/// Starts `tandem <what> args` on ports the system picks and reads the addresses it
/// announces.
fn service(what: &str, args: &[&str]) -> Service {
    use std::io::{BufRead, BufReader};
    let any = "127.0.0.1:0";
    let mut child = command(&[&[what, "--listen", any, "--metrics-listen", any], args].concat())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the service");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let prefix = format!("tandem {what}: gRPC on ");
    let banner = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("tandem {what} announced no addresses"));
    std::thread::spawn(move || lines.for_each(drop));
    let (grpc, metrics) = banner[prefix.len()..]
        .split_once(", metrics on ")
        .expect("both addresses");
    Service {
        child,
        url: format!("http://{grpc}"),
        metrics: metrics.parse().expect("a socket address"),
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `signal` (e.g. `-KILL`) to `child`.
fn signal(child: &std::process::Child, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
}

/// `tandem generate` against `url` with `extra` flags, as a process.
fn generate(url: &str, extra: &[&str]) -> std::process::Command {
    let args = [
        "generate",
        "--server",
        url,
        "--prompt",
        PROMPT,
        "--max-tokens",
        "200",
        "--ignore-eos",
    ];
    let mut cmd = command(&[&args[..], extra].concat());
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// Waits until one of `drafters` holds a session that has drafted; its index.
fn busy_drafter(drafters: &[Service]) -> usize {
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        for (i, d) in drafters.iter().enumerate() {
            let m = scrape(d.metrics);
            if m["tandem_active_sessions"] == 1.0 && m["tandem_drafter_blocks_total"] >= 2.0 {
                return i;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no drafter took the session");
}

#[test]
fn a_drafter_killed_mid_generation_is_replaced_without_the_client_noticing() {
    let drafters: Vec<Service> = (0..2)
        .map(|_| service("drafter", &["--drafter", "shipped"]))
        .collect();
    let endpoints = format!("{},{}", drafters[0].url, drafters[1].url);
    let verifier = service(
        "verifier",
        &[
            "--drafters",
            &endpoints,
            "--adaptive-gamma",
            "false",
            "--drafter-refresh-seconds",
            "3600",
        ],
    );
    let plain = generate(&verifier.url, &[]).output().expect("plain run");
    assert!(plain.status.success(), "{}", stderr(&plain));
    let run = generate(&verifier.url, &["--speculative"])
        .spawn()
        .expect("speculative run");
    let victim = busy_drafter(&drafters);
    signal(&drafters[victim].child, "-KILL");
    let out = run.wait_with_output().expect("the run ends");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "the same text as plain decoding"
    );
    let m = scrape(verifier.metrics);
    assert_eq!(m["tandem_drafter_failovers_total"], 1.0, "one move");
    assert_eq!(
        m["tandem_proposer_failures_total"], 0.0,
        "speculation never stopped"
    );
    assert_eq!(
        m["tandem_speculation_shed_total"], 0.0,
        "a generation alone never sheds speculation"
    );
    let survivor = scrape(drafters[1 - victim].metrics);
    assert_eq!(survivor["tandem_drafter_sessions_total"], 1.0);
    assert!(
        survivor["tandem_drafter_blocks_total"] > 0.0,
        "it drafted after the move"
    );
    let after = tandem(&[
        "generate",
        "--server",
        &verifier.url,
        "--prompt",
        "Hi",
        "--speculative",
        "--max-tokens",
        "4",
    ]);
    assert!(
        after.status.success(),
        "the next request is served: {}",
        stderr(&after)
    );
}

#[test]
fn a_verifier_told_to_stop_finishes_its_generation_refuses_new_ones_and_exits() {
    let mut verifier = service("verifier", &["--drain-seconds", "120"]);
    let plain = generate(&verifier.url, &[]).output().expect("a first run");
    assert!(plain.status.success(), "{}", stderr(&plain));
    let run = generate(&verifier.url, &[]).spawn().expect("a second run");
    let end = Instant::now() + Duration::from_secs(60);
    while scrape(verifier.metrics)["tandem_active_sessions"] < 1.0 {
        assert!(Instant::now() < end, "the generation never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&verifier.child, "-TERM");
    std::thread::sleep(Duration::from_millis(300));
    let refused = tandem(&["generate", "--server", &verifier.url, "--prompt", "Hi"]);
    assert!(
        !refused.status.success(),
        "new requests are refused while draining"
    );
    assert!(
        stderr(&refused).contains("draining"),
        "{}",
        stderr(&refused)
    );
    let out = run.wait_with_output().expect("the run ends");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        out.stdout, plain.stdout,
        "the generation in flight finished"
    );
    let status = verifier.child.wait().expect("the verifier ends");
    assert!(status.success(), "a clean exit after the drain: {status}");
}
