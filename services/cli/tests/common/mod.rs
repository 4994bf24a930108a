//! Helpers of the `tandem` binary's tests: running it on the real Gemma 3 270M (fetched by
//! scripts/fetch-models.sh; tests never download) and reading what it printed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use tandem_testkit::{models_dir, real_gguf, MODELS_DIR_ENV};

/// `tandem args` with the models directory set.
pub fn command(args: &[&str]) -> Command {
    // The run needs the fetched model: fail here, clearly, when it is missing.
    real_gguf();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
    cmd.args(args)
        .env(MODELS_DIR_ENV, models_dir())
        .env_remove("TANDEM_MODEL")
        .env_remove("TANDEM_TOKENIZER");
    cmd
}

/// Runs `tandem args` to its end.
pub fn tandem(args: &[&str]) -> Output {
    command(args).output().expect("run tandem")
}

/// What the run printed on stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails unless `out` is a failure with one line on stderr that names `needle`.
pub fn assert_one_line_error(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
    let err = stderr(out);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(
        err.starts_with("tandem: error:") && err.contains(needle),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// Starts `tandem up` with `drafter` on ports the OS picks (every listener on 127.0.0.1:0,
/// the HTTP API's included) and `extra` flags; returns the process and the banner it prints once serving
/// (`tandem up: verifier on A (metrics B), ...`).
pub fn start_up(drafter: &str, extra: &[&str]) -> (Child, String) {
    let any = "127.0.0.1:0";
    let mut args = vec![
        "up",
        "--listen",
        any,
        "--metrics-listen",
        any,
        "--drafter-listen",
        any,
        "--drafter-metrics-listen",
        any,
        "--http-listen",
        any,
        "--drafter",
        drafter,
    ];
    args.extend_from_slice(extra);
    let mut up = command(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tandem up");
    let mut lines = BufReader::new(up.stderr.take().expect("stderr")).lines();
    let banner = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("tandem up: verifier on "))
        .expect("the banner");
    std::thread::spawn(move || lines.for_each(drop));
    (up, banner)
}

/// The address a banner announces right after `label` (e.g. `"verifier on "`,
/// `"HTTP on "`); fails unless it is there and is a bound port, not the asked `:0`.
pub fn announced(banner: &str, label: &str) -> String {
    let at = banner
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {banner:?}"));
    let addr: String = banner[at + label.len()..]
        .chars()
        .take_while(|c| !matches!(c, ' ' | ',' | ')'))
        .collect();
    assert!(
        addr.parse::<std::net::SocketAddr>().is_ok(),
        "not an address after {label:?}: {banner}"
    );
    assert!(
        !addr.ends_with(":0"),
        "the bound port, not the asked one: {banner}"
    );
    addr
}

/// Stops `up` with SIGTERM; it must end cleanly.
pub fn stop_up(mut up: Child) {
    let term = Command::new("kill")
        .args(["-TERM", &up.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let status = up.wait().expect("wait");
    assert!(
        status.success(),
        "tandem up ends cleanly on SIGTERM: {status}"
    );
}

/// The status of a plain HTTP/1.1 GET of `path` at `addr`.
pub fn get_status(addr: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    let status = answer.split(' ').nth(1).and_then(|c| c.parse().ok());
    status.unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"))
}

/// Waits until `GET /health` at `addr` answers 200: the HTTP API says 503 until the warm-up
/// ends, which is after the banner. Fails after 60 s.
pub fn wait_healthy(addr: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while get_status(addr, "/health") != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "HTTP on {addr}: /health not 200 within 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
