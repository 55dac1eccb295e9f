//! The kernels of `dot_bf16_order` (and `vdpbf16ps`) against the definition, bit for bit.
use super::*;

type Gemm = fn(usize, usize, usize, View<'_, bf16>, View<'_, bf16>, &mut [f32], bool);

/// The FMA kernels this CPU runs: the 6×16 AVX2 tile (every x86-64 CPU the project supports), and
/// the 8×32 AVX-512F tile where the CPU has AVX-512F (said on stderr where it has not).
fn fma_kernels() -> Vec<(&'static str, Gemm)> {
    use fma::Tile;
    assert!(fma::Avx2::available(), "the AVX2 kernel needs avx2 + fma");
    let mut out: Vec<(&'static str, Gemm)> = vec![("fma 6x16", fma::gemm::<fma::Avx2>)];
    if fma::Avx512::available() {
        out.push(("fma 8x32", fma::gemm::<fma::Avx512>));
    } else {
        eprintln!(
            "no avx512f on this CPU (or TPU_KERNEL_CPU caps it): the 8x32 tile not tested here"
        );
    }
    out
}

/// A bf16 from random bits, biased toward the interesting: subnormals, tiny and huge exponents,
/// zeros of both signs, infinities (no NaN: a NaN's payload is the CPU's choice).
fn element(state: &mut u64) -> bf16 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let r = (*state >> 33) as u32;
    let sign = (r & 1) << 15;
    let mant = (r >> 1) & 0x7f;
    let exp = match (r >> 8) % 16 {
        0 => 0,                 // zero or subnormal
        1 => 1 + (r >> 12) % 4, // near the bottom of the normals
        // Huge, now and then infinite.
        2 => {
            if (r >> 12).is_multiple_of(64) {
                0xff
            } else {
                250
            }
        }
        _ => 120 + (r >> 12) % 16, // ordinary magnitudes, so sums cancel
    };
    let bits = sign | exp.min(0xff) << 7 | if exp == 0xff { 0 } else { mant };
    bf16::from_bits(bits as u16)
}

/// The FMA kernels against the definition on ordinary magnitudes (no subnormal input, sum or
/// result), edge tiles, bands and transposed views included: what `scripts/memcheck.sh` runs,
/// since valgrind ignores MXCSR's DAZ and FTZ (the subnormal cases are
/// [`every_path_gives_vdpbf16ps_bits`]'s, run natively).
#[test]
fn fma_kernels_on_ordinary_values() {
    let mut state = 7u64;
    let mut ordinary = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let r = (state >> 33) as u32;
        bf16::from_bits(((r & 1) << 15 | (120 + (r >> 1) % 16) << 7 | (r >> 8) & 0x7f) as u16)
    };
    for (m, n, k, accumulate) in [(13, 33, 517, true), (6, 16, 8, false), (1, 20, 3, false)] {
        let av: Vec<bf16> = (0..m * k).map(|_| ordinary()).collect();
        let bv: Vec<bf16> = (0..k * n).map(|_| ordinary()).collect();
        let init: Vec<f32> = (0..m * n).map(|_| widen(ordinary())).collect();
        for (a, b) in [
            (view(&av, k, 1), view(&bv, n, 1)),
            (view(&av, 1, m), view(&bv, 1, k)),
        ] {
            let mut want = init.clone();
            gemm_scalar(m, n, k, a, b, &mut want, accumulate);
            for (name, kernel) in fma_kernels() {
                let mut got = init.clone();
                kernel(m, n, k, a, b, &mut got, accumulate);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{name} ({m},{n},{k})");
            }
        }
    }
}

