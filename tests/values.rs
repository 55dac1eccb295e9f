//! The values real kernels build (issue 21 item 5): `select` on a traced scalar condition, `full` of a
//! traced scalar. Each: the interpreter's numbers against a plain-Rust reference (bit for bit: the ops
//! are exact), the shipped Mosaic module run on the CPU giving the same bits, the Mosaic ops Pallas
//! emits for the same construct, and every trace-time mistake as a `KernelError` at its marked line.

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::HostArray;
use tpu_kernel::{ErrorKind, KernelError};

#[path = "common/marks.rs"]
mod marks;

#[path = "common/engines.rs"]
mod engines;
use engines::{bits, engines_agree, f32_input};

const HERE: marks::Marked = marks::Marked {
    file: "values.rs",
    src: include_str!("values.rs"),
};

#[track_caller]
fn expect_err(r: Result<PallasCall, KernelError>, kind: ErrorKind, tag: &str, needles: &[&str]) {
    match r {
        Ok(_) => panic!("expected a {kind:?} error for {tag}, but build() succeeded"),
        Err(e) => HERE.check(&e, kind, tag, needles),
    }
}

/// A grid of `steps` row blocks of `block` over an f32 input of `[steps * block[0], block[1]]`.
fn row_blocks(
    kernel: impl tpu_kernel::launch::KernelFn<(Ref<f32>, RefMut<f32>)>,
    steps: usize,
    block: [usize; 2],
    out_block: [usize; 2],
) -> Result<PallasCall, KernelError> {
    pallas_call(kernel)
        .grid([steps])
        .input(
            ArrayType::new([steps * block[0], block[1]], F32),
            BlockSpec::new(block, |[i]| (i, 0)),
        )
        .output(
            ArrayType::new([steps * out_block[0], out_block[1]], F32),
            BlockSpec::new(out_block, |[i]| (i, 0)),
        )
        .build()
}

// ---------------------------------------------------------------------------------------------- select

#[tpu_kernel]
fn select_scalar_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    let i = program_id(0);
    // A traced scalar condition, array branches, a literal branch, and `where_`.
    let b = select(i == 1, a * 2.0, a + 1.0);
    o.store(where_(i >= 2, -1.0, b));
}

#[test]
fn select_on_a_scalar_condition_picks_one_branch_per_step() {
    let call = row_blocks(select_scalar_kernel, 4, [8, 128], [8, 128]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    // As Pallas lowers `jnp.where(pred, a, b)` with a scalar `pred`: `arith.select` on the i1 itself.
    assert!(
        !mosaic.contains("xi1>"),
        "the condition was broadcast: {mosaic}"
    );
    assert_eq!(mosaic.matches("arith.select %").count(), 2, "{mosaic}");
    let (x, input) = f32_input([32, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..32 * 128)
        .map(|i| match i / (8 * 128) {
            0 => x[i] + 1.0,
            1 => x[i] * 2.0,
            _ => -1.0,
        })
        .map(f32::to_bits)
        .collect();
    assert_eq!(bits(&out[0]), want);
}

#[tpu_kernel]
fn select_scalar_branches_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let one = scalar(1.0f32);
    let v = select(program_id(0) == 0, one, 2.0); // E:select_scalars
    o.store(x.load() + v);
}

#[tpu_kernel]
fn select_scalar_shapes_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    let col = a.slice((.., 0..2));
    o.store(select(program_id(0) == 0, a, col)); // E:select_shapes
}

#[test]
fn select_mistakes_name_the_line() {
    expect_err(
        row_blocks(select_scalar_branches_kernel, 2, [8, 128], [8, 128]),
        ErrorKind::Shape,
        "select_scalars",
        &["at least one branch must be an array", "use `if`"],
    );
    expect_err(
        row_blocks(select_scalar_shapes_kernel, 2, [8, 128], [8, 128]),
        ErrorKind::Shape,
        "select_shapes",
        &["[8, 128] and [8, 2] cannot be broadcast together"],
    );
}

// ---------------------------------------------------------------------------------------------- full

#[tpu_kernel]
fn full_scalar_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    let step = program_id(0);
    let s = step.cast::<f32>() * 0.75;
    // A traced i32 (the grid step), a traced f32, a literal.
    let steps = full([8, 128], step * 3).cast::<f32>();
    o.store(a + steps + full([8, 128], s) + full_like(a, s * 0.5) + full([8, 128], 0.25f32));
}

