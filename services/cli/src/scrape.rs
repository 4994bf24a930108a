//! Reading a service's `/metrics` page from the benches: every series by name and labels,
//! and the sum of a metric over its labels.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A `/metrics` page: series (name with labels) → value.
pub async fn scrape(addr: SocketAddr) -> Result<BTreeMap<String, f64>> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot reach /metrics at {addr}"))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
        .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let (_, body) = raw
        .split_once("\r\n\r\n")
        .with_context(|| format!("/metrics at {addr} answered no HTTP response"))?;
    let series = body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let parsed = series.filter_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        Some((name.to_string(), value.parse().ok()?))
    });
    Ok(parsed.collect())
}

/// Sum of every series of `name` (any labels).
pub fn total(m: &BTreeMap<String, f64>, name: &str) -> f64 {
    let labelled = format!("{name}{{");
    m.iter()
        .filter(|(k, _)| k.as_str() == name || k.starts_with(&labelled))
        .map(|(_, v)| v)
        .sum()
}
