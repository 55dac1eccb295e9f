//! The one order in which a row reduction combines its elements. Every path that reduces a row — the
//! plain reduction (any element type), its AVX2 loop, a fused chain's epilogue and the exp-and-sum loop
//! of a fused softmax — folds through [`RowAcc`], so all of them give the same bits:
//!
//! 1. element `i` of the row goes to lane `i % 16` while whole groups of [`LANES`] remain (lane `j`
//!    combines elements `j`, `16 + j`, `32 + j`, ... in that order);
//! 2. the elements past the last whole group go, in order, to a separate accumulator `rest`;
//! 3. the lanes combine as a pairwise tree (`lane[i] ⊕= lane[i + w]` for `w` = 8, 4, 2, 1);
//! 4. the result is `lane[0] ⊕ rest`.
//!
//! Every accumulator starts at the combiner's identity. The 16 independent lanes let the loop vectorize
//! (two AVX2 registers, or one AVX-512 register); the summation order differs from a sequential loop, as
//! it does on the TPU.

use crate::math;

/// Lanes of a row reduction.
pub(crate) const LANES: usize = 16;

/// Float combiners, as a const parameter (`K`) so hot loops do not branch on the kind.
pub(crate) const SUM: u8 = 0;
pub(crate) const MAX: u8 = 1;
pub(crate) const MIN: u8 = 2;

/// The identity of float combiner `K`.
#[inline(always)]
pub(crate) fn identity_f32<const K: u8>() -> f32 {
    match K {
        SUM => 0.0,
        MAX => f32::NEG_INFINITY,
        _ => f32::INFINITY,
    }
}

/// Float combiner `K`: `+`, or the NaN-propagating max / min that orders -0 below +0.
#[inline(always)]
pub(crate) fn comb_f32<const K: u8>(a: f32, b: f32) -> f32 {
    match K {
        SUM => math::add_f32(a, b),
        MAX => math::max_f32(a, b),
        _ => math::min_f32(a, b),
    }
}

/// The running state of one row's reduction (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowAcc<A> {
    pub lanes: [A; LANES],
    pub rest: A,
}

impl<A: Copy> RowAcc<A> {
    pub(crate) fn new(identity: A) -> RowAcc<A> {
        RowAcc {
            lanes: [identity; LANES],
            rest: identity,
        }
    }

    /// Fold the next piece of the row. Every piece but the row's last must be a whole number of
    /// [`LANES`] long (so lane `j` keeps taking elements `16q + j` across pieces).
    #[inline(always)]
    pub(crate) fn fold<T: Copy>(
        &mut self,
        piece: &[T],
        load: impl Fn(T) -> A,
        comb: impl Fn(A, A) -> A,
    ) {
        let groups = piece.chunks_exact(LANES);
        let tail = groups.remainder();
        for g in groups {
            for (l, &x) in self.lanes.iter_mut().zip(g) {
                *l = comb(*l, load(x));
            }
        }
        for &x in tail {
            self.rest = comb(self.rest, load(x));
        }
    }

    /// The row's result: the lanes' pairwise tree, then `lane[0] ⊕ rest`.
    #[inline(always)]
    pub(crate) fn finish(mut self, comb: impl Fn(A, A) -> A) -> A {
        let mut w = LANES;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                self.lanes[i] = comb(self.lanes[i], self.lanes[i + w]);
            }
        }
        comb(self.lanes[0], self.rest)
    }
}

impl RowAcc<f32> {
    /// [`RowAcc::fold`] with float combiner `K`, the whole groups in AVX2 when the CPU has it.
    #[inline(always)]
    pub(crate) fn fold_f32<const K: u8>(&mut self, piece: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if super::simd::avx2() {
            let full = piece.len() / LANES * LANES;
            // SAFETY: the CPU has AVX2 and FMA (checked at run time).
            unsafe { super::simd::fold16::<K>(&mut self.lanes, &piece[..full]) };
            for &x in &piece[full..] {
                self.rest = comb_f32::<K>(self.rest, x);
            }
            return;
        }
        self.fold(piece, |x| x, comb_f32::<K>);
    }

    /// [`RowAcc::finish`] with float combiner `K`, the lanes' tree in AVX2 when the CPU has it.
    #[inline(always)]
    pub(crate) fn finish_f32<const K: u8>(self) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if super::simd::avx2() {
            // SAFETY: the CPU has AVX2 and FMA (checked at run time).
            let tree = unsafe { super::simd::tree16::<K>(&self.lanes) };
            return comb_f32::<K>(tree, self.rest);
        }
        self.finish(comb_f32::<K>)
    }
}