/// Fuzz: random shapes (edge tiles, odd k, several k bands), operands at random offsets inside
/// larger buffers with padded row strides, either layout, with and without an accumulator — every
/// kernel gives the definition's bits.
#[test]
fn random_shapes_and_views_give_the_definitions_bits() {
    let mut state = 0xf022u64;
    let mut next = |below: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as usize) % below
    };
    for round in 0..120 {
        let (m, n, k) = (
            1 + next(30),
            1 + next(40),
            1 + next(if round % 4 == 0 { 700 } else { 70 }),
        );
        let mut bits = 0x5eedu64 + round;
        let mut operand = |rows: usize, cols: usize, transposed: bool, pad: usize, off: usize| {
            // Logical rows × cols; stored row-major with `pad` extra columns, or transposed.
            let (outer, inner) = if transposed {
                (cols, rows)
            } else {
                (rows, cols)
            };
            let stride = inner + pad;
            let data: Vec<bf16> = (0..off + outer * stride)
                .map(|_| element(&mut bits))
                .collect();
            let (rs, cs) = if transposed { (1, stride) } else { (stride, 1) };
            (data, off, rs, cs)
        };
        let (ta, tb) = (next(2) == 1, next(2) == 1);
        let (ad, aoff, ars, acs) = operand(m, k, ta, next(3), next(5));
        let (bd, boff, brs, bcs) = operand(k, n, tb, next(3), next(5));
        let a = View {
            data: &ad,
            off: aoff,
            rs: ars,
            cs: acs,
        };
        let b = View {
            data: &bd,
            off: boff,
            rs: brs,
            cs: bcs,
        };
        let accumulate = next(2) == 1;
        let init: Vec<f32> = (0..m * n).map(|_| widen(element(&mut bits))).collect();
        let mut want = init.clone();
        gemm_scalar(m, n, k, a, b, &mut want, accumulate);
        let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        for (name, kernel) in fma_kernels() {
            let mut got = init.clone();
            kernel(m, n, k, a, b, &mut got, accumulate);
            assert!(
                same(&got, &want),
                "{name} ({m},{n},{k}) ta {ta} tb {tb} acc {accumulate}"
            );
        }
        if super::super::dot_bf16::available() {
            let mut hw = init.clone();
            super::super::dot_bf16::gemm(m, n, k, a, (b, None), &mut hw, accumulate);
            assert!(
                same(&hw, &want),
                "vdpbf16ps ({m},{n},{k}) ta {ta} tb {tb} acc {accumulate}"
            );
            // Rows of b dropped (`KeepRows`, a mask strided in its own buffer): the bits of b with
            // those rows zeroed, whatever they hold (NaNs and infinities included).
            let stride = 1 + next(3);
            let mask: Vec<bool> = (0..k * stride).map(|_| next(3) != 0).collect();
            let keep = KeepRows {
                data: &mask,
                off: 0,
                stride,
            };
            let mut zeroed = bd.clone();
            for r in (0..k).filter(|&r| !keep.keeps(r)) {
                for j in 0..n {
                    zeroed[boff + r * brs + j * bcs] = bf16::ZERO;
                }
            }
            let mut want = init.clone();
            gemm_scalar(
                m,
                n,
                k,
                a,
                View { data: &zeroed, ..b },
                &mut want,
                accumulate,
            );
            let mut hw = init.clone();
            super::super::dot_bf16::gemm(m, n, k, a, (b, Some(keep)), &mut hw, accumulate);
            assert!(
                same(&hw, &want),
                "vdpbf16ps, rows kept ({m},{n},{k}) ta {ta} tb {tb} acc {accumulate}"
            );
        }
    }
}

fn view(data: &[bf16], rs: usize, cs: usize) -> View<'_, bf16> {
    View {
        data,
        off: 0,
        rs,
        cs,
    }
}

#[test]
fn every_path_gives_vdpbf16ps_bits() {
    let mut state = 0x5eed;
    for (m, n, k) in [
        (1, 1, 1),
        (7, 17, 3),
        (6, 16, 8),
        (13, 33, 130),
        (8, 32, 64),
        (17, 65, 300),
        (3, 5, 1),
        // 4-row tiles (a decode step's query heads), whole and partial; transposed panels moved
        // 16 pairs at a time, with pairs and an odd element left over.
        (4, 64, 128),
        (2, 40, 66),
        (5, 32, 33),
        // 1–3 rows against whole 16 × 16 blocks of a transposed B.
        (1, 16, 32),
        (2, 32, 64),
        (3, 48, 96),
    ] {
        let av: Vec<bf16> = (0..m * k).map(|_| element(&mut state)).collect();
        let bv: Vec<bf16> = (0..k * n).map(|_| element(&mut state)).collect();
        let init: Vec<f32> = (0..m * n)
            .map(|_| {
                let e = element(&mut state);
                // Accumulators with a subnormal now and then (DAZ on the accumulator).
                f32::from_bits((e.to_bits() as u32) << 16 | (e.to_bits() as u32 & 3))
            })
            .collect();
        // The same matrices stored transposed (read through column-major views, as `dot_nt`).
        let at: Vec<bf16> = (0..m * k).map(|t| av[(t % m) * k + t / m]).collect();
        let bt: Vec<bf16> = (0..k * n).map(|t| bv[(t % k) * n + t / k]).collect();
        let layouts = [
            (view(&av, k, 1), view(&bv, n, 1)),
            (view(&at, 1, m), view(&bt, 1, k)),
            // `q kᵀ`: A row-major, B column-major.
            (view(&av, k, 1), view(&bt, 1, k)),
        ];
        for ((a, b), accumulate) in layouts.into_iter().flat_map(|l| [(l, false), (l, true)]) {
            let mut want = init.clone();
            gemm_scalar(m, n, k, a, b, &mut want, accumulate);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (name, kernel) in fma_kernels() {
                let mut got = init.clone();
                kernel(m, n, k, a, b, &mut got, accumulate);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{name} ({m},{n},{k}) acc {accumulate}"
                );
            }
            if super::super::dot_bf16::available() {
                let mut hw = init.clone();
                super::super::dot_bf16::gemm(m, n, k, a, (b, None), &mut hw, accumulate);
                let d = bits(&hw).iter().zip(bits(&want)).position(|(x, y)| *x != y);
                assert!(
                    d.is_none(),
                    "vdpbf16ps ({m},{n},{k}) acc {accumulate} at {d:?}: {:?} vs {:?}",
                    d.map(|d| hw[d]),
                    d.map(|d| want[d])
                );
            } else {
                eprintln!("no avx512bf16 on this CPU: vdpbf16ps not compared here");
            }
        }
    }
}
