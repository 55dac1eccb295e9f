//! Run-time CPU features: which lane width a loop may take (the answers are cached).

/// Whether this CPU has AVX2 and FMA (cached by std after the first call).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Whether this CPU has AVX-512F (checked once): the loops then take 16 lanes per step.
#[cfg(target_arch = "x86_64")]
pub fn avx512() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
}
