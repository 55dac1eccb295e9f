//! Run-time CPU features: which lane width a loop may take and which dot kernels run (each answer
//! checked once).
//!
//! `TPU_KERNEL_CPU` caps what is used, to run this machine as a smaller one (every path gives the plain
//! path's bits, so a capped run must give the same outputs): `avx2` — no AVX-512, so neither the
//! AVX-512 loops nor the AVX-512 BF16 / VNNI dot kernels —, `scalar` — no vector loops either —,
//! `native` or unset — all the CPU has. [`describe`] says what a run dispatches to. The f32 GEMM
//! (`gemm` crate) picks its own kernels and is not capped.

/// How much of the CPU's vector hardware runs (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Scalar,
    Avx2,
    Native,
}

/// The level `TPU_KERNEL_CPU` asks for (`Err` with the value when it names none).
fn requested() -> Result<Level, String> {
    match std::env::var("TPU_KERNEL_CPU").as_deref() {
        Err(_) | Ok("") | Ok("native") => Ok(Level::Native),
        Ok("avx2") => Ok(Level::Avx2),
        Ok("scalar") => Ok(Level::Scalar),
        Ok(other) => Err(other.to_string()),
    }
}

/// The level this process runs at (an unknown `TPU_KERNEL_CPU` runs natively; [`describe`] says so).
pub fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| requested().unwrap_or(Level::Native))
}

#[cfg(target_arch = "x86_64")]
macro_rules! has {
    ($($f:tt),+) => {
        true $(&& std::arch::is_x86_feature_detected!($f))+
    };
}

/// Whether loops take 8 lanes (AVX2 and FMA).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn avx2() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| level() >= Level::Avx2 && has!("avx2", "fma"))
}

/// Whether loops take 16 lanes (AVX-512F).
#[cfg(target_arch = "x86_64")]
pub fn avx512() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| level() >= Level::Native && has!("avx512f"))
}

/// Whether the AVX-512 BF16 dot kernel runs (AVX-512F, BW and BF16).
#[cfg(target_arch = "x86_64")]
pub fn avx512_bf16() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| level() >= Level::Native && has!("avx512f", "avx512bw", "avx512bf16"))
}

/// Whether the AVX-512 VNNI int8 dot kernel runs (AVX-512F and VNNI).
#[cfg(target_arch = "x86_64")]
pub fn avx512_vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| level() >= Level::Native && has!("avx512f", "avx512vnni"))
}

/// Whether bf16 dots run as `vdpbf16ps` rather than as f32 FMAs of the widened operands (both give
/// `vdpbf16ps`'s bits; the faster runs). Per cycle, `vdpbf16ps` does twice a 512-bit FMA's
/// multiply-adds on AMD (Zen 4: 460 vs 221 GFLOP/s on 2 threads) and half of them on Intel without
/// AMX (a Sapphire-Rapids-class Xeon: 169 vs 347) — `cargo bench --bench interpret`'s peak line.
#[cfg(target_arch = "x86_64")]
pub fn bf16_dot_by_dpbf16() -> bool {
    static BY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BY.get_or_init(|| avx512_bf16() && !intel())
}

/// The kernel that runs bf16 × bf16 dots: every one gives `vdpbf16ps`'s bits, so the fastest this
/// CPU (and `TPU_KERNEL_CPU`) allows runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Dot {
    /// `vdpbf16ps` tiles ([`bf16_dot_by_dpbf16`]).
    Dpbf16,
    /// FMAs of the widened operands in 512-bit registers (AVX-512F).
    Fma512,
    /// FMAs of the widened operands in 256-bit registers (AVX2 + FMA).
    Fma256,
    /// The scalar definition.
    Scalar,
}

/// Which [`Bf16Dot`] kernel this process runs.
pub fn bf16_dot() -> Bf16Dot {
    if bf16_dot_by_dpbf16() {
        Bf16Dot::Dpbf16
    } else if avx2() && avx512() {
        Bf16Dot::Fma512
    } else if avx2() {
        Bf16Dot::Fma256
    } else {
        Bf16Dot::Scalar
    }
}

/// Whether the CPU's vendor string is `GenuineIntel`.
#[cfg(target_arch = "x86_64")]
fn intel() -> bool {
    let r = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    for (i, w) in [r.ebx, r.edx, r.ecx].into_iter().enumerate() {
        vendor[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    &vendor == b"GenuineIntel"
}

#[cfg(not(target_arch = "x86_64"))]
pub fn bf16_dot_by_dpbf16() -> bool {
    false
}
#[cfg(not(target_arch = "x86_64"))]
pub fn avx2() -> bool {
    false
}
#[cfg(not(target_arch = "x86_64"))]
pub fn avx512() -> bool {
    false
}
#[cfg(not(target_arch = "x86_64"))]
pub fn avx512_bf16() -> bool {
    false
}
#[cfg(not(target_arch = "x86_64"))]
pub fn avx512_vnni() -> bool {
    false
}

/// What this process dispatches to, e.g. `avx2+fma avx512f avx512-bf16-dot avx512-vnni-dot` (and the
/// cap when `TPU_KERNEL_CPU` sets one).
pub fn describe() -> String {
    let mut parts = Vec::new();
    for (on, name) in [
        (avx2(), "avx2+fma"),
        (avx512(), "avx512f"),
        (bf16_dot() == Bf16Dot::Dpbf16, "avx512-bf16-dot"),
        (bf16_dot() == Bf16Dot::Fma512, "bf16-dot-as-fma512"),
        (avx512_vnni(), "avx512-vnni-dot"),
    ] {
        if on {
            parts.push(name);
        }
    }
    let mut s = if parts.is_empty() {
        "scalar".to_string()
    } else {
        parts.join(" ")
    };
    match requested() {
        Ok(Level::Native) => {}
        Ok(l) => s += &format!(" (capped by TPU_KERNEL_CPU: {l:?})"),
        Err(v) => {
            s += &format!(" (TPU_KERNEL_CPU={v:?} is not one of native, avx2, scalar: ignored)")
        }
    }
    s
}