#[test]
fn full_of_a_traced_scalar_broadcasts_it() {
    let call = row_blocks(full_scalar_kernel, 3, [8, 128], [8, 128]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    // As Pallas lowers `jnp.full(shape, traced)`: `vector.broadcast` of the scalar.
    assert!(mosaic.contains(": i32 to vector<8x128xi32>"), "{mosaic}");
    assert!(mosaic.contains(": f32 to vector<8x128xf32>"), "{mosaic}");
    let (x, input) = f32_input([24, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..24 * 128)
        .map(|i| {
            let step = i / (8 * 128);
            let s = step as f32 * 0.75;
            x[i] + (step * 3) as f32 + s + s * 0.5 + 0.25
        })
        .map(f32::to_bits)
        .collect();
    assert_eq!(bits(&out[0]), want);
}

#[tpu_kernel]
fn full_zero_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let z = full([8, 0], program_id(0)); // E:full_zero
    o.store(x.load() + z.cast::<f32>().sum_keepdims(1));
}

#[test]
fn full_mistakes_name_the_line() {
    expect_err(
        row_blocks(full_zero_kernel, 2, [8, 128], [8, 128]),
        ErrorKind::Shape,
        "full_zero",
        &["non-empty shape without zero dimensions", "[8, 0]"],
    );
}

// ---------------------------------------------------------------------------------------------- concatenate

#[tpu_kernel]
fn concat_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load(); // [16, 256]
    let (l, r) = (a.slice((.., ..128)), a.slice((.., 128..)));
    // Lanes: the halves swapped; sublanes: the row blocks swapped (a tuple and an array of parts).
    let lanes = concatenate((r, l), 1);
    let rows = concatenate([a.slice((8.., ..)), a.slice((..8, ..))], -2);
    o.store(lanes * 2.0 + rows);
}

#[test]
fn concatenate_joins_lanes_and_sublanes() {
    let call = row_blocks(concat_kernel, 2, [16, 256], [16, 256]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    assert_eq!(mosaic.matches("tpu.concatenate").count(), 2, "{mosaic}");
    assert!(mosaic.contains("dimension = 1 : i32"), "{mosaic}");
    assert!(mosaic.contains("dimension = 0 : i32"), "{mosaic}");
    let (x, input) = f32_input([32, 256]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..32 * 256)
        .map(|i| {
            let (r, c) = (i / 256, i % 256);
            let (blk, rr) = (r / 16 * 16, r % 16);
            let lanes = x[r * 256 + (c + 128) % 256];
            let rows = x[(blk + (rr + 8) % 16) * 256 + c];
            lanes * 2.0 + rows
        })
        .map(f32::to_bits)
        .collect();
    assert_eq!(bits(&out[0]), want);
}

#[tpu_kernel]
fn concat_vec_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load(); // [8, 512]
    let mut parts = Vec::new();
    for k in unroll(0..4) {
        parts.push(a.slice((.., (3 - k) * 128..(4 - k) * 128)));
    }
    o.store(concatenate(parts, 1));
}

#[test]
fn concatenate_takes_a_vec_built_in_an_unrolled_loop() {
    let call = row_blocks(concat_vec_kernel, 1, [8, 512], [8, 512]).expect("builds");
    let (x, input) = f32_input([8, 512]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..8 * 512)
        .map(|i| {
            let (r, c) = (i / 512, i % 512);
            x[r * 512 + (3 - c / 128) * 128 + c % 128].to_bits()
        })
        .collect();
    assert_eq!(bits(&out[0]), want);
}

#[tpu_kernel]
fn concat_shape_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    let b = a.slice((..4, ..128));
    o.store(concatenate((a, b), 1)); // E:concat_shape
}

#[tpu_kernel]
fn concat_axis_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    o.store(concatenate((a, a), 2)); // E:concat_axis
}

#[tpu_kernel]
fn concat_major_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load().reshape([2, 4, 128]);
    let j = concatenate((a, a), 0); // E:concat_major
    o.store(j.reshape([8, 256]));
}

#[test]
fn concatenate_mistakes_name_the_line() {
    expect_err(
        row_blocks(concat_shape_kernel, 2, [8, 128], [8, 256]),
        ErrorKind::Shape,
        "concat_shape",
        &["part 1 has shape [4, 128], part 0 [8, 128]"],
    );
    expect_err(
        row_blocks(concat_axis_kernel, 2, [8, 128], [8, 256]),
        ErrorKind::Shape,
        "concat_axis",
        &["axis 2 is out of range for an array of rank 2"],
    );
    expect_err(
        row_blocks(concat_major_kernel, 2, [8, 128], [8, 256]),
        ErrorKind::Shape,
        "concat_major",
        &["last two axes", "got axis 0"],
    );
}

// ---------------------------------------------------------------------------------------------- roll

