//! The deterministic mutator of the brief CI run: bit flips, interesting bytes, lengths
//! near the limits of u32 and u64 written over any offset (and as protobuf varints),
//! truncations, splices with another seed, duplicated and deleted chunks, and huge numbers
//! inside JSON digits. Not coverage-guided (that is cargo-fuzz's job); a given seed gives
//! the same inputs on every machine, so a failure reproduces from its iteration number.

use tandem_testkit::Lcg;

/// Lengths and counts a decoder must not trust.
const HUGE: [u64; 7] = [
    0,
    1 << 31,
    u32::MAX as u64,
    1 << 40,
    1 << 60,
    u64::MAX - 1,
    u64::MAX,
];
const BYTES: [u8; 5] = [0, 0x7f, 0x80, 0xff, b'9'];

/// A stream of mutated inputs.
pub struct Mutator {
    rng: Lcg,
}

impl Mutator {
    /// The mutations of `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Lcg::new(seed),
        }
    }

    fn below(&mut self, n: usize) -> usize {
        self.rng.bits32() as usize % n.max(1)
    }

    /// One to four mutations of `input`, splicing from `other` when one splices.
    pub fn mutate(&mut self, input: &[u8], other: &[u8]) -> Vec<u8> {
        let mut out = input.to_vec();
        for _ in 0..1 + self.below(4) {
            self.once(&mut out, other);
        }
        out
    }

    fn once(&mut self, out: &mut Vec<u8>, other: &[u8]) {
        let at = self.below(out.len() + 1);
        match self.below(9) {
            0 if at < out.len() => out[at] ^= 1 << self.below(8),
            1 if at < out.len() => out[at] = BYTES[self.below(BYTES.len())],
            2 => out.truncate(at),
            3 => {
                let from = self.below(other.len() + 1);
                out.truncate(at);
                out.extend_from_slice(&other[from..]);
            }
            4 => {
                let v = HUGE[self.below(HUGE.len())];
                let bytes = match self.below(2) {
                    0 => v.to_le_bytes().to_vec(),
                    _ => (v as u32).to_le_bytes().to_vec(),
                };
                let end = (at + bytes.len()).min(out.len());
                out.splice(at..end, bytes);
            }
            5 => {
                let v = varint(HUGE[self.below(HUGE.len())]);
                out.splice(at..at, v);
            }
            6 => {
                let end = (at + 1 + self.below(64)).min(out.len());
                let chunk = out[at..end].to_vec();
                out.splice(at..at, chunk);
            }
            7 => {
                let end = (at + 1 + self.below(64)).min(out.len());
                out.drain(at..end);
            }
            _ => {
                if let Some(d) = out[at..].iter().position(u8::is_ascii_digit) {
                    out.splice(at + d..at + d, *b"99999999999999999999");
                }
            }
        }
    }
}

/// `v` as a protobuf varint.
fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_deterministic_and_change_the_input() {
        let seed = b"{\"gamma\": 8, \"width\": 640}".to_vec();
        let run = |s| {
            let mut m = Mutator::new(s);
            (0..50)
                .map(|_| m.mutate(&seed, b"other"))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        assert!(run(1).iter().filter(|m| **m != seed).count() > 40);
    }

    #[test]
    fn varints_encode_as_protobuf_does() {
        assert_eq!(varint(1), vec![1]);
        assert_eq!(varint(300), vec![0xac, 0x02]);
        assert_eq!(varint(u64::MAX).len(), 10);
    }
}
