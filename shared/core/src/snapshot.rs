//! What a drafter sees of the target: a [`SnapshotSpec`] declares the parts of each
//! committed position's row (hidden-state taps for DSpark; the last hidden state and the
//! donor keys and values of two layers for the Gemma 4 assistant), [`SnapshotRows`] carry
//! them, and [`SnapshotSupport`] says what a target can export, so a drafter whose
//! declaration does not fit is refused before any row is sent.

/// One piece of a snapshot row: what the target computed at that position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotPart {
    /// A hidden state: `i` below the number of target layers is the output of layer `i`;
    /// the number of layers means the output of the final norm (the last hidden state).
    Tap(usize),
    /// The keys of target layer `i` at that position, every key/value head (normed and
    /// rotated, as the layer's attention reads them).
    DonorKey(usize),
    /// The values of target layer `i` at that position, every key/value head.
    DonorValue(usize),
}

impl std::fmt::Display for SnapshotPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tap(l) => write!(f, "tap({l})"),
            Self::DonorKey(l) => write!(f, "key({l})"),
            Self::DonorValue(l) => write!(f, "value({l})"),
        }
    }
}

/// A part and its width in floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartSpec {
    /// What the part holds.
    pub part: SnapshotPart,
    /// Floats it takes in a row.
    pub width: usize,
}

/// What a proposer needs to see of each committed target position: a row is the
/// concatenation of these parts, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotSpec {
    /// The parts of a row.
    pub parts: Vec<PartSpec>,
}

impl SnapshotSpec {
    /// Hidden-state taps of width `hidden` (a DSpark drafter's snapshot).
    pub fn taps(layers: &[usize], hidden: usize) -> Self {
        Self {
            parts: layers
                .iter()
                .map(|l| PartSpec {
                    part: SnapshotPart::Tap(*l),
                    width: hidden,
                })
                .collect(),
        }
    }

    /// Floats per snapshot row.
    pub fn row_width(&self) -> usize {
        self.parts.iter().map(|p| p.width).sum()
    }

    /// Where `part` sits in a row: its offset and width.
    pub fn locate(&self, part: SnapshotPart) -> Option<(usize, usize)> {
        let mut offset = 0;
        for p in &self.parts {
            if p.part == part {
                return Some((offset, p.width));
            }
            offset += p.width;
        }
        None
    }

    /// The layers of the `Tap` parts, in order.
    pub fn tap_layers(&self) -> Vec<usize> {
        self.parts
            .iter()
            .filter_map(|p| match p.part {
                SnapshotPart::Tap(l) => Some(l),
                _ => None,
            })
            .collect()
    }
}

impl std::fmt::Display for SnapshotSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| format!("{}×{}", p.part, p.width))
            .collect();
        write!(f, "[{}]", parts.join(", "))
    }
}

/// Snapshot rows of consecutive committed positions `start..start + rows()`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SnapshotRows {
    /// Position of the first row.
    pub start: usize,
    /// Floats per row ([`SnapshotSpec::row_width`]).
    pub width: usize,
    /// Row-major `rows × width` values.
    pub data: Vec<f32>,
    /// The committed token of each row's position, where the sender includes them (one per
    /// row); empty otherwise. Drafters look continuations up in them (the prompt's too).
    pub tokens: Vec<u32>,
}

impl SnapshotRows {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }
}

/// What a target can put in snapshot rows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotSupport {
    /// Target decoder layers (`Tap(layers)` is the final norm's output).
    pub layers: usize,
    /// Width of a hidden state.
    pub hidden: usize,
    /// Whether taps of inner layers (below `layers`) are available.
    pub inner_taps: bool,
    /// Layers whose keys and values can be exported, with the width of one position's keys
    /// (equal to its values').
    pub donors: Vec<(usize, usize)>,
}