/// A whole contiguous f32 row reduced in this order with float combiner `K`. A max / min over a row
/// without NaNs whose extremum is not a zero takes plain `vmaxps` / `vminps` (see
/// [`super::simd::max_min_no_nan`]: provably the same answer).
pub(crate) fn row_f32<const K: u8>(row: &[f32]) -> f32 {
    if K != SUM && row.len() < LANES {
        // A max / min over a row narrower than a group (rows a few lanes wide): every element goes to
        // `rest` and the lanes stay at the identity, whose tree is the identity, so the order is this
        // fold — without the vector paths' fixed cost, which dominates a row of a few elements.
        let id = identity_f32::<K>();
        return comb_f32::<K>(id, row.iter().fold(id, |a, &x| comb_f32::<K>(a, x)));
    }
    #[cfg(target_arch = "x86_64")]
    if K != SUM && super::simd::avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        if let Some(r) = unsafe { super::simd::max_min_no_nan::<K>(row, identity_f32::<K>()) } {
            return r;
        }
    }
    let mut acc = RowAcc::new(identity_f32::<K>());
    acc.fold_f32::<K>(row);
    acc.finish_f32::<K>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order written out by hand for one row of 37: lanes take 0..32, `rest` 32..37.
    #[test]
    fn the_order_is_lanes_then_tree_then_rest() {
        let row: Vec<f32> = (0..37).map(|i| 1.0 + (i as f32) * 1e-7).collect();
        let mut lanes = [0f32; 16];
        for (i, &x) in row[..32].iter().enumerate() {
            lanes[i % 16] += x;
        }
        let rest = row[32..].iter().fold(0.0f32, |a, &x| a + x);
        for w in [8, 4, 2, 1] {
            for i in 0..w {
                lanes[i] += lanes[i + w];
            }
        }
        let want = lanes[0] + rest;
        assert_eq!(row_f32::<SUM>(&row).to_bits(), want.to_bits());
        let mut acc = RowAcc::new(0.0f32);
        acc.fold(&row, |x| x, |a, b| a + b);
        assert_eq!(acc.finish(|a, b| a + b).to_bits(), want.to_bits());
    }

    /// Folding a row in pieces (whole groups but the last) gives the bits of folding it whole, on the
    /// vector and the portable path alike.
    #[test]
    fn pieces_vector_and_portable_paths_agree_bit_for_bit() {
        let mut row: Vec<f32> = (0..1037)
            .map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5)
            .collect();
        row[17] = -0.0;
        row[33] = 0.0;
        fn check<const K: u8>(row: &[f32]) {
            let whole = row_f32::<K>(row);
            let mut pieces = RowAcc::new(identity_f32::<K>());
            for p in row.chunks(64) {
                pieces.fold_f32::<K>(p);
            }
            let mut portable = RowAcc::new(identity_f32::<K>());
            portable.fold(row, |x| x, comb_f32::<K>);
            let (a, b) = (pieces.finish_f32::<K>(), portable.finish_f32::<K>());
            assert_eq!(
                whole.to_bits(),
                b.to_bits(),
                "kind {K}, row of {}",
                row.len()
            );
            assert_eq!(a.to_bits(), b.to_bits(), "kind {K}, row of {}", row.len());
        }
        let all = |row: &[f32]| {
            check::<SUM>(row);
            check::<MAX>(row);
            check::<MIN>(row);
        };
        all(&row);
        all(&row[..16]);
        all(&row[3..50]);
        let zeros: Vec<f32> = (0..64)
            .map(|i| if i % 3 == 0 { -0.0 } else { 0.0 })
            .collect();
        all(&zeros);
        // Zero ties at the extremum (the max/min shortcut must defer to the exact order), infinities.
        let mut neg: Vec<f32> = (0..77).map(|i| -1.0 - i as f32).collect();
        neg[40] = -0.0;
        neg[41] = 0.0;
        neg[70] = -0.0;
        all(&neg);
        let pos: Vec<f32> = neg.iter().map(|x| -x).collect();
        all(&pos);
        all(&[f32::NEG_INFINITY; 35]);
        all(&[f32::INFINITY; 35]);
        all(&[f32::from_bits(1), -f32::from_bits(1), 0.0, -0.0]);
        // Rows shorter than a group (no max/min shortcut): empty, one element, 8 lanes wide, zero
        // ties, a NaN.
        all(&[]);
        all(&row[..1]);
        all(&row[..8]);
        all(&neg[38..46]);
        all(&pos[38..46]);
        all(&[1.0, f32::from_bits(0xffc0_0001), -2.0, 3.0]);
        // Two NaN payloads in different lanes (the tree decides which one survives), and zero ties
        // across lanes (the tree's -0 / +0 ordering).
        let mut nans: Vec<f32> = (0..48).map(|i| i as f32 - 20.0).collect();
        nans[3] = f32::from_bits(0x7fc0_0003);
        nans[12] = f32::from_bits(0xffc0_0012);
        nans[27] = f32::from_bits(0x7f80_0027);
        all(&nans);
        let ties: Vec<f32> = (0..32)
            .map(|i| if i % 5 == 0 { 0.0 } else { -0.0 })
            .collect();
        all(&ties);
        row[500] = f32::from_bits(0x7fc0_1234);
        all(&row);
        assert!(row_f32::<MAX>(&row).is_nan() && row_f32::<MIN>(&row).is_nan());
    }

    /// The vector math's exp-and-sum (a fused softmax's pass) adds into a [`RowAcc`]'s lanes and
    /// `rest` exactly as folding its results would.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_and_sum_folds_in_the_row_order() {
        if !crate::interpret::simd::avx2() {
            eprintln!("skipped: this CPU has no AVX2+FMA, so no exp-and-sum is used here");
            return;
        }
        let row: Vec<f32> = (0..1003).map(|i| (i as f32) * 0.01 - 5.0).collect();
        let mut start = RowAcc::new(0.5f32);
        start.rest = 0.25;
        let (mut got, mut exps) = (start, vec![0f32; row.len()]);
        let sum = math::LaneSum {
            lanes: &mut got.lanes,
            rest: &mut got.rest,
        };
        // SAFETY: AVX2 and FMA checked above.
        unsafe { math::exp_run(&mut exps, math::ExpIn::SubScalar(&row, 1.5), Some(sum)) };
        let mut want = start;
        want.fold_f32::<SUM>(&exps);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.lanes), bits(&want.lanes));
        assert_eq!(got.rest.to_bits(), want.rest.to_bits());
    }
}
