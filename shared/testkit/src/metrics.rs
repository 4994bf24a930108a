//! Reading a service's Prometheus `/metrics` page in tests: fetch it over plain HTTP/1.1,
//! check it is Prometheus text, and map every series (name with labels) to its value.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// Fetches and parses the `/metrics` page at `addr`. Panics on anything that is not a
/// 200 answer of Prometheus text.
pub fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let mut s = TcpStream::connect(addr).expect("connect to /metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .expect("send the request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_lowercase().contains("content-type: text/plain"),
        "{head}"
    );
    parse(body)
}

/// Series → value of a Prometheus text page. Panics on a line that is not Prometheus text.
pub fn parse(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            let name = series.split('{').next().unwrap_or("");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "bad name {l:?}"
            );
            let value = value
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("bad value {l:?}"));
            (series.to_string(), value)
        })
        .collect()
}

/// Sum of every series of `name` (any labels).
pub fn total(m: &BTreeMap<String, f64>, name: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| k.as_str() == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_keep_their_labels_and_totals_add_them_up() {
        let m = parse("# HELP a x\na_total{k=\"1\"} 2\na_total{k=\"2\"} 3\nb 0.5\n");
        assert_eq!(m["a_total{k=\"1\"}"], 2.0);
        assert_eq!(total(&m, "a_total"), 5.0);
        assert_eq!(total(&m, "b"), 0.5);
        assert_eq!(total(&m, "a"), 0.0);
    }
}
