//! What the interpreter's column of the op table (`kernel-runtime/src/interpret/ops.rs`) names: an f32 function, either a closure (the interpreter's loops
//! call it per element, and the compiler vectorizes them where it can) or one of the items below, a
//! function written once over [`Lanes`] whose loops run 8 or 16 lanes at a time. The fused and unfused
//! paths both go through these traits, so an op has one definition and one set of bits.

use super::lanes::Lanes;
use std::mem::MaybeUninit;

/// A unary f32 function (an entry of the interpreter's op column).
pub trait UnaryF32: Copy {
    /// Whether [`UnaryF32::run`] has vector forms (else callers loop over `scalar`).
    const VECTOR: bool = false;
    fn scalar(self, x: f32) -> f32;
    /// `v[i] = f(v[i])`.
    #[inline(always)]
    fn run(self, v: &mut [f32]) {
        for x in v {
            *x = self.scalar(*x);
        }
    }
    /// `dst[i] = f(src[i])`.
    #[inline(always)]
    fn map(self, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            d.write(self.scalar(x));
        }
    }
    /// `dst[i] = f(pre(src[i]))`.
    #[inline(always)]
    fn map_pre(self, pre: Pre, src: &[f32], dst: &mut [f32]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = self.scalar(pre.apply(x));
        }
    }
}

/// A binary op with a broadcast value, applied to each element on its way into a unary function (a
/// fused chain's `x * c` before `tanh`): the op's own IEEE operation, with its operands in its order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pre {
    Id,
    /// `x + c`.
    Add(f32),
    Sub(f32),
    Mul(f32),
    Div(f32),
}

impl Pre {
    #[inline(always)]
    pub(crate) fn apply<V: Lanes>(self, x: V) -> V {
        match self {
            Pre::Id => x,
            Pre::Add(c) => x + x.splat(c),
            Pre::Sub(c) => x - x.splat(c),
            Pre::Mul(c) => x * x.splat(c),
            Pre::Div(c) => x / x.splat(c),
        }
    }
}

impl<F: Fn(f32) -> f32 + Copy> UnaryF32 for F {
    #[inline(always)]
    fn scalar(self, x: f32) -> f32 {
        self(x)
    }
}

/// An operand of a binary function over a run of elements.
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    Slice(&'a [f32]),
    Scalar(f32),
}

/// A binary f32 function (an entry of the interpreter's op column).
pub trait BinaryF32: Copy {
    /// Whether the `zip` methods have vector forms (else callers loop over `scalar`).
    const VECTOR: bool = false;
    fn scalar(self, x: f32, y: f32) -> f32;
    /// `v[i] = f(v[i], e[i])` (`v_is_lhs`) or `f(e[i], v[i])`.
    #[inline(always)]
    fn zip_in_place(self, v: &mut [f32], e: Operand<'_>, v_is_lhs: bool) {
        for (i, x) in v.iter_mut().enumerate() {
            let y = match e {
                Operand::Slice(s) => s[i],
                Operand::Scalar(y) => y,
            };
            *x = if v_is_lhs {
                self.scalar(*x, y)
            } else {
                self.scalar(y, *x)
            };
        }
    }
    /// `dst[i] = f(a[i], b[i])`.
    #[inline(always)]
    fn zip_into(self, dst: &mut [MaybeUninit<f32>], a: Operand<'_>, b: Operand<'_>) {
        let at = |o: Operand<'_>, i: usize| match o {
            Operand::Slice(s) => s[i],
            Operand::Scalar(y) => y,
        };
        for (i, d) in dst.iter_mut().enumerate() {
            d.write(self.scalar(at(a, i), at(b, i)));
        }
    }
}

impl<F: Fn(f32, f32) -> f32 + Copy> BinaryF32 for F {
    #[inline(always)]
    fn scalar(self, x: f32, y: f32) -> f32 {
        self(x, y)
    }
}

/// A unary function written once over [`Lanes`].
pub(crate) trait Kernel1: Copy {
    fn apply<V: Lanes>(x: V) -> V;
}

/// A binary function written once over [`Lanes`].
pub(crate) trait Kernel2: Copy {
    fn apply<V: Lanes>(x: V, y: V) -> V;
}