impl SnapshotSupport {
    /// Whether the target can send rows of `spec`; the error is one line for users.
    pub fn check(&self, spec: &SnapshotSpec) -> Result<(), String> {
        if spec.parts.is_empty() {
            return Err("the snapshot declares no parts".into());
        }
        for p in &spec.parts {
            self.check_part(p)
                .map_err(|why| format!("snapshot part {}×{}: {why}", p.part, p.width))?;
        }
        Ok(())
    }

    fn check_part(&self, p: &PartSpec) -> Result<(), String> {
        let expected = match p.part {
            SnapshotPart::Tap(l) if l > self.layers => {
                return Err(format!("the target has {} layers", self.layers))
            }
            SnapshotPart::Tap(l) if l < self.layers && !self.inner_taps => {
                return Err(format!(
                    "this target exports only the last hidden state (tap({}))",
                    self.layers
                ))
            }
            SnapshotPart::Tap(_) => self.hidden,
            SnapshotPart::DonorKey(l) | SnapshotPart::DonorValue(l) => {
                let layers: Vec<usize> = self.donors.iter().map(|d| d.0).collect();
                self.donors
                    .iter()
                    .find(|d| d.0 == l)
                    .ok_or_else(|| {
                        format!("the target exports keys and values of layers {layers:?} only")
                    })?
                    .1
            }
        };
        match p.width == expected {
            true => Ok(()),
            false => Err(format!("the target's part is {expected} wide")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_width() {
        let spec = SnapshotSpec::taps(&[3, 17, 18], 4);
        let rows = SnapshotRows {
            start: 5,
            width: spec.row_width(),
            data: vec![0.0; 24],
            tokens: Vec::new(),
        };
        assert_eq!(spec.row_width(), 12);
        assert_eq!(rows.rows(), 2);
        assert_eq!(SnapshotRows::default().rows(), 0);
        assert_eq!(spec.tap_layers(), vec![3, 17, 18]);
    }

    fn assistant_like() -> SnapshotSpec {
        let mut spec = SnapshotSpec::taps(&[6], 8);
        for part in [SnapshotPart::DonorKey(3), SnapshotPart::DonorValue(3)] {
            spec.parts.push(PartSpec { part, width: 16 });
        }
        spec
    }

    #[test]
    fn support_refuses_parts_the_target_lacks() {
        let support = SnapshotSupport {
            layers: 6,
            hidden: 8,
            inner_taps: false,
            donors: vec![(2, 32), (3, 16)],
        };
        assert_eq!(support.check(&assistant_like()), Ok(()));
        let cases = [
            (SnapshotSpec::default(), "no parts"),
            (SnapshotSpec::taps(&[7], 8), "has 6 layers"),
            (SnapshotSpec::taps(&[2], 8), "only the last hidden"),
            (SnapshotSpec::taps(&[6], 9), "8 wide"),
        ];
        for (spec, needle) in cases {
            let e = support.check(&spec).expect_err("refused");
            assert!(e.contains(needle), "{e}");
        }
        let mut wrong_layer = assistant_like();
        wrong_layer.parts[1].part = SnapshotPart::DonorKey(4);
        let e = support.check(&wrong_layer).expect_err("layer 4 is shared");
        assert!(e.contains("layers [2, 3] only"), "{e}");
        let mut wrong_width = assistant_like();
        wrong_width.parts[2].width = 32;
        let e = support.check(&wrong_width).expect_err("width");
        assert!(e.contains("value(3)×32") && e.contains("16 wide"), "{e}");
    }

    #[test]
    fn parts_are_located_by_kind_and_layer() {
        let spec = assistant_like();
        assert_eq!(spec.row_width(), 40);
        assert_eq!(spec.locate(SnapshotPart::DonorValue(3)), Some((24, 16)));
        assert_eq!(spec.locate(SnapshotPart::DonorKey(2)), None);
        assert_eq!(spec.tap_layers(), vec![6]);
        assert_eq!(spec.to_string(), "[tap(6)×8, key(3)×16, value(3)×16]");
    }
}
