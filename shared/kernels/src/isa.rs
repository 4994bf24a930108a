//! Instruction-set selection, and a process-wide cap on it.
//!
//! Results differ in their last bits between two families of
//! implementations: [`Isa::Avx2`] and [`Isa::AvxVnni`] are bit-identical to
//! each other, [`Isa::Scalar`] sums in another order, and [`Isa::Amx`] gives
//! [`Isa::Scalar`]'s `int8` results for three types and [`Isa::AvxVnni`]'s
//! for the rest. Replicas on different CPUs can be made to return the same
//! bits by capping every one of them at the same level ([`Isa::set_max`],
//! like oneDNN's `ONEDNN_MAX_CPU_ISA`): capped at [`Isa::AvxVnni`], every
//! x86-64 CPU with AVX2, FMA and F16C computes what [`Isa::Avx2`] computes.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::KernelError;

/// A kernel implementation. Each one is batch invariant on its own; results
/// of different implementations agree closely but not bit for bit. Ordered
/// from the most portable to the fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, any target. Bit-identical on every machine.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C, detected at runtime.
    Avx2,
    /// [`Isa::Avx2`] plus VNNI (`dpbusd` / `dpwssd`) for the exact integer
    /// block dots of the quantized types: AVX-VNNI, or AVX-512 VNNI with
    /// AVX-512VL (the same 256-bit instructions, EVEX-encoded: Intel Ice
    /// Lake / Cascade Lake, AMD Zen 4), and with AVX-512 VNNI, 512-bit
    /// registers holding two (row, output) pairs when there are several
    /// activation rows.
    /// Bit-identical to [`Isa::Avx2`], only faster.
    AvxVnni,
    /// [`Isa::AvxVnni`] plus AVX-512 and Intel AMX-INT8 tiles for Q4_0,
    /// Q5_0 and Q8_0 weights with 8-bit activations: one tile instruction
    /// forms the exact block dots of 16 weight rows and up to 16 activation
    /// rows, then each block is scaled and added in the order of
    /// [`Isa::Scalar`], so for those types it is bit-identical to
    /// [`Isa::Scalar`]. Every other product runs the [`Isa::AvxVnni`] code
    /// and is bit-identical to it.
    Amx,
}

/// The cap set by [`Isa::set_max`].
static MAX: OnceLock<Isa> = OnceLock::new();

impl Isa {
    /// Every implementation, most portable first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Amx];

    /// The fastest implementation this CPU supports, at most the cap of
    /// [`Isa::set_max`] when one was set.
    pub fn detect() -> Isa {
        let max = MAX.get().copied().unwrap_or(Isa::Amx);
        Isa::ALL
            .into_iter()
            .rev()
            .find(|&isa| isa <= max && isa.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// Caps [`Isa::detect`], and so every matmul that does not name its
    /// implementation, at `max` for the rest of the process. Set it once,
    /// before the first matmul; setting the same cap again is a no-op, a
    /// different one is an error.
    pub fn set_max(max: Isa) -> Result<(), KernelError> {
        match *MAX.get_or_init(|| max) {
            set if set == max => Ok(()),
            set => Err(KernelError::IsaCapAlreadySet { set, wanted: max }),
        }
    }

    /// The cap of [`Isa::set_max`], if one was set.
    pub fn max() -> Option<Isa> {
        MAX.get().copied()
    }

    /// The implementation's name: `portable`, `avx2`, `avx-vnni` or `amx`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "portable",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Amx => "amx",
        }
    }

    /// Whether this CPU can run the implementation.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => avx2_available(),
            Isa::AvxVnni => avx2_available() && (vex_vnni() || evex_vnni()),
            Isa::Amx => Isa::AvxVnni.is_available() && amx_available(),
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = KernelError;

    /// An implementation by its [`Isa::name`].
    fn from_str(s: &str) -> Result<Isa, KernelError> {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name() == s)
            .ok_or_else(|| KernelError::UnknownIsa(s.to_owned()))
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}

/// Whether the CPU has AVX-VNNI: the VEX-encoded 256-bit `dpbusd` / `dpwssd`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn vex_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn vex_vnni() -> bool {
    false
}

/// Whether the CPU has AVX-512 VNNI with the 128/256-bit forms (AVX-512VL),
/// and AVX-512F/BW: the EVEX-encoded `dpbusd` / `dpwssd`, 256- and 512-bit.
#[cfg(target_arch = "x86_64")]
pub(crate) fn evex_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn evex_vnni() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn amx_available() -> bool {
    crate::amx::available()
}

#[cfg(not(target_arch = "x86_64"))]
fn amx_available() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::Isa;

    #[test]
    fn names_round_trip_and_order_runs_from_portable_to_fastest() {
        for isa in Isa::ALL {
            assert_eq!(isa.name().parse::<Isa>(), Ok(isa));
        }
        assert!(Isa::ALL.windows(2).all(|w| w[0] < w[1]));
        let err = "avx512".parse::<Isa>().map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err(r#"unknown CPU kernels "avx512": expected portable, avx2, avx-vnni or amx"#.into())
        );
    }
}