#[tpu_kernel]
fn roll_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load(); // [8, 256]
    let i = program_id(0);
    // A static lane shift, a traced sublane shift, a traced negative lane shift (taken mod n).
    o.store(roll(a, 3, 1) + roll(a, i + 1, 0) * 2.0 + roll(a, i - 5, -1) * 4.0);
}

#[test]
fn roll_rotates_as_jnp_roll() {
    let call = row_blocks(roll_kernel, 3, [8, 256], [8, 256]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    assert_eq!(mosaic.matches("tpu.dynamic_rotate").count(), 3, "{mosaic}");
    assert!(mosaic.contains("dimension = 0 : si32"), "{mosaic}");
    let (x, input) = f32_input([24, 256]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..24 * 256)
        .map(|k| {
            let (r, c) = (k / 256, k % 256);
            let (step, rr) = (r / 8, r % 8);
            let at = |rr: usize, c: usize| x[(step * 8 + rr) * 256 + c];
            let s1 = (step + 1) % 8;
            let s2 = (step as i64 - 5).rem_euclid(256) as usize;
            at(rr, (c + 256 - 3) % 256)
                + at((rr + 8 - s1) % 8, c) * 2.0
                + at(rr, (c + 256 - s2) % 256) * 4.0
        })
        .map(f32::to_bits)
        .collect();
    assert_eq!(bits(&out[0]), want);
}

#[tpu_kernel]
fn roll_negative_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(roll(x.load(), -1, 1)); // E:roll_negative
}

#[tpu_kernel]
fn roll_axis_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(roll(x.load(), 1, -3)); // E:roll_axis
}

#[tpu_kernel]
fn roll_bool_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    let m = roll(a > 0.0, 1, 1); // E:roll_bool
    o.store(select(m, a, 0.0));
}

#[tpu_kernel]
fn roll_bool_hint_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load();
    let m = roll((a > 0.0).cast::<i32>(), 1, 1) != 0;
    o.store(select(m, a, 0.0));
}

#[test]
fn roll_mistakes_name_the_line() {
    expect_err(
        row_blocks(roll_bool_kernel, 2, [8, 128], [8, 128]),
        ErrorKind::DType,
        "roll_bool",
        &["`roll` of a bool array", "mask.cast::<i32>()"],
    );
    // The hint builds, and rolls the mask.
    let call = row_blocks(roll_bool_hint_kernel, 1, [8, 128], [8, 128]).expect("the hint builds");
    let (x, input) = f32_input([8, 128]);
    let out = engines_agree(&call, &[input]);
    let want: Vec<u32> = (0..8 * 128)
        .map(|i| {
            let src = i / 128 * 128 + (i % 128 + 127) % 128;
            if x[src] > 0.0 {
                x[i]
            } else {
                0.0
            }
        })
        .map(f32::to_bits)
        .collect();
    assert_eq!(bits(&out[0]), want);
    expect_err(
        row_blocks(roll_negative_kernel, 2, [8, 128], [8, 128]),
        ErrorKind::Shape,
        "roll_negative",
        &["shift must be non-negative", "rolling by 127 is the same"],
    );
    expect_err(
        row_blocks(roll_axis_kernel, 2, [8, 128], [8, 128]),
        ErrorKind::Shape,
        "roll_axis",
        &["axis -3 is out of range"],
    );
}

// ---------------------------------------------------------------------------------------------- argmax

#[tpu_kernel]
fn argmax_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let a = x.load(); // [8, 256]
    let rows = a.argmax(1).reshape([8, 1]).broadcast_to([8, 256]);
    let cols = a.argmin(0).reshape([1, 256]).broadcast_to([8, 256]);
    o.store((rows * 1000 + cols).cast::<f32>());
}

/// jnp's rule on one line: the first extreme; the first NaN if there is one.
fn arg_ref(v: &[f32], max: bool) -> i32 {
    let mut best = 0;
    for i in 1..v.len() {
        if v[best].is_nan() {
            break;
        }
        if v[i].is_nan() || (max && v[i] > v[best]) || (!max && v[i] < v[best]) {
            best = i;
        }
    }
    best as i32
}

