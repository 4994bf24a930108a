//! Request deadlines: gRPC clients send theirs as the `grpc-timeout` header (an integer of
//! at most 8 digits and a unit: H, M, S, m, u, n). The verifier stops waiting in the queue,
//! and stops generating, a little before it passes ([`answer_within`]), so its
//! DEADLINE_EXCEEDED reaches the client in time and comes before tonic's own timer, which
//! ends a handler still waiting at the deadline with CANCELLED.

use std::time::Duration;

use tonic::metadata::MetadataMap;

use crate::error::VerifierError;

/// The request's timeout, if it sent one; a malformed header is an invalid argument.
pub fn timeout(metadata: &MetadataMap) -> Result<Option<Duration>, VerifierError> {
    let Some(value) = metadata.get("grpc-timeout") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default();
    parse(text).map(Some).ok_or_else(|| {
        VerifierError::InvalidArgument(format!("malformed grpc-timeout header {text:?}"))
    })
}

/// How long the server has to answer a request with `timeout`: a tenth less (at least
/// 10 ms, at most 250 ms less).
pub fn answer_within(timeout: Duration) -> Duration {
    let margin = (timeout / 10).clamp(Duration::from_millis(10), Duration::from_millis(250));
    timeout.saturating_sub(margin)
}

fn parse(s: &str) -> Option<Duration> {
    let split = s.len().checked_sub(1)?;
    let (digits, unit) = (s.get(..split)?, s.get(split..)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_parses_and_malformed_values_do_not() {
        for (text, want) in [
            ("1H", Duration::from_secs(3600)),
            ("2M", Duration::from_secs(120)),
            ("30S", Duration::from_secs(30)),
            ("1500m", Duration::from_millis(1500)),
            ("99999999u", Duration::from_micros(99_999_999)),
            ("7n", Duration::from_nanos(7)),
        ] {
            assert_eq!(parse(text), Some(want), "{text}");
        }
        for bad in ["", "S", "123456789S", "1x", "-1S", "1.5S", "１S"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_server_answers_a_little_before_the_deadline() {
        let ms = Duration::from_millis;
        assert_eq!(answer_within(ms(200)), ms(180));
        assert_eq!(answer_within(ms(50)), ms(40));
        assert_eq!(answer_within(ms(5)), ms(0));
        assert_eq!(answer_within(ms(10_000)), ms(9_750));
    }

    #[test]
    fn the_header_is_read_from_metadata() {
        let mut m = MetadataMap::new();
        assert!(matches!(timeout(&m), Ok(None)));
        m.insert("grpc-timeout", "250m".parse().expect("ascii"));
        assert_eq!(timeout(&m).ok().flatten(), Some(Duration::from_millis(250)));
        m.insert("grpc-timeout", "soon".parse().expect("ascii"));
        assert!(matches!(
            timeout(&m),
            Err(VerifierError::InvalidArgument(_))
        ));
    }
}
