//! Splitting the work into register tiles.
//!
//! A kernel dots a few weight rows with a *group* of activation rows at
//! once, so each unpacked weight block is reused from registers. Tiles only
//! decide which (row, output) pairs are computed together; every pair has
//! its own accumulator and the per-pair arithmetic is identical for every
//! tile shape, so the tiling cannot change any result.

/// Most activation rows the 8-bit kernels dot with one unpacked weight row.
pub(crate) const MAX_GROUP: usize = 9;

/// Splits rows `0..m` into `ceil(m / max)` contiguous groups of near-equal
/// size (each at most `max`), as `(first_row, len)` pairs.
pub(crate) fn groups(m: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = m.div_ceil(max.max(1));
    let base = m.checked_div(count).unwrap_or(0);
    let extra = m.checked_rem(count).unwrap_or(0);
    (0..count).map(move |g| (g * base + g.min(extra), base + usize::from(g < extra)))
}

/// Expands to a `match` on a runtime group length that binds the length as
/// the const `$r` (from the listed literals) and evaluates `$body`.
macro_rules! dispatch_group {
    ($len:expr, $r:ident => $body:expr, [$($n:literal),+]) => {
        match $len {
            $($n => {
                const $r: usize = $n;
                $body
            })+
            other => unreachable!("activation group of {other} rows exceeds the tile"),
        }
    };
}
pub(crate) use dispatch_group;

/// Expands to the tiling of an 8-bit kernel: calls
/// `$tile::<$t, R, J>(w, rb, rows, acts, r0, outs)`, which dots weight rows
/// `rows` (of `rb` bytes each in `w`) `J` at a time with activation rows
/// `r0..r0 + R`. Up to [`MAX_GROUP`] activation rows form a single group
/// and the weight rows are visited once, several at a time when the group
/// is small (`J` = 2 for two to four rows) so that enough independent
/// accumulators are in flight. A single row (decoding) reads one weight row
/// at a time, as one sequential stream from memory, unless `$side_by_side`
/// (types whose unpacking, not memory, bounds the kernel), which read four
/// rows side by side for one or two activation rows. (Four Q8_0 weight rows
/// against two activation rows took twice as long as two: the Q8_0 LM head
/// at M = 2, capped at AVX2 on a Zen 5, 15.2–17.7 ms against 7.7.) More
/// rows are split into groups of 5 to 9 rows, all visiting one weight row
/// before the next.
macro_rules! dispatch_tiles {
    ($tile:ident::<$t:ident>($w:expr, $rb:expr, $acts:expr, $outs:expr), $side_by_side:expr) => {{
        let (w, rb, acts, outs) = ($w, $rb, $acts, $outs);
        let n = w.len() / rb;
        match outs.len() {
            1 if $side_by_side => $tile::<$t, 1, 4>(w, rb, 0..n, acts, 0, outs),
            1 => $tile::<$t, 1, 1>(w, rb, 0..n, acts, 0, outs),
            2 if $side_by_side => $tile::<$t, 2, 4>(w, rb, 0..n, acts, 0, outs),
            2 => $tile::<$t, 2, 2>(w, rb, 0..n, acts, 0, outs),
            3 => $tile::<$t, 3, 2>(w, rb, 0..n, acts, 0, outs),
            4 => $tile::<$t, 4, 2>(w, rb, 0..n, acts, 0, outs),
            5 => $tile::<$t, 5, 1>(w, rb, 0..n, acts, 0, outs),
            6 => $tile::<$t, 6, 1>(w, rb, 0..n, acts, 0, outs),
            7 => $tile::<$t, 7, 1>(w, rb, 0..n, acts, 0, outs),
            8 => $tile::<$t, 8, 1>(w, rb, 0..n, acts, 0, outs),
            9 => $tile::<$t, 9, 1>(w, rb, 0..n, acts, 0, outs),
            m => {
                for j in 0..n {
                    for (r0, len) in $crate::tile::groups(m, $crate::tile::MAX_GROUP) {
                        $crate::tile::dispatch_group!(
                            len,
                            R => $tile::<$t, R, 1>(w, rb, j..j + 1, acts, r0, outs),
                            [5, 6, 7, 8, 9]
                        );
                    }
                }
            }
        }
    }};
}
pub(crate) use dispatch_tiles;

#[cfg(test)]
mod tests {
    use super::groups;

    #[test]
    fn groups_cover_rows_in_balanced_pieces() {
        for max in 1..=9 {
            for m in 0..40 {
                let gs: Vec<_> = groups(m, max).collect();
                let mut next = 0;
                for &(start, len) in &gs {
                    assert_eq!(start, next);
                    assert!((1..=max).contains(&len));
                    next += len;
                }
                assert_eq!(next, m);
                let lens = gs.iter().map(|g| g.1);
                let spread = lens.clone().max().unwrap_or(0) - lens.min().unwrap_or(0);
                assert!(spread <= 1);
            }
        }
    }
}
