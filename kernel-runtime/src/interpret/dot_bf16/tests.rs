//! The `vdpbf16ps` kernel against exact sums, and a dropped tail left out with the whole product's bits.
use super::*;

/// A product whose `b` rows past some point are all dropped (`KeepRows`: a masked `p v`) leaves
/// them out, with the bits of the whole product — against the same product over `b` with those
/// rows zeroed and nothing dropped: accumulators of −0 that a +0 product turns into +0, rows of
/// `a` all zero before the tail (the sum stays the accumulator's), tails of either sign,
/// subnormals, and an infinity or a NaN in the tail (then nothing is left out).
#[test]
fn a_dropped_tail_gives_the_whole_products_bits() {
    if !available() {
        eprintln!("no avx512bf16 on this CPU: kernel not tested here");
        return;
    }
    let mut state = 0x7a11u64;
    let mut next = |below: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % below
    };
    let special = [
        0x0000, 0x8000, 0x0001, 0x8001, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0,
    ];
    let mut tails_left_out = 0;
    for round in 0..300 {
        let (m, n, k) = match round % 3 {
            0 => (4, 128, 512),
            1 => (
                1 + next(9) as usize,
                1 + next(70) as usize,
                1 + next(90) as usize,
            ),
            _ => (5, 33, 64),
        };
        let end = next(k as u64 + 1) as usize;
        let mut av: Vec<bf16> = (0..m * k)
            .map(|_| bf16::from_f32(next(9) as f32 - 4.0))
            .collect();
        for i in 0..m {
            // Some rows zero before the tail, so the accumulator's −0 survives to it.
            if next(3) == 0 {
                av[i * k..i * k + end].fill(bf16::ZERO);
            }
            // The tail: one sign, the other, or specials (now and then non-finite).
            for x in &mut av[i * k + end..(i + 1) * k] {
                *x = match next(4) {
                    0 => bf16::from_bits(special[next(6) as usize]),
                    1 if next(40) == 0 => bf16::from_bits(special[6 + next(3) as usize]),
                    1 => bf16::from_f32(-(next(5) as f32)),
                    _ => bf16::from_f32(next(5) as f32),
                };
            }
        }
        let bv: Vec<bf16> = (0..k * n)
            .map(|_| bf16::from_f32(next(7) as f32 - 3.0))
            .collect();
        // Kept: rows before `end`, some dropped among them; none after.
        let mask: Vec<bool> = (0..k).map(|r| r < end && next(5) != 0).collect();
        let keep = KeepRows {
            data: &mask,
            off: 0,
            stride: 1,
        };
        let mut zeroed = bv.clone();
        for r in (0..k).filter(|&r| !mask[r]) {
            zeroed[r * n..(r + 1) * n].fill(bf16::ZERO);
        }
        let init: Vec<f32> = (0..m * n)
            .map(|_| match next(3) {
                0 => -0.0,
                1 => 0.0,
                _ => next(5) as f32 - 2.0,
            })
            .collect();
        let a = View {
            data: &av,
            off: 0,
            rs: k,
            cs: 1,
        };
        let b = |data| View {
            data,
            off: 0,
            rs: n,
            cs: 1,
        };
        if Tail::of(m, k, a, keep).is_some() {
            tails_left_out += 1;
        }
        for accumulate in [false, true] {
            let mut want = init.clone();
            gemm(m, n, k, a, (b(&zeroed), None), &mut want, accumulate);
            let mut got = init.clone();
            gemm(m, n, k, a, (b(&bv), Some(keep)), &mut got, accumulate);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "({m},{n},{k}) end {end} acc {accumulate}"
            );
        }
    }
    assert!(tails_left_out > 100, "{tails_left_out} tails left out");
}

/// Against products and sums in f64 (exact here: small integers and halves), for shapes with
/// edge tiles, an odd k, transposed views and accumulation.
#[test]
fn matches_exact_sums() {
    if !available() {
        eprintln!("no avx512bf16 on this CPU: kernel not tested here");
        return;
    }
    for (m, n, k) in [
        (12, 32, 8),
        (13, 33, 7),
        (1, 1, 1),
        (40, 70, 129),
        (128, 128, 128),
    ] {
        let av: Vec<bf16> = (0..m * k)
            .map(|i| bf16::from_f32(((i * 7) % 13) as f32 * 0.5 - 3.0))
            .collect();
        let bv: Vec<bf16> = (0..k * n)
            .map(|i| bf16::from_f32(((i * 5) % 11) as f32 - 5.0))
            .collect();
        for transpose_b in [false, true] {
            let a = View {
                data: &av,
                off: 0,
                rs: k,
                cs: 1,
            };
            // B as k×n, either row-major or as the transpose of a row-major n×k.
            let bt: Vec<bf16>;
            let b = if transpose_b {
                bt = (0..n * k).map(|i| bv[(i % k) * n + i / k]).collect();
                View {
                    data: &bt,
                    off: 0,
                    rs: 1,
                    cs: k,
                }
            } else {
                View {
                    data: &bv,
                    off: 0,
                    rs: n,
                    cs: 1,
                }
            };
            let mut c: Vec<f32> = (0..m * n).map(|i| (i % 3) as f32).collect();
            let init = c.clone();
            gemm(m, n, k, a, (b, None), &mut c, true);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = init[i * n + j] as f64
                        + (0..k)
                            .map(|p| av[i * k + p].to_f64() * bv[p * n + j].to_f64())
                            .sum::<f64>();
                    assert_eq!(
                        c[i * n + j] as f64,
                        want,
                        "({m},{n},{k}) at ({i},{j}), transposed b: {transpose_b}"
                    );
                }
            }
        }
    }
}
