//! The machine's multiply-add peak per dot dtype, as this run dispatches (issue 22 item 1): every
//! thread runs a loop of independent multiply-adds of the instruction the dot kernel of that dtype
//! uses here — `vdpbf16ps` (bf16, AVX-512 BF16 where it outruns a 512-bit FMA; else 512-bit FMAs of
//! the widened operands), `vpdpbusd` (i8, AVX-512 VNNI), a 512-bit FMA (f32: the
//! `gemm` crate's AVX-512 kernel, which `TPU_KERNEL_CPU` does not cap), and under `TPU_KERNEL_CPU=avx2`
//! 256-bit FMAs for bf16 (the portable kernel in `vdpbf16ps`'s order) and i8 (widened to f32) — and
//! the operations per second of all threads together are the peak a dot case is measured against.

use std::time::{Duration, Instant};

/// (dtype, instruction, GFLOP/s — GOP/s for i8 — of all `threads` threads).
pub fn peaks(threads: usize) -> Vec<(&'static str, &'static str, f64)> {
    use tpu_kernel::runtime::math::cpu;
    let fma256 = ("256-bit FMA", 16.0, loop_fma256 as fn(u64) -> f32);
    #[cfg(target_arch = "x86_64")]
    {
        let fma512 = ("512-bit FMA", 32.0, loop_fma512 as fn(u64) -> f32);
        let has512 = std::arch::is_x86_feature_detected!("avx512f");
        let f32_loop = if has512 { fma512 } else { fma256 };
        // bf16 dots run as `vdpbf16ps` where it is the faster, else as FMAs of the widened operands.
        let bf16_loop = match cpu::bf16_dot() {
            cpu::Bf16Dot::Dpbf16 => ("vdpbf16ps", 64.0, loop_dpbf16 as fn(u64) -> f32),
            cpu::Bf16Dot::Fma512 => fma512,
            cpu::Bf16Dot::Fma256 | cpu::Bf16Dot::Scalar => fma256,
        };
        let i8_loop = if cpu::avx512_vnni() {
            ("vpdpbusd", 128.0, loop_dpbusd as fn(u64) -> f32)
        } else {
            f32_loop
        };
        [("bf16", bf16_loop), ("f32", f32_loop), ("i8", i8_loop)]
            .into_iter()
            .map(|(d, (name, ops, f))| (d, name, rate(threads, ops, f)))
            .collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (cpu::level(), fma256, threads);
        Vec::new()
    }
}

/// Operations per second (in G) of `f` run for ~0.2 s on each of `threads` threads at once; `f(n)`
/// runs n iterations of 12 instructions of `ops` operations each.
fn rate(threads: usize, ops: f64, f: fn(u64) -> f32) -> f64 {
    let iters = 1u64 << 20;
    let budget = Duration::from_millis(200);
    let start = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let mut done = 0u64;
                    while start.elapsed() < budget {
                        std::hint::black_box(f(iters));
                        done += iters;
                    }
                    done
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("peak thread")).sum()
    });
    total as f64 * 12.0 * ops / start.elapsed().as_secs_f64() / 1e9
}

macro_rules! independent_loop {
    ($name:ident, $feat:literal, $ty:ty, $zero:expr, |$a:ident, $x:ident| $step:expr, $sum:expr) => {
        #[cfg(target_arch = "x86_64")]
        fn $name(n: u64) -> f32 {
            #[target_feature(enable = $feat)]
            unsafe fn inner(n: u64) -> f32 {
                use std::arch::x86_64::*;
                let mut acc: [$ty; 12] = [$zero; 12];
                let $x = std::hint::black_box($zero);
                for _ in 0..n {
                    for $a in acc.iter_mut() {
                        *$a = $step;
                    }
                }
                let s: $ty = acc.iter().fold($zero, |p, q| $sum(p, *q));
                std::mem::transmute::<$ty, [f32; std::mem::size_of::<$ty>() / 4]>(s)[0]
            }
            // SAFETY: the caller checked the CPU feature.
            unsafe { inner(n) }
        }
    };
}

independent_loop!(
    loop_fma256,
    "avx2,fma",
    __m256,
    _mm256_set1_ps(1e-9),
    |a, x| _mm256_fmadd_ps(*a, x, x),
    |p, q| _mm256_add_ps(p, q)
);
independent_loop!(
    loop_fma512,
    "avx512f",
    __m512,
    _mm512_set1_ps(1e-9),
    |a, x| _mm512_fmadd_ps(*a, x, x),
    |p, q| _mm512_add_ps(p, q)
);
independent_loop!(
    loop_dpbf16,
    "avx512f,avx512bf16",
    __m512,
    _mm512_set1_ps(1e-9),
    |a, x| _mm512_dpbf16_ps(
        *a,
        std::mem::transmute::<__m512, __m512bh>(x),
        std::mem::transmute::<__m512, __m512bh>(x)
    ),
    |p, q| _mm512_add_ps(p, q)
);
independent_loop!(
    loop_dpbusd,
    "avx512f,avx512vnni",
    __m512i,
    _mm512_set1_epi32(1),
    |a, x| _mm512_dpbusd_epi32(*a, x, x),
    |p, q| _mm512_add_epi32(p, q)
);

#[cfg(not(target_arch = "x86_64"))]
fn loop_fma256(_: u64) -> f32 {
    0.0
}
