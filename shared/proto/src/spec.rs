//! The snapshot declaration on the wire: a drafter's [`SnapshotSpec`] as the repeated
//! `SnapshotPart` of `DrafterInfo` and `Open`, checked on the way in (known kinds, widths
//! above zero, no part twice). Drafters that predate parts declare taps and a hidden size.

use tandem_core::{PartSpec, SnapshotPart, SnapshotSpec};

use crate::codec::DecodeError;
use crate::v1 as pb;

use pb::snapshot_part::Kind;

/// The wire form of a snapshot declaration.
pub fn spec_to_pb(spec: &SnapshotSpec) -> Vec<pb::SnapshotPart> {
    spec.parts
        .iter()
        .map(|p| {
            let (kind, layer) = match p.part {
                SnapshotPart::Tap(l) => (Kind::Tap, l),
                SnapshotPart::DonorKey(l) => (Kind::DonorKey, l),
                SnapshotPart::DonorValue(l) => (Kind::DonorValue, l),
            };
            pb::SnapshotPart {
                kind: kind as i32,
                layer: layer as u32,
                width: p.width as u32,
            }
        })
        .collect()
}

/// Parses and checks a snapshot declaration.
pub fn spec_from_pb(parts: &[pb::SnapshotPart]) -> Result<SnapshotSpec, DecodeError> {
    let mut spec = SnapshotSpec::default();
    for (i, p) in parts.iter().enumerate() {
        let layer = p.layer as usize;
        let part = match Kind::try_from(p.kind) {
            Ok(Kind::Tap) => SnapshotPart::Tap(layer),
            Ok(Kind::DonorKey) => SnapshotPart::DonorKey(layer),
            Ok(Kind::DonorValue) => SnapshotPart::DonorValue(layer),
            Ok(Kind::Unspecified) | Err(_) => {
                return Err(DecodeError(format!(
                    "snapshot part {i} has an unknown kind {}",
                    p.kind
                )))
            }
        };
        if p.width == 0 {
            return Err(DecodeError(format!(
                "snapshot part {i} ({part}) has width 0"
            )));
        }
        if spec.locate(part).is_some() {
            return Err(DecodeError(format!(
                "snapshot part {part} is declared twice"
            )));
        }
        spec.parts.push(PartSpec {
            part,
            width: p.width as usize,
        });
    }
    Ok(spec)
}

/// The snapshot a drafter's Info declares: its parts, or its taps of `hidden_size` when it
/// sends no parts.
pub fn spec_from_info(info: &pb::DrafterInfo) -> Result<SnapshotSpec, DecodeError> {
    if !info.snapshot.is_empty() {
        return spec_from_pb(&info.snapshot);
    }
    let taps: Vec<usize> = info.taps.iter().map(|t| *t as usize).collect();
    if taps.is_empty() || info.hidden_size == 0 {
        return Err(DecodeError(
            "the drafter declares no snapshot (no parts, no taps)".into(),
        ));
    }
    Ok(SnapshotSpec::taps(&taps, info.hidden_size as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assistant_like() -> SnapshotSpec {
        let mut spec = SnapshotSpec::taps(&[6], 64);
        for part in [SnapshotPart::DonorKey(3), SnapshotPart::DonorValue(3)] {
            spec.parts.push(PartSpec { part, width: 16 });
        }
        spec
    }

    #[test]
    fn specs_round_trip() {
        let spec = assistant_like();
        assert_eq!(spec_from_pb(&spec_to_pb(&spec)).expect("decodes"), spec);
    }

    #[test]
    fn old_drafters_declare_taps() {
        let info = pb::DrafterInfo {
            taps: vec![5, 18],
            hidden_size: 640,
            ..Default::default()
        };
        assert_eq!(
            spec_from_info(&info).expect("taps"),
            SnapshotSpec::taps(&[5, 18], 640)
        );
        let none = pb::DrafterInfo::default();
        assert!(spec_from_info(&none).is_err());
        let parts = pb::DrafterInfo {
            snapshot: spec_to_pb(&assistant_like()),
            ..info
        };
        assert_eq!(spec_from_info(&parts).expect("parts"), assistant_like());
    }

    #[test]
    fn bad_declarations_are_refused() {
        let good = spec_to_pb(&assistant_like());
        let mut unknown = good.clone();
        unknown[1].kind = 9;
        let mut zero = good.clone();
        zero[2].width = 0;
        let mut twice = good.clone();
        twice.push(good[0]);
        for (parts, needle) in [
            (unknown, "unknown kind"),
            (zero, "width 0"),
            (twice, "declared twice"),
        ] {
            let e = spec_from_pb(&parts).expect_err("refused");
            assert!(e.0.contains(needle), "{e}");
        }
    }
}
