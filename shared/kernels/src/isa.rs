//! Instruction-set selection.

/// A kernel implementation. Each one is batch invariant on its own; results
/// of different implementations agree closely but not bit for bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

impl Isa {
    /// The fastest implementation this CPU supports.
    pub fn detect() -> Isa {
        [Isa::Amx, Isa::AvxVnni, Isa::Avx2]
            .into_iter()
            .find(|isa| isa.is_available())
            .unwrap_or(Isa::Scalar)
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