#[test]
fn argmax_and_argmin_take_the_first_extreme_and_the_first_nan() {
    let call = row_blocks(argmax_kernel, 2, [8, 256], [8, 256]).expect("builds");
    let mosaic = call.mosaic_mlir().expect("lowers");
    assert!(mosaic.contains("#tpu.reduction_kind<arg_max>"), "{mosaic}");
    assert!(mosaic.contains("#tpu.reduction_kind<arg_min>"), "{mosaic}");
    // Ties (the input repeats every 101 elements), ±0, ±inf and NaNs in some rows and columns.
    let (mut x, _) = f32_input([16, 256]);
    x[3 * 256 + 7] = f32::NAN;
    x[3 * 256 + 9] = f32::INFINITY;
    x[5 * 256 + 40] = f32::NAN;
    x[5 * 256 + 41] = f32::NAN;
    x[12 * 256 + 200] = f32::NEG_INFINITY;
    x[9 * 256] = -0.0;
    x[9 * 256 + 1] = 0.0;
    let input = HostArray::from_vec([16, 256], x.clone()).unwrap();
    let out = engines_agree(&call, &[input]);
    let mut want = Vec::with_capacity(16 * 256);
    for r in 0..16 {
        let blk = r / 8 * 8;
        let row = &x[r * 256..(r + 1) * 256];
        for c in 0..256 {
            let col: Vec<f32> = (0..8).map(|k| x[(blk + k) * 256 + c]).collect();
            let v = arg_ref(row, true) * 1000 + arg_ref(&col, false);
            want.push((v as f32).to_bits());
        }
    }
    assert_eq!(bits(&out[0]), want);
    // The NaN rows pick their first NaN; a column's -inf is its minimum.
    let o = out[0].as_slice::<f32>().unwrap();
    assert_eq!(o[3 * 256] as i32 / 1000, 7);
    assert_eq!(o[5 * 256] as i32 / 1000, 40);
    assert_eq!(o[12 * 256 + 200] as i32 % 1000, 4);
}

#[tpu_kernel]
fn argmax_rank1_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let v = x.load().max(0); // [128]
    let i = v.argmax(0); // E:argmax_rank1
    o.store(i.cast::<f32>().reshape([1, 1]).broadcast_to([8, 128]));
}

#[test]
fn argmax_mistakes_name_the_line() {
    expect_err(
        row_blocks(argmax_rank1_kernel, 2, [8, 128], [8, 128]),
        ErrorKind::Shape,
        "argmax_rank1",
        &["rank-1 array", "reshape to `[1, n]`"],
    );
}

// ---------------------------------------------------------------------------------------------- toolchain

/// The kernel of each construct as `python/tests/test_values.py` compiles it beside its Pallas twin
/// (same shapes, grid and blocks): name → launch.
fn construct_kernels() -> Vec<(&'static str, PallasCall)> {
    let built = |name, r: Result<PallasCall, KernelError>| {
        (name, r.unwrap_or_else(|e| panic!("{name} builds: {e}")))
    };
    vec![
        built(
            "select_scalar",
            row_blocks(select_scalar_kernel, 4, [8, 128], [8, 128]),
        ),
        built(
            "full_scalar",
            row_blocks(full_scalar_kernel, 3, [8, 128], [8, 128]),
        ),
        built(
            "concatenate",
            row_blocks(concat_kernel, 2, [16, 256], [16, 256]),
        ),
        built("roll", row_blocks(roll_kernel, 3, [8, 256], [8, 256])),
        built("argmax", row_blocks(argmax_kernel, 2, [8, 256], [8, 256])),
    ]
}

/// With `TPU_KERNEL_VALUES_OUT=DIR` (and `TPU_KERNEL_VALUES_TARGET=<generation>`): each construct's
/// kernel, built for that target, as `DIR/<name>.stablehlo.mlir` for libtpu.
#[test]
#[ignore = "run by python/tests/test_values.py"]
fn export_construct_kernels() {
    use tpu_kernel::runtime::serialize::CustomCall;
    let dir = std::path::PathBuf::from(
        std::env::var("TPU_KERNEL_VALUES_OUT").expect("set TPU_KERNEL_VALUES_OUT"),
    );
    let target = std::env::var("TPU_KERNEL_VALUES_TARGET")
        .map(|t| Target::parse(&t).expect("TPU_KERNEL_VALUES_TARGET"))
        .unwrap_or_default();
    std::fs::create_dir_all(&dir).expect("create the output directory");
    for (name, call) in target.scope(construct_kernels) {
        let hlo = CustomCall::new(call.ir()).stablehlo().expect("StableHLO");
        std::fs::write(dir.join(format!("{name}.stablehlo.mlir")), hlo).expect("write");
    }
}

#[test]
fn every_construct_kernel_builds_for_every_generation() {
    for target in [Target::V5e, Target::V6e, Target::Tpu7x] {
        let calls = target.scope(construct_kernels);
        assert_eq!(calls.len(), 5);
        for (name, call) in calls {
            assert_eq!(call.ir().target, target, "{name}");
        }
    }
}
