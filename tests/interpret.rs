//! Interpret mode: every example kernel on CPU against an independent plain-Rust reference, Pallas grid
//! semantics (revisited outputs, scratch, edge blocks, parallel chunks), exact dtype behaviour, poisoning
//! of uninitialized memory, and out-of-bounds slices reported at the Rust line.

#[path = "../examples/add.rs"]
#[allow(dead_code)]
mod add;
#[path = "../examples/causal_mask.rs"]
#[allow(dead_code)]
mod causal_mask;
#[path = "../examples/colsum.rs"]
#[allow(dead_code)]
mod colsum;
#[path = "../examples/dma_double.rs"]
#[allow(dead_code)]
mod dma_double;
#[path = "../examples/flash_attention.rs"]
#[allow(dead_code)]
mod flash_attention;
#[path = "../examples/fori_rowsum.rs"]
#[allow(dead_code)]
mod fori_rowsum;
#[path = "../examples/gather_prefetch.rs"]
#[allow(dead_code)]
mod gather_prefetch;
#[path = "../examples/grouped_matmul.rs"]
#[allow(dead_code)]
mod grouped_matmul;
#[path = "../examples/inplace_scale.rs"]
#[allow(dead_code)]
mod inplace_scale;
#[path = "../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../examples/ops_tour.rs"]
#[allow(dead_code)]
mod ops_tour;
#[path = "../examples/paged_attention.rs"]
#[allow(dead_code)]
mod paged_attention;
#[path = "../examples/paged_gather.rs"]
#[allow(dead_code)]
mod paged_gather;
#[path = "../examples/quantized_matmul.rs"]
#[allow(dead_code)]
mod quantized_matmul;
#[path = "../examples/quantized_matmul_w8a8.rs"]
#[allow(dead_code)]
mod quantized_matmul_w8a8;
#[path = "../examples/rmsnorm.rs"]
#[allow(dead_code)]
mod rmsnorm;
#[path = "../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "../examples/transpose.rs"]
#[allow(dead_code)]
mod transpose;
#[path = "../examples/values.rs"]
#[allow(dead_code)]
mod values;

#[path = "common/kernels.rs"]
mod kernels;

use kernels::*;
use tpu_kernel::prelude::*;
use tpu_kernel::reference::{self, Tolerance};
use tpu_kernel::runtime::interpret::{HostArray, InterpretOptions};
use tpu_kernel::ErrorKind;

type Build = fn() -> Result<PallasCall, KernelError>;

const EXAMPLES: [(&str, Build); 19] = [
    ("add", add::build),
    ("inplace_scale", inplace_scale::build),
    ("dma_double", dma_double::build),
    ("gather_prefetch", gather_prefetch::build),
    ("causal_mask", causal_mask::build),
    ("colsum", colsum::build),
    ("fori_rowsum", fori_rowsum::build),
    ("matmul", matmul::build),
    ("grouped_matmul", grouped_matmul::build),
    ("ops_tour", ops_tour::build),
    ("paged_gather", paged_gather::build),
    ("paged_attention", paged_attention::build),
    ("quantized_matmul", quantized_matmul::build),
    ("quantized_matmul_w8a8", quantized_matmul_w8a8::build),
    ("rmsnorm", rmsnorm::build),
    ("softmax", softmax::build),
    ("transpose", transpose::build),
    ("flash_attention", flash_attention::build),
    ("values", values::build),
];

/// Run `call` on random inputs with `opts` and check every output against the reference.
fn check_against_reference(call: &PallasCall, seed: u64, opts: &InterpretOptions) {
    let inputs = reference::random_inputs(call, seed);
    let got = call
        .interpret_with(&inputs, opts)
        .unwrap_or_else(|e| panic!("{}: {e}", call.name()));
    let (want, tol) = reference::expected(call.name(), &inputs)
        .unwrap_or_else(|| panic!("no reference for {}", call.name()))
        .unwrap_or_else(|e| panic!("reference for {}: {e}", call.name()));
    assert_eq!(got.len(), want.len(), "{}: output count", call.name());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let c = reference::compare(g, w, tol);
        assert!(
            c.ok,
            "{} output {i}: max error {} exceeds {tol:?}",
            call.name(),
            c.max_abs_error
        );
    }
}

#[test]
fn every_example_matches_its_reference() {
    for (name, build) in EXAMPLES {
        let call = build().unwrap_or_else(|e| panic!("{name}: {e}"));
        check_against_reference(&call, 7, &InterpretOptions::default());
    }
}

#[test]
fn examples_never_read_uninitialized_memory() {
    // With poisoning on, any read of memory the kernel never wrote would surface as NaN / a bit pattern.
    for (name, build) in EXAMPLES {
        let call = build().unwrap_or_else(|e| panic!("{name}: {e}"));
        check_against_reference(&call, 11, &InterpretOptions::poisoned());
    }
}

#[test]
fn fused_and_unfused_runs_agree_bit_for_bit() {
    for (name, build) in EXAMPLES {
        let call = build().unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = reference::random_inputs(&call, 4);
        for poison in [false, true] {
            let opts = |fuse| InterpretOptions {
                fuse,
                poison_uninitialized: poison,
                ..Default::default()
            };
            let fused = call
                .interpret_with(&inputs, &opts(true))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let plain = call
                .interpret_with(&inputs, &opts(false))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(fused, plain, "{name}");
        }
    }
}

/// A softmax over rows a few lanes wide takes the fused chain's narrow pass (`fused/narrow.rs`: many
/// rows' `exp(x - m)` and sums at once): the same bits as the unfused run, odd widths and special
/// values (NaN, ±inf, ±0, subnormals, huge) included.
#[test]
fn narrow_rows_fused_and_unfused_agree_bit_for_bit() {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-40,
        -3e38,
        88.7,
        -104.0,
    ];
    for (rows, width, block) in [
        (8192, 8, 256),
        (64, 3, 8),
        (96, 15, 32),
        (40, 1, 8),
        (24, 8, 8),
    ] {
        let call = softmax::softmax(ArrayType::new([rows, width], F32), block).expect("builds");
        let mut x: Vec<f32> = reference::random_inputs(&call, 9)[0]
            .as_slice::<f32>()
            .expect("f32")
            .iter()
            .map(|v| v * 30.0)
            .collect();
        let n = x.len();
        for (i, s) in specials.iter().enumerate() {
            x[(i * 37) % n] = *s;
        }
        let inputs = vec![HostArray::from_vec([rows, width], x).expect("shape")];
        let run = |fuse, parallel| {
            call.interpret_with(
                &inputs,
                &InterpretOptions {
                    fuse,
                    parallel,
                    ..Default::default()
                },
            )
            .expect("runs")
        };
        let plain = run(false, false);
        assert_eq!(
            run(true, true),
            plain,
            "[{rows}, {width}] in {block}-row blocks"
        );
        assert_eq!(
            run(true, false),
            plain,
            "[{rows}, {width}] in {block}-row blocks"
        );
    }
}

