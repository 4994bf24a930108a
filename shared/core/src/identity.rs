//! Which target a drafter was made for: the contract between a verifier and its drafters.
//! A drafter serves only the target whose identity it was trained against; the identity is
//! the architecture plus a hash of the input embedding, computed the same way for every
//! family so that a quantized file and its f32 export hash the same.

use sha2::{Digest, Sha256};

/// Every `IDENTITY_ROW_STRIDE`-th embedding row enters [`TargetIdentity::of_embedding`].
pub const IDENTITY_ROW_STRIDE: usize = 64;

/// Which target a drafter was made for: architecture plus a hash of its embedding.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TargetIdentity {
    /// Model family, `"gemma3"` or `"gemma4"`.
    pub architecture: String,
    /// Hex SHA-256 over the vocabulary size, the hidden size and the dequantized values
    /// of every 64th embedding row.
    pub embedding_hash: String,
}

impl TargetIdentity {
    /// The identity of an `architecture` target whose embedding has `vocab` rows of
    /// `hidden` values; `row(r, out)` writes row `r`'s dequantized values into `out`.
    pub fn of_embedding<E>(
        architecture: &str,
        vocab: usize,
        hidden: usize,
        mut row: impl FnMut(usize, &mut [f32]) -> Result<(), E>,
    ) -> Result<Self, E> {
        let mut hasher = Sha256::new();
        hasher.update((vocab as u64).to_le_bytes());
        hasher.update((hidden as u64).to_le_bytes());
        let mut values = vec![0f32; hidden];
        for r in (0..vocab).step_by(IDENTITY_ROW_STRIDE) {
            row(r, &mut values)?;
            values.iter().for_each(|x| hasher.update(x.to_le_bytes()));
        }
        let hash = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Self {
            architecture: architecture.into(),
            embedding_hash: hash,
        })
    }
}

impl std::fmt::Display for TargetIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.architecture, self.embedding_hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(vocab: usize, hidden: usize, bump: usize) -> TargetIdentity {
        TargetIdentity::of_embedding("gemma3", vocab, hidden, |r, out: &mut [f32]| {
            out.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (r * hidden + i + bump) as f32);
            Ok::<_, ()>(())
        })
        .expect("hash")
    }

    #[test]
    fn the_hash_covers_the_sizes_and_the_sampled_rows_only() {
        let base = identity(200, 4, 0);
        assert_eq!(base.embedding_hash.len(), 64);
        assert_eq!(base, identity(200, 4, 0), "deterministic");
        assert_ne!(base, identity(201, 4, 0), "vocabulary size");
        assert_ne!(base, identity(200, 4, 1), "row values");
        let unsampled = TargetIdentity::of_embedding("gemma3", 200, 4, |r, out: &mut [f32]| {
            let bump = usize::from(r % IDENTITY_ROW_STRIDE != 0);
            out.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (r * 4 + i + bump) as f32);
            Ok::<_, ()>(())
        });
        assert_eq!(
            unsampled.expect("hash"),
            base,
            "rows between samples do not count"
        );
        assert_eq!(base.to_string(), format!("gemma3:{}", base.embedding_hash));
    }

    #[test]
    fn a_failing_row_fails_the_identity() {
        let failed = TargetIdentity::of_embedding("gemma4", 10, 2, |_, _: &mut [f32]| Err("io"));
        assert_eq!(failed, Err("io"));
    }
}
