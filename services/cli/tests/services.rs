//! `tandem up` and the services' security flags as real processes: `tandem up` serves on
//! the ports it prints and stops on SIGTERM; with TLS and a token file it serves only
//! clients with the CA and a token; a drafter and a verifier process draft over mutual TLS;
//! unusable TLS files are one clear line before the model loads.

mod common;

use std::process::Stdio;

use common::{
    announced, assert_one_line_error, command, start_up, stderr, stop_up, tandem, wait_healthy,
};
use tandem_testkit::Pki;

#[test]
fn up_serves_a_client_on_the_ports_it_prints_and_stops_on_sigterm() {
    let (up, banner) = start_up("random", &[]);
    let addr = announced(&banner, "verifier on ");
    let http = announced(&banner, "HTTP on ");
    wait_healthy(&http);
    let url = format!("http://{addr}");
    let args = [
        "--server",
        url.as_str(),
        "--prompt",
        "1, 2, 3,",
        "--max-tokens",
        "6",
    ];
    let out = tandem(&[&["generate"], &args[..]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(text.starts_with(" 4, 5,"), "{text:?}");
    stop_up(up);
}

#[test]
fn up_with_tls_and_a_token_file_serves_only_clients_with_the_ca_and_a_token() {
    let pki = Pki::new("cli-test");
    let server = pki.leaf("verifier");
    let tokens = pki.file("tokens", "# clients\nt0ken-for-the-cli-test\n");
    let path = |p: &std::path::Path| p.to_str().expect("a UTF-8 path").to_string();
    let (cert, key, tokens) = (path(&server.cert), path(&server.key), path(&tokens));
    let flags = [
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--token-file",
        &tokens,
    ];
    let (up, banner) = start_up("random", &flags);
    let addr = announced(&banner, "verifier on ");
    let url = format!("https://{addr}");
    let ca = path(&pki.ca);
    let args = [
        "generate",
        "--server",
        &url,
        "--tls-ca",
        &ca,
        "--prompt",
        "1, 2, 3,",
        "--max-tokens",
        "6",
    ];
    let secured = |token: Option<&str>| {
        let mut cmd = command(&args);
        cmd.env_remove("TANDEM_TOKEN");
        if let Some(t) = token {
            cmd.env("TANDEM_TOKEN", t);
        }
        cmd.output().expect("run tandem generate")
    };
    let out = secured(Some("t0ken-for-the-cli-test"));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(text.starts_with(" 4, 5,"), "{text:?}");
    assert_one_line_error(&secured(None), "missing bearer token");
    assert_one_line_error(&secured(Some("wrong")), "invalid bearer token");
    let plain = format!("http://{addr}");
    let out = tandem(&[
        "generate",
        "--server",
        &plain,
        "--prompt",
        "x",
        "--max-tokens",
        "1",
    ]);
    assert!(!out.status.success(), "plaintext to a TLS listener fails");
    stop_up(up);
}

/// A port free now on 127.0.0.1 (the OS picks it; it is released for the caller to bind).
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port().to_string()
}

/// Rounds drafted in a `tandem generate --server` summary ("... over N rounds").
fn drafted_rounds(summary: &str) -> Option<u64> {
    let tail = summary.split(" over ").last()?;
    tail.split(' ').next()?.parse().ok()
}

#[test]
fn drafter_and_verifier_processes_draft_over_mutual_tls() {
    let pki = Pki::new("cli-mtls");
    let path = |p: &std::path::Path| p.to_str().expect("a UTF-8 path").to_string();
    let (d, v) = (pki.leaf("drafter"), pki.leaf("verifier"));
    let (d_cert, d_key, v_cert, v_key, ca) = (
        path(&d.cert),
        path(&d.key),
        path(&v.cert),
        path(&v.key),
        path(&pki.ca),
    );
    let (d_port, v_port) = (free_port(), free_port());
    let (d_addr, v_addr) = (format!("127.0.0.1:{d_port}"), format!("127.0.0.1:{v_port}"));
    let any = "127.0.0.1:0";
    let spawn = |args: &[&str]| {
        command(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a service")
    };
    let drafter = spawn(&[
        "drafter",
        "--listen",
        &d_addr,
        "--metrics-listen",
        any,
        "--drafter",
        "random",
        "--tls-cert",
        &d_cert,
        "--tls-key",
        &d_key,
        "--tls-client-ca",
        &ca,
    ]);
    let drafters = format!("https://{d_addr}");
    let verifier = spawn(&[
        "verifier",
        "--listen",
        &v_addr,
        "--metrics-listen",
        any,
        "--drafters",
        &drafters,
        "--drafter-refresh-seconds",
        "1",
        "--drafter-tls-ca",
        &ca,
        "--drafter-tls-cert",
        &v_cert,
        "--drafter-tls-key",
        &v_key,
    ]);
    let url = format!("http://{v_addr}");
    let args = [
        "generate",
        "--server",
        &url,
        "--speculative",
        "--prompt",
        "1, 2, 3,",
        "--max-tokens",
        "8",
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let out = tandem(&args);
        let err = stderr(&out);
        match drafted_rounds(err.trim_end()) {
            Some(n) if out.status.success() && n > 0 => break,
            _ if std::time::Instant::now() > deadline => panic!("never drafted: {err}"),
            _ => std::thread::sleep(std::time::Duration::from_millis(500)),
        }
    }
    for mut service in [verifier, drafter] {
        let term = std::process::Command::new("kill")
            .args(["-TERM", &service.id().to_string()])
            .status()
            .expect("kill");
        assert!(term.success());
        assert!(service.wait().expect("wait").success(), "a clean stop");
    }
}

#[test]
fn unusable_tls_files_are_one_clear_line_before_the_model_loads() {
    assert_one_line_error(
        &tandem(&[
            "verifier",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--tls-key",
            "/nonexistent/key.pem",
        ]),
        "cannot read TLS certificate /nonexistent/cert.pem",
    );
    let pki = Pki::new("cli-test");
    let garbage = pki.file("garbage.pem", "not PEM");
    assert_one_line_error(
        &tandem(&[
            "verifier",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--drafter-tls-ca",
            garbage.to_str().expect("a UTF-8 path"),
        ]),
        "holds no PEM certificate",
    );
}