#[test]
fn parallel_and_sequential_runs_agree_bit_for_bit() {
    for (name, build) in EXAMPLES {
        let call = build().unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs = reference::random_inputs(&call, 3);
        let par = call
            .interpret(&inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let seq = call
            .interpret_with(
                &inputs,
                &InterpretOptions {
                    parallel: false,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(par, seq, "{name}");
    }
}

// ---------------------------------------------------------------------------------------------- poisoning

fn matmul_no_init() -> PallasCall {
    let (m, n, k, b) = (256, 256, 256, 128);
    pallas_call(matmul_no_init_kernel)
        .name("matmul_kernel")
        .grid([m / b, n / b, k / b])
        .input(
            ArrayType::new([m, k], BF16),
            BlockSpec::new([b, b], |[i, _, k]| [i, k]),
        )
        .input(
            ArrayType::new([k, n], BF16),
            BlockSpec::new([b, b], |[_, j, k]| [k, j]),
        )
        .output(
            ArrayType::new([m, n], BF16),
            BlockSpec::new([b, b], |[i, j, _]| [i, j]),
        )
        .scratch(Vmem::new([b, b], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .build()
        .expect("build")
}

#[test]
fn poisoning_catches_a_matmul_that_never_zeroes_its_accumulator() {
    let call = matmul_no_init();
    let inputs = reference::random_inputs(&call, 5);
    // Without poisoning the bug hides: fresh scratch happens to be zero.
    let plain = call.interpret(&inputs).expect("run");
    let (want, tol) = reference::expected("matmul_kernel", &inputs)
        .expect("reference")
        .expect("reference");
    assert!(reference::compare(&plain[0], &want[0], tol).ok);
    // With poisoning every output element is NaN.
    let poisoned = call
        .interpret_with(&inputs, &InterpretOptions::poisoned())
        .expect("run");
    let out = poisoned[0].as_slice::<bf16>().expect("bf16 output");
    assert!(
        out.iter().all(|v| v.is_nan()),
        "uninitialized accumulator must poison the result"
    );
}

#[test]
fn poisoning_marks_unwritten_output_rows_and_plain_mode_leaves_zeros() {
    let call = pallas_call(half_store_kernel)
        .grid([1])
        .input(
            ArrayType::new([16, 128], I32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([16, 128], I32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .build()
        .expect("build");
    let x = HostArray::random([16, 128], I32, 1).unwrap();
    let plain = call.interpret(std::slice::from_ref(&x)).expect("run");
    let poisoned = call
        .interpret_with(std::slice::from_ref(&x), &InterpretOptions::poisoned())
        .expect("run");
    let (xs, p, q) = (
        x.as_slice::<i32>().unwrap(),
        plain[0].as_slice::<i32>().unwrap(),
        poisoned[0].as_slice::<i32>().unwrap(),
    );
    assert_eq!(&p[..8 * 128], &xs[..8 * 128]);
    assert_eq!(&q[..8 * 128], &xs[..8 * 128]);
    assert!(p[8 * 128..].iter().all(|&v| v == 0));
    assert!(q[8 * 128..].iter().all(|&v| v == 0xDEAD_BEEFu32 as i32));
}

// ---------------------------------------------------------------------------------------------- errors

#[tpu_kernel]
fn oob_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let start = program_id(0) * 16;
    o.store(x.at((ds(start, 8), ..)).load()); // OOB-LOAD
}

#[test]
fn an_out_of_bounds_dynamic_slice_names_the_source_line() {
    let call = pallas_call(oob_kernel)
        .grid([2])
        .input(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([16, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([16, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .dimension_semantics([Arbitrary])
        .build()
        .expect("build");
    let x = HostArray::random([16, 128], F32, 2).unwrap();
    let err = call
        .interpret(&[x])
        .expect_err("grid step 1 reads rows 16..24 of a 16-row block");
    assert_eq!(err.kind, ErrorKind::OutOfBounds, "{err}");
    let line = include_str!("interpret.rs")
        .lines()
        .position(|l| l.ends_with("// OOB-LOAD"))
        .expect("marker")
        + 1;
    let loc = err.location.expect("located");
    assert!(loc.file.ends_with("interpret.rs"), "{err}");
    assert_eq!(loc.line as usize, line, "{err}");
    assert!(err.to_string().contains("16..24"), "{err}");
    assert!(err.to_string().contains("grid point [1]"), "{err}");
}

#[test]
fn wrong_inputs_are_errors_not_panics() {
    let call = add::build().expect("build");
    let x = HostArray::zeros([1024, 1024], F32).unwrap();
    assert_eq!(
        call.interpret(std::slice::from_ref(&x))
            .expect_err("one input missing")
            .kind,
        ErrorKind::Signature
    );
    let y = HostArray::zeros([1024, 512], F32).unwrap();
    assert_eq!(
        call.interpret(&[x.clone(), y])
            .expect_err("wrong shape")
            .kind,
        ErrorKind::Shape
    );
    let z = HostArray::zeros([1024, 1024], I32).unwrap();
    assert_eq!(
        call.interpret(&[x, z]).expect_err("wrong dtype").kind,
        ErrorKind::Shape
    );
    assert!(HostArray::from_vec([2, 2], vec![0f32; 3]).is_err());
}

// ---------------------------------------------------------------------------------------------- dtypes

#[test]
fn bf16_rounds_on_every_cast_and_op() {
    let call = pallas_call(bf16_chain_kernel)
        .grid([1])
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .build()
        .expect("build");
    let x = HostArray::random([8, 128], F32, 4).unwrap();
    let got = call.interpret(std::slice::from_ref(&x)).expect("run");
    let want: Vec<f32> = x
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|&v| (bf16::from_f32(bf16::from_f32(v).to_f32() * 3.0)).to_f32())
        .collect();
    assert_eq!(got[0].as_slice::<f32>().unwrap(), &want[..]);
    // Ties round to even and NaN stays NaN.
    let ties = HostArray::from_vec(
        [8, 128],
        (0..1024)
            .map(|i| {
                if i == 0 {
                    f32::NAN
                } else {
                    f32::from_bits(0x3F80_8000 + ((i as u32 % 2) << 16))
                }
            })
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let got = call.interpret(std::slice::from_ref(&ties)).expect("run");
    let g = got[0].as_slice::<f32>().unwrap();
    assert!(g[0].is_nan());
    for (i, v) in ties.as_slice::<f32>().unwrap().iter().enumerate().skip(1) {
        assert_eq!(
            g[i],
            bf16::from_f32(bf16::from_f32(*v).to_f32() * 3.0).to_f32(),
            "element {i}"
        );
    }
}

#[test]
fn integers_wrap_and_divide_like_xla() {
    let spec = || BlockSpec::new([8, 128], |[_]| (0, 0));
    let arr = || ArrayType::new([8, 128], I32);
    let call = pallas_call(int_kernel)
        .grid([1])
        .input(arr(), spec())
        .input(arr(), spec())
        .output(arr(), spec())
        .output(arr(), spec())
        .output(arr(), spec())
        .build()
        .expect("build");
    let xs: Vec<i32> = (0..1024)
        .map(|i| [i32::MAX, i32::MIN, -7, 7, 40000][i % 5])
        .collect();
    let ys: Vec<i32> = (0..1024).map(|i| [0, -1, 2, 0, 3, -2, 1][i % 7]).collect();
    let out = call
        .interpret(&[
            HostArray::from_vec([8, 128], xs.clone()).unwrap(),
            HostArray::from_vec([8, 128], ys.clone()).unwrap(),
        ])
        .expect("run");
    let [s, q, r] = [0, 1, 2].map(|i| out[i].as_slice::<i32>().unwrap().to_vec());
    for i in 0..1024 {
        let (a, b) = (xs[i], ys[i]);
        assert_eq!(s[i], a.wrapping_mul(65536).wrapping_add(b));
        let (wq, wr) = if b == 0 {
            (-1, a)
        } else {
            (a.wrapping_div(b), a.wrapping_rem(b))
        };
        assert_eq!((q[i], r[i]), (wq, wr), "{a} / {b}");
    }
}

#[test]
fn nan_and_inf_follow_xla() {
    let spec = || BlockSpec::new([8, 128], |[_]| (0, 0));
    let call = pallas_call(nan_kernel)
        .grid([1])
        .input(ArrayType::new([8, 128], F32), spec())
        .output(ArrayType::new([8, 128], F32), spec())
        .output(ArrayType::new([8, 128], F32), spec())
        .output(ArrayType::new([8, 128], I32), spec())
        .output(ArrayType::new([8, 128], F32), spec())
        .build()
        .expect("build");
    let mut xs: Vec<f32> = (0..1024).map(|i| (i % 128) as f32 / 64.0 - 1.0).collect();
    xs[3] = f32::NAN; // row 0 has a NaN
    xs[128 + 5] = f32::INFINITY; // row 1 has +inf
    xs[256 + 7] = f32::NEG_INFINITY;
    xs[384 + 9] = 100.0; // exp overflows
    let out = call
        .interpret(&[HostArray::from_vec([8, 128], xs.clone()).unwrap()])
        .expect("run");
    let mx = out[0].as_slice::<f32>().unwrap();
    assert!(mx[0].is_nan(), "max propagates NaN");
    assert_eq!(mx[128], f32::INFINITY);
    assert_eq!(mx[256], 127.0 / 64.0 - 1.0);
    let mn = out[1].as_slice::<f32>().unwrap();
    assert!(mn[3].is_nan(), "minimum propagates NaN");
    assert_eq!(mn[256 + 7], f32::NEG_INFINITY);
    assert_eq!(mn[127], 0.5);
    let ne = out[2].as_slice::<i32>().unwrap();
    assert_eq!(ne[3], 1, "NaN != NaN");
    assert_eq!(ne.iter().sum::<i32>(), 1);
    let e = out[3].as_slice::<f32>().unwrap();
    assert!(e[3].is_nan());
    assert_eq!(e[128 + 5], f32::INFINITY);
    assert_eq!(e[256 + 7], 0.0);
    assert_eq!(e[384 + 9], f32::INFINITY);
    for (i, &v) in xs
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite() && v.abs() < 2.0)
    {
        let want = (v as f64).exp() as f32;
        assert!(
            (e[i] - want).abs() <= 2.0 * f32::EPSILON * want,
            "exp({v}) = {} vs {want}",
            e[i]
        );
    }
}

// ---------------------------------------------------------------------------------------------- grid semantics

#[test]
fn edge_blocks_are_clipped_on_write_back() {
    // 300 x 200 in 128 x 128 blocks: the last row and column blocks run past the array.
    let spec = || BlockSpec::new([128, 128], |[i, j]| [i, j]);
    let call = pallas_call(add_edge_kernel)
        .grid([3, 2])
        .input(ArrayType::new([300, 200], F32), spec())
        .input(ArrayType::new([300, 200], F32), spec())
        .output(ArrayType::new([300, 200], F32), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
        .expect("build");
    for opts in [InterpretOptions::default(), InterpretOptions::poisoned()] {
        check_against_reference_named(&call, "add_kernel", &opts);
    }
}

fn check_against_reference_named(call: &PallasCall, name: &str, opts: &InterpretOptions) {
    let inputs = reference::random_inputs(call, 9);
    let got = call.interpret_with(&inputs, opts).expect("run");
    let (want, tol) = reference::expected(name, &inputs)
        .expect("reference")
        .expect("reference");
    for (g, w) in got.iter().zip(&want) {
        let c = reference::compare(g, w, tol);
        assert!(c.ok, "{name}: max error {}", c.max_abs_error);
    }
}

#[test]
fn elementwise_kernels_run_over_row_bands_with_the_same_bits() {
    // Purely elementwise with identity maps: the interpreter runs it over contiguous row bands instead
    // of (32, 128) blocks (see interpret/coalesce.rs). Every mode must give the same bits.
    let spec = || BlockSpec::new([32, 128], |[i, j]| [i, j]);
    let call = pallas_call(mixed_elementwise_kernel)
        .grid([8, 3])
        .input(ArrayType::new([256, 384], F32), spec())
        .input(ArrayType::new([256, 384], I32), spec())
        .output(ArrayType::new([256, 384], BF16), spec())
        .output(ArrayType::new([256, 384], I32), spec())
        .dimension_semantics([Parallel, Arbitrary])
        .build()
        .expect("build");
    let x = HostArray::random([256, 384], F32, 5).unwrap();
    let y = HostArray::from_vec(
        [256, 384],
        (0..256 * 384).map(|i| (i % 5) - 2).collect::<Vec<i32>>(),
    )
    .unwrap();
    let inputs = [x, y];
    let runs: Vec<Vec<HostArray>> = [(true, true), (true, false), (false, true), (false, false)]
        .into_iter()
        .map(|(fuse, parallel)| {
            let opts = InterpretOptions {
                fuse,
                parallel,
                ..InterpretOptions::poisoned()
            };
            call.interpret_with(&inputs, &opts).expect("run")
        })
        .collect();
    for r in &runs[1..] {
        assert_eq!(r, &runs[0]);
    }
    let xs = inputs[0].as_slice::<f32>().unwrap();
    let ys = inputs[1].as_slice::<i32>().unwrap();
    let m = runs[0][1].as_slice::<i32>().unwrap();
    let o = runs[0][0].as_slice::<half::bf16>().unwrap();
    for i in 0..xs.len() {
        assert_eq!(m[i], ys[i] * 7 + 1, "element {i}");
        let want = if ys[i] as f32 > xs[i] {
            xs[i] * 3.0
        } else {
            (xs[i] - 1.0).exp()
        };
        let got = o[i].to_f32();
        assert!(
            (got - want).abs() <= want.abs() / 128.0,
            "element {i}: {got} vs {want}"
        );
    }
}

#[test]
fn kernels_reading_grid_indices_keep_their_blocks() {
    // Identity maps, elementwise arithmetic, but the body reads program_id: the blocks matter.
    let spec = || BlockSpec::new([64, 128], |[i, j]| [i, j]);
    let call = pallas_call(column_block_id_kernel)
        .grid([4, 4])
        .input(ArrayType::new([256, 512], F32), spec())
        .output(ArrayType::new([256, 512], F32), spec())
        .dimension_semantics([Parallel, Parallel])
        .build()
        .expect("build");
    let x = HostArray::zeros([256, 512], F32).unwrap();
    let out = call.interpret(&[x]).expect("run");
    let o = out[0].as_slice::<f32>().unwrap();
    for (i, v) in o.iter().enumerate() {
        assert_eq!(*v, ((i % 512) / 128) as f32, "element {i}");
    }
}

#[tpu_kernel]
fn row_scale_kernel(x: Ref<f32>, w: Ref<f32>, o: RefMut<f32>) {
    // Keeps rows apart: a row max, a row-invariant weight row broadcast, elementwise math.
    let x = x.load();
    let m = x.max_keepdims(-1);
    o.store((x - m).exp() * w.load() + 0.5);
}

#[test]
fn row_kernels_merge_blocks_only_when_rows_stay_apart() {
    let row_spec = || BlockSpec::new([8, 256], |[i]| (i, 0));
    let mixing = pallas_call(block_column_sum_kernel)
        .grid([16])
        .input(ArrayType::new([128, 256], F32), row_spec())
        .output(ArrayType::new([128, 256], F32), row_spec())
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    let x = HostArray::random([128, 256], F32, 21).unwrap();
    let xs = x.as_slice::<f32>().unwrap().to_vec();
    let out = mixing.interpret(std::slice::from_ref(&x)).expect("run");
    let o = out[0].as_slice::<f32>().unwrap();
    for r in 0..128 {
        for c in 0..256 {
            let b = r / 8 * 8;
            // Sum in the interpreter's order is not ours; compare within a few ulp of the column sum.
            let sum: f32 = (b..b + 8).map(|i| xs[i * 256 + c]).sum();
            let want = sum + (r % 8) as f32 * 1000.0;
            let got = o[r * 256 + c];
            assert!((got - want).abs() <= 1e-3, "[{r}, {c}]: {got} vs {want}");
        }
    }

    let keeping = pallas_call(row_scale_kernel)
        .grid([16])
        .input(ArrayType::new([128, 256], F32), row_spec())
        .input(
            ArrayType::new([1, 256], F32),
            BlockSpec::new([1, 256], |[_]| (0, 0)),
        )
        .output(ArrayType::new([128, 256], F32), row_spec())
        .dimension_semantics([Arbitrary])
        .build()
        .expect("build");
    let w = HostArray::random([1, 256], F32, 22).unwrap();
    let inputs = [x, w];
    let runs: Vec<Vec<HostArray>> = [(true, true), (true, false), (false, false)]
        .into_iter()
        .map(|(fuse, parallel)| {
            let opts = InterpretOptions {
                fuse,
                parallel,
                ..InterpretOptions::poisoned()
            };
            keeping.interpret_with(&inputs, &opts).expect("run")
        })
        .collect();
    for r in &runs[1..] {
        assert_eq!(r, &runs[0]);
    }
    let ws = inputs[1].as_slice::<f32>().unwrap();
    let o = runs[0][0].as_slice::<f32>().unwrap();
    for r in 0..128 {
        let row = &xs[r * 256..(r + 1) * 256];
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for c in 0..256 {
            let want = (row[c] - m).exp() * ws[c] + 0.5;
            let got = o[r * 256 + c];
            assert!((got - want).abs() <= 1e-5, "[{r}, {c}]: {got} vs {want}");
        }
    }
}

#[test]
fn scratch_persists_and_revisited_outputs_accumulate_in_order() {
    let call = pallas_call(step_count_kernel)
        .grid([3, 4])
        .output(
            ArrayType::new([24, 128], I32),
            BlockSpec::new([8, 128], |[i, _]| (i, 0)),
        )
        .scratch(Vmem::new([8, 128], I32))
        .dimension_semantics([Arbitrary, Arbitrary])
        .build()
        .expect("build");
    let out = call.interpret(&[]).expect("run");
    let o = out[0].as_slice::<i32>().unwrap();
    // Step t (0-based, row-major) sees seen = t + 1; block i sums steps 4i..4i+3.
    for i in 0..3 {
        let want: i32 = (4 * i + 1..=4 * i + 4).sum();
        assert!(
            o[i as usize * 8 * 128..(i as usize + 1) * 8 * 128]
                .iter()
                .all(|&v| v == want),
            "block {i}"
        );
    }
}

#[test]
fn parallel_axes_writing_the_same_block_run_sequentially() {
    // Declared parallel, but every step writes output block (0, 0): the interpreter must not race.
    let call = pallas_call(shared_out_kernel)
        .grid([8])
        .input(
            ArrayType::new([64, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    let x = HostArray::random([64, 128], F32, 8).unwrap();
    let out = call.interpret(std::slice::from_ref(&x)).expect("run");
    let xs = x.as_slice::<f32>().unwrap();
    let o = out[0].as_slice::<f32>().unwrap();
    for c in 0..8 * 128 {
        let want: f32 = (0..8).map(|b| xs[b * 8 * 128 + c]).sum();
        assert!((o[c] - want).abs() < 1e-5);
    }
}

// ---------------------------------------------------------------------------------------------- properties

mod props {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> ProptestConfig {
        ProptestConfig {
            cases: 12,
            max_shrink_iters: 20,
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(cfg())]

        #[test]
        fn elementwise_add(bm_t in 1usize..4, bn_t in 1usize..3, gm in 1usize..4, gn in 1usize..3, seed in 0u64..1000) {
            let (bm, bn) = (8 * bm_t, 128 * bn_t);
            let call = add::add(at([bm * gm, bn * gn], F32), at([bm * gm, bn * gn], F32), (bm, bn)).expect("build");
            check_against_reference(&call, seed, &InterpretOptions::poisoned());
        }

        #[test]
        fn row_softmax(rows_t in 1usize..4, n_t in 1usize..5, g in 1usize..5, seed in 0u64..1000) {
            let (br, n) = (8 * rows_t, 128 * n_t);
            let call = softmax::softmax(at([br * g, n], F32), br).expect("build");
            check_against_reference(&call, seed, &InterpretOptions::default());
        }

        #[test]
        fn column_sum_over_an_arbitrary_axis(bm_t in 1usize..4, bn_t in 1usize..3, gm in 1usize..5, gn in 1usize..3, seed in 0u64..1000) {
            let (bm, bn) = (8 * bm_t, 128 * bn_t);
            let call = colsum::colsum(at([bm * gm, bn * gn], F32), (bm, bn)).expect("build");
            check_against_reference(&call, seed, &InterpretOptions::poisoned());
        }

        #[test]
        fn rmsnorm_rows(rows_t in 1usize..3, n_t in 1usize..4, g in 1usize..4, seed in 0u64..1000) {
            let (br, n) = (16 * rows_t, 128 * n_t);
            let call = rmsnorm::rmsnorm(at([br * g, n], BF16), at([1, n], F32), 1e-6, br).expect("build");
            check_against_reference(&call, seed, &InterpretOptions::default());
        }

        #[test]
        fn tiled_matmul(bm_t in 1usize..3, bn_t in 1usize..3, bk_t in 1usize..3, gm in 1usize..3, gn in 1usize..3, gk in 1usize..4, seed in 0u64..1000) {
            let (bm, bn, bk) = (16 * bm_t, 128 * bn_t, 128 * bk_t);
            let call = matmul::matmul(at([bm * gm, bk * gk], BF16), at([bk * gk, bn * gn], BF16), (bm, bn, bk)).expect("build");
            check_against_reference(&call, seed, &InterpretOptions::poisoned());
        }
    }
}

#[test]
fn tolerance_helper_flags_mismatched_non_finite_values() {
    let a = HostArray::from_vec([2], vec![f32::NAN, 1.0]).unwrap();
    let b = HostArray::from_vec([2], vec![f32::NAN, 1.0]).unwrap();
    assert!(reference::compare(&a, &b, Tolerance::EXACT).ok);
    let c = HostArray::from_vec([2], vec![f32::INFINITY, 1.0]).unwrap();
    assert!(!reference::compare(&a, &c, Tolerance::EXACT).ok);
}

#[test]
fn loads_between_a_direct_write_and_its_store_see_the_old_block() {
    let call = pallas_call(read_between_kernel)
        .grid([3])
        .input(
            ArrayType::new([24, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[_]| (0, 0)),
        )
        .output(
            ArrayType::new([24, 128], F32),
            BlockSpec::new([8, 128], |[i]| (i, 0)),
        )
        .dimension_semantics([Arbitrary])
        .build()
        .expect("build");
    let x = HostArray::random([24, 128], F32, 12).unwrap();
    let xs = x.as_slice::<f32>().unwrap().to_vec();
    for fuse in [true, false] {
        let out = call
            .interpret_with(
                std::slice::from_ref(&x),
                &InterpretOptions {
                    fuse,
                    ..Default::default()
                },
            )
            .expect("run");
        let (o, prev) = (
            out[0].as_slice::<f32>().unwrap(),
            out[1].as_slice::<f32>().unwrap(),
        );
        for e in 0..8 * 128 {
            assert_eq!(o[e], xs[2 * 1024 + e] * 2.0, "fuse={fuse}");
            assert_eq!(prev[e], 1.0, "fuse={fuse}: step 0 sees a fresh block");
            assert_eq!(
                prev[1024 + e],
                xs[e] * 2.0 + 1.0,
                "fuse={fuse}: step 1 sees step 0's block"
            );
            assert_eq!(prev[2048 + e], xs[1024 + e] * 2.0 + 1.0, "fuse={fuse}");
        }
    }
}

#[test]
fn exp_of_a_difference_summed_in_one_pass_matches_unfused_bit_for_bit() {
    // exp(x - m) with its sum folded into the same AVX2 pass: rows of 200 (a lone 8-lane vector after
    // the whole 16s) and 203 (a scalar tail too), with NaN, -inf, inf and values whose exp is subnormal.
    for n in [200usize, 203] {
        let spec = || BlockSpec::new([8, n], |[i]| (i, 0));
        let call = pallas_call(exp_sum_kernel)
            .grid([3])
            .input(ArrayType::new([24, n], F32), spec())
            .output(ArrayType::new([24, n], F32), spec())
            .output(ArrayType::new([24, n], F32), spec())
            .dimension_semantics([Parallel])
            .build()
            .expect("build");
        let mut xs = HostArray::random([24, n], F32, 31)
            .unwrap()
            .into_vec::<f32>()
            .unwrap();
        for (i, x) in xs.iter_mut().enumerate() {
            *x *= 120.0; // exp underflows to subnormals and zero for many elements
            if i % 97 == 3 {
                *x = -90.0;
            }
        }
        xs[n + 5] = f32::NAN;
        xs[2 * n + 1] = f32::NEG_INFINITY;
        xs[3 * n + 7] = f32::INFINITY;
        let x = HostArray::from_vec([24, n], xs).unwrap();
        let run = |fuse| {
            let opts = InterpretOptions {
                fuse,
                ..Default::default()
            };
            call.interpret_with(std::slice::from_ref(&x), &opts)
                .expect("run")
        };
        let (fused, plain) = (run(true), run(false));
        for (f, p) in fused.iter().zip(&plain) {
            let bits = |a: &HostArray| {
                a.as_slice::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(f), bits(p), "rows of {n}");
        }
        let o = fused[0].as_slice::<f32>().unwrap();
        assert!(o[n..2 * n].iter().all(|v| v.is_nan()), "the NaN row");
        assert!(
            o[..n].iter().any(|v| *v > 0.0 && *v < f32::MIN_POSITIVE),
            "a subnormal"
        );
    }
}

#[test]
fn reductions_folded_into_fused_chains_match_unfused_bit_for_bit() {
    // 200 columns: rows are not a multiple of the 16 reduction lanes.
    let spec = || BlockSpec::new([8, 200], |[i]| (i, 0));
    let call = pallas_call(fused_reductions_kernel)
        .grid([2])
        .input(ArrayType::new([16, 200], F32), spec())
        .output(ArrayType::new([16, 200], F32), spec())
        .output(ArrayType::new([16, 200], F32), spec())
        .output(ArrayType::new([16, 200], BF16), spec())
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    let mut xs = HostArray::random([16, 200], F32, 21)
        .unwrap()
        .into_vec::<f32>()
        .unwrap();
    xs[5] = f32::NAN; // row 0: every reduction is NaN
    xs[200 + 7] = -0.0;
    let x = HostArray::from_vec([16, 200], xs.clone()).unwrap();
    let opts = |fuse| InterpretOptions {
        fuse,
        ..Default::default()
    };
    let fused = call
        .interpret_with(std::slice::from_ref(&x), &opts(true))
        .expect("run");
    let plain = call
        .interpret_with(std::slice::from_ref(&x), &opts(false))
        .expect("run");
    for (f, p) in fused.iter().zip(&plain) {
        let bits = |a: &HostArray| {
            a.to_f64_vec()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(f), bits(p));
    }
    let a = fused[0].as_slice::<f32>().unwrap();
    assert!(a[0].is_nan());
    for r in 1..16 {
        let want = xs[r * 200..(r + 1) * 200]
            .iter()
            .fold(f32::NEG_INFINITY, |m, &v| m.max(v * 2.0));
        assert_eq!(a[r * 200], want, "row {r}");
    }
}

#[tpu_kernel]
fn int_epilogue_kernel(
    acc: Ref<i32>,
    row_scale: Ref<f32>,
    col_scale: Ref<f32>,
    o: RefMut<bf16>,
    sq: RefMut<f32>,
) {
    let a = acc.load();
    // w8a8's epilogue (the i32 -> f32 cast read by the chain), and one cast read twice by a chain.
    o.store((a.cast::<f32>() * row_scale.load() * col_scale.load()).cast::<bf16>());
    let f = a.cast::<f32>();
    sq.store(f * f + 1.0);
}

#[test]
fn int_to_float_casts_folded_into_chains_match_unfused_bit_for_bit() {
    let spec = |n| BlockSpec::new([8, n], |[i]| (i, 0));
    let call = pallas_call(int_epilogue_kernel)
        .grid([2])
        .input(at([16, 256], I32), spec(256))
        .input(at([16, 1], F32), spec(1))
        .input(at([1, 256], F32), BlockSpec::new([1, 256], |[_]| (0, 0)))
        .output(at([16, 256], BF16), spec(256))
        .output(at([16, 256], F32), spec(256))
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    let plan = tpu_kernel::runtime::interpret::plan_counts(call.ir(), &InterpretOptions::default())
        .expect("plan");
    assert!(
        plan.folded >= 4,
        "both casts folded into their chains: {plan:?}"
    );
    // Integers past 2^24, where the cast rounds, and the ends of i32.
    let mut state = 0x9e37_79b9u32;
    let acc: Vec<i32> = (0..16 * 256)
        .map(|i| match i % 5 {
            0 => i32::MAX - i,
            1 => i32::MIN + i,
            _ => {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                state as i32
            }
        })
        .collect();
    let inputs = [
        HostArray::from_vec([16, 256], acc).unwrap(),
        HostArray::random([16, 1], F32, 5).unwrap(),
        HostArray::random([1, 256], F32, 6).unwrap(),
    ];
    assert_fused_is_plain(&call, &inputs);
}

/// Half-words a bf16 cast treats specially: NaNs quiet and signalling with any payload and sign,
/// infinities, subnormals, zeros of both signs, and one.
const SPECIAL_HALVES: [u16; 12] = [
    0x7F81, 0xFF81, 0x7FC0, 0xFFFF, 0x7FBF, 0x7F80, 0xFF80, 0x0001, 0x807F, 0x0000, 0x8000, 0x3F80,
];

/// `n` small multiples of 1/32 in [-1, 1) (exact in bf16), from [`words_with`]'s stream varied by
/// `seed`.
fn small_values(n: usize, seed: u32) -> Vec<f32> {
    words_with(n, |_| 0x3F80)
        .into_iter()
        .map(|w| ((w ^ seed) % 64) as f32 / 32.0 - 1.0)
        .collect()
}

/// `n` pseudo-random words (xorshift32), every third replaced by `special(i)`.
fn words_with(n: usize, special: impl Fn(usize) -> u32) -> Vec<u32> {
    let mut state = 0x2545_f491u32;
    (0..n)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            if i % 3 == 0 {
                special(i)
            } else {
                state
            }
        })
        .collect()
}

/// Both halves of each packed word as bf16 (as a kernel unpacks a bf16 KV cache), the bf16 results
/// read back as words.
#[tpu_kernel]
fn word_halves_kernel(w: Ref<u32>, lo: RefMut<u32>, hi: RefMut<u32>) {
    store_halves(w.load(), lo, hi);
}

/// Each word of `x` unpacked into its two bf16 halves, stored as words into `lo` and `hi`.
#[kernel_fn]
fn store_halves(x: Array<u32>, lo: RefMut<u32>, hi: RefMut<u32>) {
    let l = (x << 16u32).bitcast::<f32>().cast::<bf16>();
    let h = (x & 0xFFFF_0000u32).bitcast::<f32>().cast::<bf16>();
    lo.store(l.bitcast::<u32>());
    hi.store(h.bitcast::<u32>());
}

/// The plan's word halves (`shl`/`and`, `bitcast`, `cast<bf16>` as one pass) give the three ops'
/// bits on every half-word: NaNs quiet or signalling with any payload and sign, infinities,
/// subnormals, zeros of both signs, and random words.
#[test]
fn word_halves_match_the_unfused_ops_bit_for_bit() {
    let call = pallas_call(word_halves_kernel)
        .grid([2])
        .input(at([32, 256], U32), BlockSpec::new([16, 256], |[i]| (i, 0)))
        .output(at([16, 256], U32), BlockSpec::new([8, 256], |[i]| (i, 0)))
        .output(at([16, 256], U32), BlockSpec::new([8, 256], |[i]| (i, 0)))
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    let count = |fuse| plan_counts_with(&call, fuse).word_halves;
    assert_eq!(
        (count(true), count(false)),
        (2, 0),
        "both casts, fused only"
    );
    // Every pair of special halves, in both places of the word.
    let words = words_with(32 * 256, |i| {
        u32::from(SPECIAL_HALVES[i / 3 % 12]) | u32::from(SPECIAL_HALVES[i / 36 % 12]) << 16
    });
    let inputs = [HostArray::from_vec([32, 256], words).unwrap()];
    assert_fused_is_plain(&call, &inputs);
}

/// The keys and values of a packed bf16 block `[tokens, rows, 2, D]` read through its 32-bit view,
/// every other row (kv head 1 of two, as the ragged paged attention example reads a KV chunk), and
/// unpacked; the bf16 results read back as words.
#[tpu_kernel]
fn view_halves_kernel(kv: Ref<bf16>, k: RefMut<u32>, v: RefMut<u32>) {
    let words = kv.bitcast::<u32>().reshape([32, 128]);
    store_halves(words.at(ds(1, 16).stride(2)).load(), k, v);
}

/// A load of packed words used only by the two word-half casts reads the halves straight from the
/// bf16 rows (the plan's `load_halves`): the unfused ops' bits — each key `[t, 1, 0, d]` and value
/// `[t, 1, 1, d]` as the cast gives it (a signalling NaN quieted) — on special and random halves.
#[test]
fn halves_read_through_a_word_view_match_the_unfused_ops_bit_for_bit() {
    let [kv, lo, hi] = [
        whole([16, 2, 2, 128], BF16),
        whole([8, 128], U32),
        whole([8, 128], U32),
    ];
    let call = pallas_call(view_halves_kernel)
        .grid([1])
        .input(kv.0, kv.1)
        .output(lo.0, lo.1)
        .output(hi.0, hi.1)
        .build()
        .expect("build");
    let (on, off) = counts_on_off(&call);
    assert_eq!(
        (on.load_halves, off.load_halves, on.word_halves),
        (1, 0, 2),
        "one load, both casts at it, fused only"
    );
    let halves: Vec<u16> = words_with(16 * 2 * 2 * 128, |i| u32::from(SPECIAL_HALVES[i / 3 % 12]))
        .into_iter()
        .map(|w| w as u16)
        .collect();
    let data: Vec<bf16> = halves.iter().map(|&b| bf16::from_bits(b)).collect();
    let inputs = [HostArray::from_vec([16, 2, 2, 128], data).unwrap()];
    assert_fused_is_plain(&call, &inputs);
    // The expected halves, the cast's own way: bits kept, a NaN quieted.
    let cast = |b: u16| bf16::from_f32(f32::from_bits(u32::from(b) << 16)).to_bits();
    let out = call.interpret(&inputs).expect("runs");
    for (o, sub) in [(0, 0), (1, 1)] {
        let words = out[o].as_slice::<u32>().expect("u32");
        for t in 0..16 {
            for d in 0..128 {
                let want = cast(halves[((t * 2 + 1) * 2 + sub) * 128 + d]);
                // bf16 row t of the result is word row t / 2, its half t % 2.
                let w = words[(t / 2) * 128 + d];
                let got = if t % 2 == 0 { w & 0xFFFF } else { w >> 16 } as u16;
                assert_eq!(got, want, "output {o}, token {t}, lane {d}");
            }
        }
    }
}

/// Attention over the keys and values of a packed bf16 block `[tokens, rows, 2, D]` read through its
/// 32-bit view (kv head 1 of two, as the ragged paged attention example reads a KV chunk): the keys
/// straight into `q kᵀ`, the values masked past token 12 by a `select`, then `p v`.
#[tpu_kernel]
fn view_halves_dot_kernel(
    q: Ref<bf16>,
    p: Ref<bf16>,
    kv: Ref<bf16>,
    s: RefMut<f32>,
    o: RefMut<f32>,
) {
    let words = kv
        .bitcast::<u32>()
        .reshape([32, 128])
        .at(ds(1, 16).stride(2))
        .load();
    let k = (words << 16u32).bitcast::<f32>().cast::<bf16>();
    let v = (words & 0xFFFF_0000u32).bitcast::<f32>().cast::<bf16>();
    s.store(dot_nt(q.load(), k));
    let v = select(iota::<i32>([16, 128], 0) < 12, v, zeros_like(v));
    o.store(dot(p.load(), v));
}

/// Keys and values that reach only `dot`s (the values through a `select`) are read in place from the
/// ref's bf16 rows, not copied through the word-half cast (`PlanCounts::halves_in_place`): the unfused
/// ops' bits all the same, with signaling NaNs (which the cast quiets and the `dot` quiets alike),
/// quiet NaNs, infinities and subnormals among the keys and values, and a NaN in the masked rows.
#[test]
fn halves_read_in_place_for_dots_give_the_unfused_bits() {
    let [q, p, kv, s, o] = [
        whole([8, 128], BF16),
        whole([8, 16], BF16),
        whole([16, 2, 2, 128], BF16),
        whole([8, 16], F32),
        whole([8, 128], F32),
    ];
    let call = pallas_call(view_halves_dot_kernel)
        .grid([1])
        .input(q.0, q.1)
        .input(p.0, p.1)
        .input(kv.0, kv.1)
        .output(s.0, s.1)
        .output(o.0, o.1)
        .build()
        .expect("build");
    let (on, off) = counts_on_off(&call);
    assert_eq!(
        (on.load_halves, on.halves_in_place, off.halves_in_place),
        (1, 2, 0),
        "both halves in place, fused only"
    );
    let small = |n: usize, seed: u32| -> Vec<bf16> {
        words_with(n, |_| 0x3F80)
            .into_iter()
            .map(|w| bf16::from_f32(((w ^ seed) % 64) as f32 / 32.0 - 1.0))
            .collect()
    };
    for pick in [|i: usize| i / 3 % 12, |i: usize| (i / 7 + 5) % 12] {
        // Specials at every third element of the keys and values, spread over the rows.
        let kv: Vec<bf16> = words_with(16 * 2 * 2 * 128, |i| u32::from(SPECIAL_HALVES[pick(i)]))
            .into_iter()
            .map(|w| bf16::from_bits(w as u16))
            .collect();
        let inputs = [
            HostArray::from_vec([8, 128], small(8 * 128, 7)).unwrap(),
            HostArray::from_vec([8, 16], small(8 * 16, 11)).unwrap(),
            HostArray::from_vec([16, 2, 2, 128], kv).unwrap(),
        ];
        assert_fused_is_plain(&call, &inputs);
    }
    // A block with no specials gives ordinary numbers, so the comparison above is not of NaNs alone.
    let inputs = [
        HostArray::from_vec([8, 128], small(8 * 128, 7)).unwrap(),
        HostArray::from_vec([8, 16], small(8 * 16, 11)).unwrap(),
        HostArray::from_vec([16, 2, 2, 128], small(16 * 2 * 2 * 128, 3)).unwrap(),
    ];
    assert_fused_is_plain(&call, &inputs);
    let out = call.interpret(&inputs).expect("runs");
    assert!(out[0]
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .all(|x| x.is_finite()));
}

/// Right factors made by `select`s used only by their `dot` (the plan's `select_rhs`), as kernels
/// write them: rows kept by a condition the same along each row — plainly, with an accumulator, and
/// transposed (`dot_nt`, the condition along the stored columns) — and the selects the `dot` cannot
/// take in (a condition that varies along a row, −0 as the other choice) and f32 factors (zeroed in a
/// copy: only the bf16 kernel drops rows itself).
#[tpu_kernel]
#[allow(clippy::too_many_arguments)]
fn select_rhs_kernel(
    p: Ref<bf16>,
    v: Ref<bf16>,
    vt: Ref<bf16>,
    w: Ref<f32>,
    a: Ref<f32>,
    o0: RefMut<f32>,
    o1: RefMut<f32>,
    o2: RefMut<f32>,
    f0: RefMut<f32>,
    f1: RefMut<f32>,
    f2: RefMut<f32>,
) {
    let (p, v, vt, w) = (p.load(), v.load(), vt.load(), w.load());
    let rows = iota::<i32>([16, 128], 0) < 12;
    o0.store(dot(p, select(rows, v, zeros_like(v))));
    let first = iota::<i32>([16, 128], 0) < 5;
    o1.store(a.load() * 2.0f32 + dot(p, select(first, v, zeros_like(v))));
    let cols = iota::<i32>([128, 16], 1) < 12;
    o2.store(dot_nt(p, select(cols, vt, zeros_like(vt))));
    let along = iota::<i32>([16, 128], 1) < 100;
    f0.store(dot(p, select(along, v, zeros_like(v))));
    f1.store(dot(
        p,
        select(rows, v, full([16, 128], bf16::from_f32(-0.0))),
    ));
    f2.store(dot(p.cast::<f32>(), select(rows, w, zeros_like(w))));
}

/// A `select` that only makes a `dot`'s right factor runs inside the `dot`
/// (`PlanCounts::selects_in_dots`): the unfused ops' bits for every form of it, with NaNs and
/// infinities in the dropped rows and in the kept ones; with them in the dropped rows alone, the
/// folded forms give finite sums (the dropped rows are not read as they are).
#[test]
fn selects_folded_into_dots_give_the_unfused_bits() {
    let [p, v, vt, w, a] = [
        whole([8, 16], BF16),
        whole([16, 128], BF16),
        whole([128, 16], BF16),
        whole([16, 128], F32),
        whole([8, 128], F32),
    ];
    let mut call = pallas_call(select_rhs_kernel)
        .grid([1])
        .input(p.0, p.1)
        .input(v.0, v.1)
        .input(vt.0, vt.1)
        .input(w.0, w.1)
        .input(a.0, a.1);
    for _ in 0..6 {
        let o = whole([8, 128], F32);
        call = call.output(o.0, o.1);
    }
    let call = call.build().expect("build");
    let (on, off) = counts_on_off(&call);
    assert_eq!((on.selects_in_dots, off.selects_in_dots), (6, 0));
    let small = small_values;
    // `special(i, row)`: whether element i (in row `row` of the dot's right factor) is a special.
    let inputs = |special: &dyn Fn(usize, usize) -> bool| {
        let pick = |i: usize, x: f32| {
            if special(i, if i / 128 < 16 { i / 128 } else { 0 }) {
                bf16::from_bits(SPECIAL_HALVES[i / 3 % 7])
            } else {
                bf16::from_f32(x)
            }
        };
        let v: Vec<bf16> = small(16 * 128, 3)
            .iter()
            .enumerate()
            .map(|(i, x)| pick(i, *x))
            .collect();
        // vt's element [j, r] is row r (of the product's k) of column j.
        let vt: Vec<bf16> = small(128 * 16, 5)
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let (j, r) = (i / 16, i % 16);
                pick(r * 128 + j, *x)
            })
            .collect();
        let w: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
        [
            HostArray::from_vec(
                [8, 16],
                small(8 * 16, 11)
                    .iter()
                    .map(|x| bf16::from_f32(*x))
                    .collect(),
            )
            .unwrap(),
            HostArray::from_vec([16, 128], v).unwrap(),
            HostArray::from_vec([128, 16], vt).unwrap(),
            HostArray::from_vec([16, 128], w).unwrap(),
            HostArray::from_vec([8, 128], small(8 * 128, 13)).unwrap(),
        ]
    };
    assert_fused_is_plain(&call, &inputs(&|i, _| i % 3 == 0));
    // Specials only in rows 12.. (dropped by `rows` and `cols`, and by `first`).
    let dropped_only = inputs(&|i, row| row >= 12 && i % 3 == 0);
    assert_fused_is_plain(&call, &dropped_only);
    let out = call.interpret(&dropped_only).expect("runs");
    for (k, o) in out.iter().enumerate() {
        let finite = o.as_slice::<f32>().unwrap().iter().all(|x| x.is_finite());
        // f.0 keeps every row (its condition drops columns 100..).
        assert_eq!(finite, k != 3, "output {k}");
    }
}

/// Scores a `select` reads only in some columns (the plan's `live_columns`), as attention masks the
/// keys past a sequence's length: `q kᵀ` scaled; through a soft cap with a causal factor (`and`, `<=`,
/// the iota second in its `add`); `q k` with f32 keys; and a product read twice (not eligible).
#[tpu_kernel]
#[allow(clippy::too_many_arguments)]
fn live_columns_kernel(
    t: Ref<i32, Smem>,
    q: Ref<bf16>,
    k: Ref<bf16>,
    kt: Ref<f32>,
    o0: RefMut<f32>,
    o1: RefMut<f32>,
    o2: RefMut<f32>,
    o3: RefMut<f32>,
) {
    let (first, end) = (t.at(0).load(), t.at(1).load());
    let (q, k) = (q.load(), k.load());
    let pos = iota::<i32>([8, 256], 1) + first;
    let mask = full([8, 256], -1.0e30f32);
    o0.store(select(pos < end, dot_nt(q, k) * 0.125f32, mask));
    let rows = iota::<i32>([8, 256], 0) + first;
    let pos_after = first + iota::<i32>([8, 256], 1);
    let keep = (pos_after <= end) & (pos_after <= rows + 100);
    o1.store(select(
        keep,
        (dot_nt(q, k) / 30.0f32).tanh() * 30.0f32,
        mask,
    ));
    o2.store(select(pos < end, dot(q.cast::<f32>(), kt.load()), mask));
    let s = dot_nt(q, k);
    o3.store(select(pos < end, s, mask) + s);
}

/// A `dot` whose result only a `select` reads, in the columns its condition picks it, computes only
/// up to the last of them (`PlanCounts::live_column_dots`): the unfused ops' bits at lengths none,
/// some, all and wrapping past `i32::MAX`, with NaNs and infinities in the keys of the columns left
/// out (and, once, in the ones kept).
#[test]
fn dots_read_in_some_columns_give_the_unfused_bits() {
    let call = pallas_call(live_columns_kernel)
        .grid([1])
        .scalar_prefetch(at([2], I32))
        .input(whole([8, 128], BF16).0, whole([8, 128], BF16).1)
        .input(whole([256, 128], BF16).0, whole([256, 128], BF16).1)
        .input(whole([128, 256], F32).0, whole([128, 256], F32).1)
        .output(whole([8, 256], F32).0, whole([8, 256], F32).1)
        .output(whole([8, 256], F32).0, whole([8, 256], F32).1)
        .output(whole([8, 256], F32).0, whole([8, 256], F32).1)
        .output(whole([8, 256], F32).0, whole([8, 256], F32).1)
        .build()
        .expect("build");
    let (on, off) = counts_on_off(&call);
    assert_eq!((on.live_column_dots, off.live_column_dots), (3, 0));
    let small = small_values;
    let q: Vec<bf16> = small(8 * 128, 3)
        .iter()
        .map(|x| bf16::from_f32(*x))
        .collect();
    // Keys from column `from` on (rows of `k`, columns of `kt`) hold specials now and then.
    let keys = |from: usize| {
        let special = |j: usize, i: usize| j >= from && i.is_multiple_of(5);
        let k: Vec<bf16> = small(256 * 128, 5)
            .iter()
            .enumerate()
            .map(|(i, x)| match special(i / 128, i) {
                true => bf16::from_bits(SPECIAL_HALVES[i / 5 % 12]),
                false => bf16::from_f32(*x),
            })
            .collect();
        let kt: Vec<f32> = small(128 * 256, 7)
            .iter()
            .enumerate()
            .map(|(i, x)| match special(i % 256, i) {
                true => f32::from_bits(u32::from(SPECIAL_HALVES[i / 5 % 12]) << 16),
                false => *x,
            })
            .collect();
        (k, kt)
    };
    for (first, end, specials_from) in [
        (0, 100, 100),
        (37, 100, 63),
        (0, 0, 0),
        (-5, 300, 256),
        (-5, 300, 200),
        (i32::MAX - 10, i32::MIN + 5, 16),
        (10, 5, 0),
    ] {
        let (k, kt) = keys(specials_from);
        let inputs = [
            HostArray::from_vec([2], vec![first, end]).unwrap(),
            HostArray::from_vec([8, 128], q.clone()).unwrap(),
            HostArray::from_vec([256, 128], k).unwrap(),
            HostArray::from_vec([128, 256], kt).unwrap(),
        ];
        assert_fused_is_plain(&call, &inputs);
    }
}

/// Words stored through a 32-bit view of a bf16 block `[tokens, rows, 2, D]` (how the ragged paged
/// attention example stores a head's output rows): each word's low half is element 0 of its pair.
#[tpu_kernel]
fn words_into_pairs_kernel(w: Ref<u32>, o: RefMut<bf16>) {
    o.bitcast::<u32>().reshape([16, 128]).store(w.load());
}

/// A store of words through a 32-bit view of 16-bit rows whose halves go to two runs of elements
/// writes each half once (`walk::write_halves`); the bits are the words' own, NaN patterns
/// included: element `[t, r, 0, d]` is the low half of word `[2t + r, d]`, `[t, r, 1, d]` the high.
#[test]
fn words_stored_through_a_word_view_land_as_their_halves() {
    let call = pallas_call(words_into_pairs_kernel)
        .grid([2])
        .input(at([32, 128], U32), BlockSpec::new([16, 128], |[i]| (i, 0)))
        .output(
            at([16, 2, 2, 128], BF16),
            BlockSpec::new([8, 2, 2, 128], |[i]| (i, 0, 0, 0)),
        )
        .build()
        .expect("build");
    let mut state = 0x2545_f491u32;
    let words: Vec<u32> = (0..32 * 128)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            match i % 4 {
                0 => 0x7F81_FF81, // signalling NaNs in both halves: moved as bits, not quieted
                _ => state,
            }
        })
        .collect();
    let out = call
        .interpret(&[HostArray::from_vec([32, 128], words.clone()).unwrap()])
        .expect("runs");
    let got = out[0].as_slice::<bf16>().expect("bf16");
    for (i, w) in words.iter().enumerate() {
        let (row, d) = (i / 128, i % 128);
        let at = (row * 2) * 128 + d; // [t, r] = row, pair element 0
        assert_eq!(got[at].to_bits() as u32, w & 0xFFFF, "word {i} low half");
        assert_eq!(
            got[at + 128].to_bits() as u32,
            w >> 16,
            "word {i} high half"
        );
    }
}

/// What the plan makes fire in `call`'s kernel, with the fast paths on or off.
fn plan_counts_with(call: &PallasCall, fuse: bool) -> tpu_kernel::runtime::interpret::PlanCounts {
    let opts = InterpretOptions {
        fuse,
        ..Default::default()
    };
    tpu_kernel::runtime::interpret::plan_counts(call.ir(), &opts).expect("plan")
}

/// `call`'s outputs on `inputs` with the plan's fast paths and without (`fuse: false`): equal.
fn assert_fused_is_plain(call: &PallasCall, inputs: &[HostArray]) {
    let run = |fuse| {
        let opts = InterpretOptions {
            fuse,
            ..Default::default()
        };
        call.interpret_with(inputs, &opts).expect("run")
    };
    assert_eq!(run(true), run(false));
}

fn at<const R: usize>(shape: [usize; R], dtype: DType) -> ArrayType {
    ArrayType::new(shape, dtype)
}

/// An input or output that is one whole block of a one-step grid.
fn whole<const R: usize>(shape: [usize; R], dtype: DType) -> (ArrayType, BlockSpec<'static>) {
    (at(shape, dtype), BlockSpec::new(shape, |[_i]| [0usize; R]))
}

/// The plan's counts of `call` with the fast paths on and off.
fn counts_on_off(
    call: &PallasCall,
) -> (
    tpu_kernel::runtime::interpret::PlanCounts,
    tpu_kernel::runtime::interpret::PlanCounts,
) {
    (plan_counts_with(call, true), plan_counts_with(call, false))
}

/// The block table with every entry past sequence `b`'s `ceil(lengths[b] / page_size)` pages replaced
/// by `i32::MAX` (a DMA of such a "page" is out of bounds); `also` names one more (sequence, entry).
fn table_without_unowned_pages(inputs: &[HostArray], also: Option<(usize, usize)>) -> HostArray {
    let lengths = inputs[0].as_slice::<i32>().unwrap();
    let (table, &[batch, per_seq]) = (inputs[1].as_slice::<i32>().unwrap(), inputs[1].shape())
    else {
        panic!("a 2-D block table")
    };
    let page_size = inputs[3].shape()[2];
    let entries = (0..batch * per_seq)
        .map(|i| {
            let (b, p) = (i / per_seq, i % per_seq);
            let owned = p * page_size < lengths[b] as usize && also != Some((b, p));
            if owned {
                table[i]
            } else {
                i32::MAX
            }
        })
        .collect::<Vec<_>>();
    HostArray::from_vec([batch, per_seq], entries).unwrap()
}

#[test]
fn paged_attention_reads_only_the_pages_a_sequence_owns_under_every_dma_timing() {
    // Random ragged inputs: sequence 0 has 1 token, 1 every page, 2 none, 3 one token into page 2.
    let call = paged_attention::build().expect("build");
    let mut inputs = reference::random_inputs(&call, 5);
    let want = call.interpret(&inputs).expect("interpret");
    inputs[1] = table_without_unowned_pages(&inputs, None);
    for seed in [None, Some(0), Some(1), Some(7), Some(42)] {
        let opts = InterpretOptions {
            dma_seed: seed,
            poison_uninitialized: true,
            ..InterpretOptions::default()
        };
        let got = call
            .interpret_with(&inputs, &opts)
            .unwrap_or_else(|e| panic!("seed {seed:?}: {e}"));
        assert_eq!(got, want, "seed {seed:?}");
    }
    let mosaic = tpu_kernel::runtime::mosaic_cpu::compile(call.ir())
        .and_then(|c| c.run(&inputs))
        .expect("mosaic_cpu");
    // (its own exp: within the examples' bf16 tolerance, as tests/mosaic_cpu.rs holds every example)
    let c = reference::compare(&mosaic[0], &want[0], Tolerance::BF16);
    assert!(
        c.ok,
        "the Mosaic module on the CPU: max error {}",
        c.max_abs_error
    );
    // Not vacuous: the last page of the full sequence is read, so poisoning it is an error.
    let per_seq = inputs[1].shape()[1];
    inputs[1] = table_without_unowned_pages(&inputs, Some((1, per_seq - 1)));
    let e = call.interpret(&inputs).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfBounds, "{e}");
}

/// Positions from `iota` plus the grid offset, as attention kernels make their masks: each op before
/// the mask's last `&&` has operands broadcast alike and computes one row or column
/// (`elementwise::shared_broadcast`); its broadcast result is then used every way a value is — stored
/// whole, reduced over its broadcast axis, reshaped, cast, fed to a `dot` and to a full-shaped op.
#[tpu_kernel]
fn positions_from_iota_kernel(x: Ref<f32>, o: RefMut<f32>, pos: RefMut<i32>, rows: RefMut<f32>) {
    let i = program_id(0);
    let k_pos = iota::<i32>([8, 256], 1) + i * 64; // varies along columns only
    let q_pos = iota::<i32>([8, 256], 0) / 2 + i * 8; // along rows only
    let keep = (k_pos < 300) && k_pos <= q_pos * 20;
    o.store(select(keep, x.load(), -1.0f32));
    pos.store(k_pos);
    let kf = k_pos.cast::<f32>();
    let col_sums = kf.sum_keepdims(0).broadcast_to([8, 256]); // 8 × k_pos
    let qf = q_pos.cast::<f32>().reshape([16, 128]).reshape([8, 256]);
    let ones = (k_pos == k_pos)
        .cast::<f32>()
        .slice((.., 0..128))
        .reshape([128, 8]);
    let spread = dot(qf.slice((.., 0..128)), ones).broadcast_to([8, 8]); // 128 × q_pos per row
    rows.store(col_sums + qf + spread.slice((.., 0..1)).broadcast_to([8, 256]));
}

#[test]
fn values_computed_once_for_a_broadcast_axis_are_used_every_way() {
    let g = 3;
    let call = pallas_call(positions_from_iota_kernel)
        .grid([g])
        .input(
            at([8 * g, 256], F32),
            BlockSpec::new([8, 256], |[i]| (i, 0)),
        )
        .output(
            at([8 * g, 256], F32),
            BlockSpec::new([8, 256], |[i]| (i, 0)),
        )
        .output(
            at([8 * g, 256], I32),
            BlockSpec::new([8, 256], |[i]| (i, 0)),
        )
        .output(
            at([8 * g, 256], F32),
            BlockSpec::new([8, 256], |[i]| (i, 0)),
        )
        .build()
        .expect("build");
    let x: Vec<f32> = (0..8 * g * 256).map(|i| i as f32 * 0.5).collect();
    let inputs = [HostArray::from_vec([8 * g, 256], x.clone()).unwrap()];
    let out = call.interpret(&inputs).expect("runs");
    let (o, pos, rows) = (
        out[0].as_slice::<f32>().unwrap(),
        out[1].as_slice::<i32>().unwrap(),
        out[2].as_slice::<f32>().unwrap(),
    );
    for (e, &xv) in x.iter().enumerate() {
        let (i, r, c) = (e / (8 * 256), e / 256 % 8, e % 256);
        let k = (c + 64 * i) as i32;
        let q = (r / 2 + 8 * i) as i32;
        let keep = k < 300 && k <= q * 20;
        assert_eq!(o[e], if keep { xv } else { -1.0 }, "o at {e}");
        assert_eq!(pos[e], k, "pos at {e}");
        let want = 8.0 * k as f32 + q as f32 + 128.0 * q as f32;
        assert_eq!(rows[e], want, "rows at {e}");
    }
    assert_fused_is_plain(&call, &inputs);
}

/// Edge pairs for the integer ops: overflow, division by zero and by −1, negative remainders,
/// shifts at and past the bit width and by negative amounts.
const EDGE_PAIRS: [(i32, i32); 8] = [
    (i32::MIN, -1),
    (i32::MAX, 2),
    (-7, 0),
    (-7, 2),
    (7, -3),
    (-8, 32),
    (5, -1),
    (40000, 40000),
];

/// The twelve arithmetic ops the test checks, on `a` and `b` (rank 0 or arrays alike; `min` and
/// `max` as each spells them).
macro_rules! arithmetic_ops {
    ($a:ident, $b:ident, $min:expr, $max:expr) => {
        vec![
            $a + $b,
            $a - $b,
            $a * $b,
            $a / $b,
            $a % $b,
            $min,
            $max,
            $a << $b,
            $a >> $b,
            $a & $b,
            $a | $b,
            $a ^ $b,
        ]
    };
}

/// The fourteen integer ops the test checks on rank-0 values: the arithmetic, then two comparisons
/// cast to 1 or 0.
fn scalar_int_ops(a: Scalar<i32>, b: Scalar<i32>) -> Vec<Scalar<i32>> {
    let mut ops = arithmetic_ops!(a, b, a.min(b), a.max(b));
    ops.extend(scalar_flags(a, b));
    ops
}

/// `a < b` and `a == b` as 1 or 0 (in a kernel function, which traces `<` and `==`).
#[kernel_fn]
fn scalar_flags(a: Scalar<i32>, b: Scalar<i32>) -> [Scalar<i32>; 2] {
    [(a < b).cast::<i32>(), (a == b).cast::<i32>()]
}

/// The same ops on arrays.
fn array_int_ops(a: Array<i32>, b: Array<i32>) -> Vec<Array<i32>> {
    let mut ops = arithmetic_ops!(a, b, minimum(a, b), maximum(a, b));
    ops.extend(array_flags(a, b));
    ops
}

#[kernel_fn]
fn array_flags(a: Array<i32>, b: Array<i32>) -> [Array<i32>; 2] {
    [(a < b).cast::<i32>(), (a == b).cast::<i32>()]
}

/// Row `k` of `o`, lanes `0..8`: op `k` on each pair, computed once on rank-0 values (the
/// prefetched table: the plan's `scalar` ops) and once on whole arrays (`x`, `y` hold the same
/// pairs in every row): `o` the scalars' rows, `v` the arrays'.
#[tpu_kernel]
fn scalar_edges_kernel(
    t: Ref<i32, Smem>,
    x: Ref<i32>,
    y: Ref<i32>,
    o: RefMut<i32>,
    v: RefMut<i32>,
) {
    let rows = iota::<i32>([16, 128], 0);
    let lanes = iota::<i32>([16, 128], 1);
    let mut out = full([16, 128], -1i32);
    for p in unroll(0..8usize) {
        let results = scalar_int_ops(t.at(2 * p).load(), t.at(2 * p + 1).load());
        for k in unroll(0..14usize) {
            out = select((rows == k as i32) & (lanes == p as i32), results[k], out);
        }
    }
    o.store(out);
    let results = array_int_ops(x.load(), y.load());
    let mut vout = full([16, 128], -1i32);
    for k in unroll(0..14usize) {
        vout = select((rows == k as i32) & (lanes < 8), results[k], vout);
    }
    v.store(vout);
}

#[test]
fn scalar_ops_give_the_bits_of_the_same_ops_on_arrays() {
    let (x, y) = (whole([16, 128], I32), whole([16, 128], I32));
    let (o, v) = (whole([16, 128], I32), whole([16, 128], I32));
    let call = pallas_call(scalar_edges_kernel)
        .grid([1])
        .scalar_prefetch(at([16], I32))
        .input(x.0, x.1)
        .input(y.0, y.1)
        .output(o.0, o.1)
        .output(v.0, v.1)
        .build()
        .expect("build");
    let table: Vec<i32> = EDGE_PAIRS.iter().flat_map(|&(a, b)| [a, b]).collect();
    let lane = |pick: fn((i32, i32)) -> i32| -> Vec<i32> {
        (0..16 * 128)
            .map(|i| EDGE_PAIRS.get(i % 128).map_or(1, |&p| pick(p)))
            .collect()
    };
    let inputs = [
        HostArray::from_vec([16], table).unwrap(),
        HostArray::from_vec([16, 128], lane(|p| p.0)).unwrap(),
        HostArray::from_vec([16, 128], lane(|p| p.1)).unwrap(),
    ];
    let out = call.interpret(&inputs).expect("runs");
    let (s, a) = (
        out[0].as_slice::<i32>().unwrap(),
        out[1].as_slice::<i32>().unwrap(),
    );
    for k in 0..14 {
        assert_eq!(s[k * 128..k * 128 + 8], a[k * 128..k * 128 + 8], "op {k}");
    }
    // XLA's integer semantics at the edges, so the comparison above is not of two wrong answers.
    assert_eq!(
        (s[0], s[3 * 128], s[3 * 128 + 2], s[4 * 128 + 4]),
        (i32::MAX, i32::MIN, -1, 1)
    );
    assert_eq!((s[7 * 128 + 5], s[8 * 128 + 5]), (0, -1));
    // The plan's scalar path against the general dispatch (every fast path off).
    assert_fused_is_plain(&call, &inputs);
    let (on, off) = counts_on_off(&call);
    assert!(on.scalar_ops >= 8 * 14 && off.scalar_ops == 0, "{on:?}");
}

/// Four iterations: a reshape of slot `i % 2` of `x` (its base changes every iteration) and a
/// bitcast-then-static-window-then-reshape of `x` (the same base every iteration), added.
#[tpu_kernel]
fn view_memo_kernel(x: Ref<f32>, o: RefMut<f32>) {
    for i in 0..4 {
        let slot = x.at(i % 2).reshape([2, 8, 128]);
        let same = x.bitcast::<u32>().at(1).reshape([2, 8, 128]);
        let a = slot.load().reshape([16, 128]);
        let b = same.load().reshape([16, 128]).bitcast::<f32>();
        o.at(i).store(a + b);
    }
}

/// Six iterations: row `i % 3` of `x` seen through a bitcast (a run-time window of a composed view)
/// and a reshape, stored to `o[i]`.
#[tpu_kernel]
fn view_memo_rows_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let s = x.shape();
    for i in 0..6 {
        let row = x.bitcast::<u32>().at(i % 3).reshape([2, s[1] / 2, s[2]]);
        o.at(i)
            .store(row.load().reshape([s[1], s[2]]).bitcast::<f32>());
    }
}

fn view_memo_rows_call(rows: usize) -> (PallasCall, Vec<HostArray>, Vec<f32>) {
    let [x, o] = [whole([3, rows, 128], F32), whole([6, rows, 128], F32)];
    let call = pallas_call(view_memo_rows_kernel)
        .grid([1])
        .input(x.0, x.1)
        .output(o.0, o.1)
        .build()
        .expect("build");
    let data: Vec<f32> = (0..3 * rows * 128).map(|i| i as f32 * 0.5 - 7.0).collect();
    let inputs = vec![HostArray::from_vec([3, rows, 128], data.clone()).unwrap()];
    (call, inputs, data)
}

/// The views a loop takes of a few bases are composed once per base and operand values, on the
/// thread that runs them (`machine/view_memo.rs`): the bitcast once, the window of row `i % 3` and
/// its reshape once per row — 7 views for 6 iterations, where making each every time is 13 — and
/// each iteration still reads its own row, bit for bit. Two kernels of one source at two shapes, run
/// in turn on one thread, each read their own.
#[test]
fn views_of_a_few_bases_are_composed_once_each() {
    use tpu_kernel::runtime::interpret::views_made;
    let runs = [view_memo_rows_call(16), view_memo_rows_call(8)];
    for round in 0..2 {
        for (call, inputs, data) in &runs {
            // On this thread alone (the loop's iterations would otherwise be split across threads).
            let opts = InterpretOptions {
                parallel: false,
                ..InterpretOptions::default()
            };
            let before = views_made();
            let out = call.interpret_with(inputs, &opts).expect("runs");
            let made = views_made() - before;
            assert_eq!(made, 1 + 3 + 3, "round {round}");
            let got = out[0].as_slice::<f32>().expect("f32");
            let per = data.len() / 3;
            for i in 0..6 {
                let want = &data[(i % 3) * per..(i % 3 + 1) * per];
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got[i * per..(i + 1) * per]),
                    bits(want),
                    "iteration {i}"
                );
            }
        }
    }
    assert_fused_is_plain(&runs[0].0, &runs[0].1);
}

/// A view op whose view depends on its base alone is kept per base (`Machine::memo_view`):
/// each iteration still reads its own slot through the reshape whose base changes, and the view
/// over the unchanging base the same elements every time — `o[i] = x[i % 2] + x[1]`, bit for bit,
/// fused or not.
#[test]
fn views_remembered_across_iterations_follow_their_base() {
    let [x, o] = [whole([2, 16, 128], F32), whole([4, 16, 128], F32)];
    let call = pallas_call(view_memo_kernel)
        .grid([1])
        .input(x.0, x.1)
        .output(o.0, o.1)
        .build()
        .expect("build");
    let data: Vec<f32> = (0..2 * 2048).map(|i| i as f32 * 0.25 - 300.0).collect();
    let inputs = [HostArray::from_vec([2, 16, 128], data.clone()).unwrap()];
    assert_fused_is_plain(&call, &inputs);
    let out = call.interpret(&inputs).expect("runs");
    let got = out[0].as_slice::<f32>().expect("f32");
    for i in 0..4 {
        for e in 0..2048 {
            let want = data[(i % 2) * 2048 + e] + data[2048 + e];
            assert_eq!(
                got[i * 2048 + e].to_bits(),
                want.to_bits(),
                "iteration {i}, element {e}"
            );
        }
    }
}