/// Defines each table item: a unit struct whose scalar is `$f::<f32>` and whose loops run the lane forms.
macro_rules! unary_items {
    ($($(#[doc = $doc:literal])* $T:ident = $f:path;)*) => {$(
        $(#[doc = $doc])*
        #[derive(Clone, Copy, Debug)]
        pub struct $T;
        impl Kernel1 for $T {
            #[inline(always)]
            fn apply<V: Lanes>(x: V) -> V {
                $f(x)
            }
        }
        impl UnaryF32 for $T {
            const VECTOR: bool = true;
            #[inline(always)]
            fn scalar(self, x: f32) -> f32 {
                $f(x)
            }
            fn run(self, v: &mut [f32]) {
                let p = v.as_mut_ptr();
                // SAFETY: `p` addresses `v.len()` elements, read and written in place.
                unsafe { drive::unary::<$T>(Pre::Id, p, p, v.len()) }
            }
            fn map(self, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
                assert_eq!(src.len(), dst.len(), "elementwise row lengths");
                let (s, d, n) = (src.as_ptr(), dst.as_mut_ptr() as *mut f32, src.len());
                // SAFETY: `src` and `dst` each address `n` elements; a `&mut` `dst` cannot overlap
                // `src`.
                unsafe { drive::unary::<$T>(Pre::Id, s, d, n) }
            }
            fn map_pre(self, pre: Pre, src: &[f32], dst: &mut [f32]) {
                assert_eq!(src.len(), dst.len(), "elementwise row lengths");
                let (s, d, n) = (src.as_ptr(), dst.as_mut_ptr(), src.len());
                // SAFETY: as in `map`.
                unsafe { drive::unary::<$T>(pre, s, d, n) }
            }
        }
    )*};
}

unary_items! {
    /// `tanh` (≤ 2 ulp).
    Tanh = super::approx::tanh;
    /// `1 / (1 + e^-x)` (≤ 3 ulp).
    Logistic = super::approx::logistic;
    /// `ln x` (≤ 0.9 ulp).
    Log = super::approx::log;
    /// `ln(1 + x)` (≤ 1 ulp).
    Log1p = super::approx::log1p;
    /// `erf` (≤ 1.1 ulp).
    Erf = super::approx::erf;
    /// `sin` (≤ 1.6 ulp).
    Sin = super::trig::sin;
    /// `cos` (≤ 1.6 ulp).
    Cos = super::trig::cos;
    /// `1/√x`, correctly rounded.
    Rsqrt = super::pow::rsqrt;
}

/// The binary items: `Kernel2` and `BinaryF32` for a unit struct from a function over [`Lanes`].
macro_rules! binary_item {
    ($T:ident, $f:path) => {
        impl Kernel2 for $T {
            #[inline(always)]
            fn apply<V: Lanes>(x: V, y: V) -> V {
                $f(x, y)
            }
        }
        impl BinaryF32 for $T {
            const VECTOR: bool = true;
            #[inline(always)]
            fn scalar(self, x: f32, y: f32) -> f32 {
                $f(x, y)
            }
            fn zip_in_place(self, v: &mut [f32], e: Operand<'_>, v_is_lhs: bool) {
                let n = v.len();
                let p = v.as_mut_ptr();
                let e = drive::Arg::of(e, n);
                let (a, b) = if v_is_lhs {
                    (drive::Arg::Ptr(p), e)
                } else {
                    (e, drive::Arg::Ptr(p))
                };
                // SAFETY: `p` addresses `n` elements, read and written in place; `e` is checked by
                // `Arg::of`.
                unsafe { drive::binary::<$T>(a, b, p, n) }
            }
            fn zip_into(self, dst: &mut [MaybeUninit<f32>], a: Operand<'_>, b: Operand<'_>) {
                let n = dst.len();
                let (a, b) = (drive::Arg::of(a, n), drive::Arg::of(b, n));
                // SAFETY: `dst` addresses `n` elements; the operands hold at least `n` (checked by
                // `Arg::of`) and cannot overlap a `&mut` `dst`.
                unsafe { drive::binary::<$T>(a, b, dst.as_mut_ptr() as *mut f32, n) }
            }
        }
    };
}

/// `x^y` (≤ 1 ulp; C99 `powf` special cases).
#[derive(Clone, Copy, Debug)]
pub struct Pow;
binary_item!(Pow, super::pow::pow);

/// `x % y` (exact; C `fmodf`).
#[derive(Clone, Copy, Debug)]
pub struct Rem;
binary_item!(Rem, super::pow::rem);

/// `e^x`: [`crate::exp_f32`], whose vector loops (with the fused softmax forms) are [`crate::exp_run`].
#[derive(Clone, Copy, Debug)]
pub struct Exp;
impl UnaryF32 for Exp {
    const VECTOR: bool = true;
    #[inline(always)]
    fn scalar(self, x: f32) -> f32 {
        super::exp_f32(x)
    }
    fn run(self, v: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::avx2() {
            // SAFETY: the CPU has AVX2 and FMA (checked at run time); same bits as `exp_f32`.
            unsafe { crate::exp_run(v, crate::ExpIn::InPlace, None) };
            return;
        }
        for x in v {
            *x = super::exp_f32(*x);
        }
    }
    fn map(self, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        assert_eq!(src.len(), dst.len(), "elementwise row lengths");
        for (d, &x) in dst.iter_mut().zip(src) {
            d.write(x);
        }
        // SAFETY: every element of `dst` was just written.
        let v = unsafe { &mut *(dst as *mut [MaybeUninit<f32>] as *mut [f32]) };
        self.run(v);
    }
    fn map_pre(self, pre: Pre, src: &[f32], dst: &mut [f32]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = pre.apply(x);
        }
        self.run(dst);
    }
}

/// The loops: 16 lanes (AVX-512F), 8 (AVX2+FMA) or one, chosen at run time per call; a row's last
/// partial vector runs padded in a full one (all widths give the same bits anyway). Sixteen lanes pay
/// for every function here (1.3–2.1× over eight on this project's AVX-512 machine, Zen 4).
pub(crate) mod drive {
    use super::{Kernel1, Kernel2, Operand, Pre};
    #[cfg(target_arch = "x86_64")]
    use crate::cpu::{avx2, avx512};
    #[cfg(target_arch = "x86_64")]
    use crate::lanes256::V8;
    #[cfg(target_arch = "x86_64")]
    use crate::lanes512::V16;

    /// A binary operand: `n` elements from a pointer, or one value for all.
    #[derive(Clone, Copy)]
    pub(crate) enum Arg {
        Ptr(*const f32),
        Splat(f32),
    }

    impl Arg {
        /// The operand of a run of `n` elements (panics on a short slice).
        pub(crate) fn of(o: Operand<'_>, n: usize) -> Arg {
            match o {
                Operand::Slice(s) => {
                    assert!(s.len() >= n, "elementwise operand length");
                    Arg::Ptr(s.as_ptr())
                }
                Operand::Scalar(y) => Arg::Splat(y),
            }
        }
        /// # Safety
        /// A `Ptr` must be valid for reading `i + 1` elements.
        #[inline(always)]
        unsafe fn at(self, i: usize) -> f32 {
            match self {
                // SAFETY: forwarded to the caller.
                Arg::Ptr(p) => unsafe { *p.add(i) },
                Arg::Splat(y) => y,
            }
        }
    }

    /// `dst[i] = K(pre(src[i]))` for `i < n`.
    ///
    /// # Safety
    /// `src` must be valid for reading and `dst` for writing `n` f32; they are the same or disjoint.
    pub(crate) unsafe fn unary<K: Kernel1>(pre: Pre, src: *const f32, dst: *mut f32, n: usize) {
        #[cfg(target_arch = "x86_64")]
        if avx2() {
            // SAFETY: the features were checked just now; the pointers by the caller.
            unsafe {
                if avx512() {
                    unary_avx512::<K>(pre, src, dst, n)
                } else {
                    unary_avx2::<K>(pre, src, dst, n)
                }
            }
            return;
        }
        for i in 0..n {
            // SAFETY: `i < n`, by the caller's contract.
            unsafe { *dst.add(i) = K::apply(pre.apply(*src.add(i))) };
        }
    }

    /// `dst[i] = K(a[i], b[i])` for `i < n`.
    ///
    /// # Safety
    /// Pointer operands must be valid for reading and `dst` for writing `n` f32; each operand is
    /// `dst` itself or disjoint from it.
    pub(crate) unsafe fn binary<K: Kernel2>(a: Arg, b: Arg, dst: *mut f32, n: usize) {
        #[cfg(target_arch = "x86_64")]
        if avx2() {
            // SAFETY: the features were checked just now; the pointers by the caller.
            unsafe {
                if avx512() {
                    binary_avx512::<K>(a, b, dst, n)
                } else {
                    binary_avx2::<K>(a, b, dst, n)
                }
            }
            return;
        }
        for i in 0..n {
            // SAFETY: `i < n`, by the caller's contract.
            unsafe { *dst.add(i) = K::apply(a.at(i), b.at(i)) };
        }
    }

    /// The unary and binary loops for one vector type (`$V`, `$N` lanes, `$feat` enabled).
    macro_rules! loops {
        ($unary:ident, $binary:ident, $V:ident, $N:literal, $feat:literal) => {
            /// # Safety
            /// As [`unary`], and the CPU must support the enabled features.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = $feat)]
            unsafe fn $unary<K: Kernel1>(pre: Pre, src: *const f32, dst: *mut f32, n: usize) {
                let mut i = 0;
                while i + $N <= n {
                    // SAFETY: `i + $N <= n`; the features by the caller.
                    let x = unsafe { $V::load_ptr(src.add(i)) };
                    // SAFETY: as above.
                    unsafe { K::apply(pre.apply(x)).store_ptr(dst.add(i)) };
                    i += $N;
                }
                if i < n {
                    let mut buf = [0f32; $N];
                    for (k, b) in buf[..n - i].iter_mut().enumerate() {
                        // SAFETY: `i + k < n`.
                        *b = unsafe { *src.add(i + k) };
                    }
                    // SAFETY: `buf` holds `$N` elements; the features by the caller.
                    let x = unsafe { $V::load_ptr(buf.as_ptr()) };
                    // SAFETY: as above.
                    unsafe { K::apply(pre.apply(x)).store_ptr(buf.as_mut_ptr()) };
                    for (k, b) in buf[..n - i].iter().enumerate() {
                        // SAFETY: `i + k < n`.
                        unsafe { *dst.add(i + k) = *b };
                    }
                }
            }

            /// # Safety
            /// As [`binary`], and the CPU must support the enabled features.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = $feat)]
            unsafe fn $binary<K: Kernel2>(a: Arg, b: Arg, dst: *mut f32, n: usize) {
                // SAFETY: (both loads) `i + $N <= n` for pointers; the features by the caller.
                let load = |o: Arg, i: usize| unsafe {
                    match o {
                        Arg::Ptr(p) => $V::load_ptr(p.add(i)),
                        Arg::Splat(y) => $V::splat_new(y),
                    }
                };
                let mut i = 0;
                while i + $N <= n {
                    let y = K::apply(load(a, i), load(b, i));
                    // SAFETY: `i + $N <= n`.
                    unsafe { y.store_ptr(dst.add(i)) };
                    i += $N;
                }
                if i < n {
                    let (mut ba, mut bb) = ([0f32; $N], [0f32; $N]);
                    for k in 0..n - i {
                        // SAFETY: `i + k < n`.
                        unsafe { (ba[k], bb[k]) = (a.at(i + k), b.at(i + k)) };
                    }
                    // SAFETY: the buffers hold `$N` elements; the features by the caller.
                    let (x, y) = unsafe { ($V::load_ptr(ba.as_ptr()), $V::load_ptr(bb.as_ptr())) };
                    let y = K::apply(x, y);
                    // SAFETY: as above.
                    unsafe { y.store_ptr(ba.as_mut_ptr()) };
                    for (k, v) in ba[..n - i].iter().enumerate() {
                        // SAFETY: `i + k < n`.
                        unsafe { *dst.add(i + k) = *v };
                    }
                }
            }
        };
    }
    loops!(unary_avx2, binary_avx2, V8, 8, "avx2,fma");
    loops!(unary_avx512, binary_avx512, V16, 16, "avx512f,avx2,fma");

    #[cfg(test)]
    pub(crate) use tests_api::*;
    /// The loops of one width, for the tests' width-by-width comparisons.
    #[cfg(test)]
    mod tests_api {
        use super::*;
        /// `K` over `v` in place with 8 lanes (false without AVX2+FMA).
        pub(crate) fn unary8<K: Kernel1>(v: &mut [f32]) -> bool {
            #[cfg(target_arch = "x86_64")]
            if avx2() {
                let p = v.as_mut_ptr();
                // SAFETY: checked just now; `p` addresses `v.len()` elements.
                unsafe { unary_avx2::<K>(Pre::Id, p, p, v.len()) };
                return true;
            }
            false
        }
        /// `K` over `v` in place with 16 lanes (false without AVX-512F).
        pub(crate) fn unary16<K: Kernel1>(v: &mut [f32]) -> bool {
            #[cfg(target_arch = "x86_64")]
            if avx2() && avx512() {
                let p = v.as_mut_ptr();
                // SAFETY: checked just now; `p` addresses `v.len()` elements.
                unsafe { unary_avx512::<K>(Pre::Id, p, p, v.len()) };
                return true;
            }
            false
        }
        /// `v[i] = K(v[i], y[i])` with 8 lanes.
        pub(crate) fn binary8<K: Kernel2>(v: &mut [f32], y: &[f32]) -> bool {
            #[cfg(target_arch = "x86_64")]
            if avx2() {
                assert_eq!(v.len(), y.len());
                let p = v.as_mut_ptr();
                // SAFETY: checked just now; both address `v.len()` elements.
                unsafe { binary_avx2::<K>(Arg::Ptr(p), Arg::Ptr(y.as_ptr()), p, v.len()) };
                return true;
            }
            false
        }
        /// `v[i] = K(v[i], y[i])` with 16 lanes.
        pub(crate) fn binary16<K: Kernel2>(v: &mut [f32], y: &[f32]) -> bool {
            #[cfg(target_arch = "x86_64")]
            if avx2() && avx512() {
                assert_eq!(v.len(), y.len());
                let p = v.as_mut_ptr();
                // SAFETY: checked just now; both address `v.len()` elements.
                unsafe { binary_avx512::<K>(Arg::Ptr(p), Arg::Ptr(y.as_ptr()), p, v.len()) };
                return true;
            }
            false
        }
    }
}
