//! Intel AMX tile primitives: detection, the per-process permission, tile
//! configuration and the few tile instructions the kernels use.
//!
//! Rust has no stable AMX intrinsics, so the instructions are written as
//! inline assembly on fixed tile registers (the compiler never allocates
//! them). A kernel holds a [`Tiles`] for the duration of a call: creating it
//! loads a tile configuration on the current thread, dropping it releases
//! the tile state again (so a thread that is not in a kernel carries none).
//!
//! Linux hands out the 8 KiB tile data state only to processes that ask for
//! it (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`available`]
//! asks once and reports AMX as absent when the kernel refuses.

use std::arch::asm;
use std::sync::OnceLock;

/// `arch_prctl` request for permission to use an extended state component.
const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
/// The XSAVE component number of the AMX tile data.
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// Whether this CPU has AMX-TILE and AMX-INT8 with AVX-512 (F, BW, VL,
/// VNNI) and
/// the operating system lets this process use the tiles.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("f16c");
        avx512 && cpu_has_amx_int8() && request_permission()
    })
}

/// CPUID leaf 7: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
fn cpu_has_amx_int8() -> bool {
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    leaf.edx & (0b11 << 24) == 0b11 << 24
}

/// Asks Linux for the tile data state (per process, idempotent).
fn request_permission() -> bool {
    // SAFETY: a plain system call with integer arguments.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    rc == 0
}

/// The shape of one tile register: `rows` rows of `bytes` bytes each.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) rows: u8,
    pub(crate) bytes: u16,
}

/// The 64-byte `ldtilecfg` operand, palette 1.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes: [u16; 16],
    rows: [u8; 16],
    tail: [u8; 16],
}

/// Tile registers configured on the current thread; released on drop.
pub(crate) struct Tiles(());

impl Tiles {
    /// Configures `shapes[t]` as tile register `tmm{t}` on this thread.
    ///
    /// # Safety
    /// [`available`] must hold.
    pub(crate) unsafe fn new(shapes: &[Shape]) -> Tiles {
        let mut cfg = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes: [0; 16],
            rows: [0; 16],
            tail: [0; 16],
        };
        for (t, s) in shapes.iter().enumerate() {
            cfg.bytes[t] = s.bytes;
            cfg.rows[t] = s.rows;
        }
        // SAFETY: AMX is available (caller) and `cfg` is a valid palette-1
        // configuration with every shape within 16 rows of 64 bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a configuration was loaded by `Tiles::new`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Zeroes tile register `tmm{C}`.
#[inline(always)]
pub(crate) fn zero<const C: u8>(_: &Tiles) {
    // SAFETY: tiles are configured (the `Tiles` borrow).
    unsafe { asm!("tilezero tmm{c}", c = const C, options(nostack, nomem)) };
}

/// Loads tile register `tmm{T}` from rows `stride` bytes apart starting at
/// `src`.
///
/// # Safety
/// Every row of `tmm{T}`'s configured shape must be readable at
/// `src + i * stride`.
#[inline(always)]
pub(crate) unsafe fn load<const T: u8>(_: &Tiles, src: *const i8, stride: usize) {
    // SAFETY: the caller guarantees the rows are readable.
    unsafe {
        asm!("tileloadd tmm{t}, [{p} + {s} * 1]", t = const T, p = in(reg) src,
             s = in(reg) stride, options(nostack, readonly));
    }
}

/// `tmm{C} += tmm{A} · tmm{B}` over signed bytes (`tdpbssd`): exact `i32`
/// sums of four products per step.
#[inline(always)]
pub(crate) fn dot<const C: u8, const A: u8, const B: u8>(_: &Tiles) {
    // SAFETY: tiles are configured (the `Tiles` borrow).
    unsafe {
        asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
             options(nostack, nomem));
    }
}

/// Stores tile register `tmm{C}` to rows `stride` bytes apart starting at
/// `dst`.
///
/// # Safety
/// Every row of `tmm{C}`'s configured shape must be writable at
/// `dst + i * stride`.
#[inline(always)]
pub(crate) unsafe fn store<const C: u8>(_: &Tiles, dst: *mut i32, stride: usize) {
    // SAFETY: the caller guarantees the rows are writable.
    unsafe {
        asm!("tilestored [{p} + {s} * 1], tmm{c}", c = const C, p = in(reg) dst,
             s = in(reg) stride, options(nostack));
    }
}
