//! Mosaic on CPU: the Mosaic module we ship, JIT-compiled and run on the CPU (`mosaic_cpu`), must agree
//! with the interpreter — for every example, for the language constructs and grid/dtype semantics the
//! interpreter and DSL suites exercise, and for random launches — and a module with a wrong lowering
//! (mutated ops and attributes) must not.
//!
//! Tolerances: integers and bools exact. Every elementwise op gives the same bits in both engines
//! (`every_float_op_gives_the_same_bits_in_both_engines`: both compute the transcendentals with the
//! vector math, `kernel-math`); what remains is summation order — the interpreter sums rows in 16
//! lanes and a pairwise tree, the engine in order —, so f32 `atol 1e-5 + rtol 1e-5`, and bf16 one
//! rounding step (`atol 1e-2 + rtol 2^-7`: an f32 sum that differs in its last bit can round to the
//! neighbouring bf16).
//!
//! The kernels of `dsl.rs` and `interpret.rs` are declared again here (same bodies and launches) so that
//! this suite adds no code to those files.

mod common;

use common::kernels::*;

use tpu_kernel::dtype::{Float, Signed};
use tpu_kernel::prelude::*;
use tpu_kernel::reference::{self, Tolerance};
use tpu_kernel::runtime::interpret::{HostArray, HostElement, InterpretOptions};
use tpu_kernel::runtime::ir::{Accepts, BinaryOp, UnaryOp};
use tpu_kernel::runtime::mosaic::{MBlock, MModule, MOp, MType};
use tpu_kernel::runtime::mosaic_cpu;
use tpu_kernel::ErrorKind;

// ---------------------------------------------------------------------------------------------- helpers

fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance {
            atol: 1e-5,
            rtol: 1e-5,
        },
        DType::BF16 => Tolerance {
            atol: 1e-2,
            rtol: 1.0 / 128.0,
        },
        _ => Tolerance::EXACT,
    }
}

/// Whether two runs' outputs agree within the per-dtype tolerance; the worst error per output.
fn compare(got: &[HostArray], want: &[HostArray]) -> (bool, Vec<f64>) {
    let mut ok = got.len() == want.len();
    let mut worst = Vec::new();
    for (g, w) in got.iter().zip(want) {
        let c = reference::compare(g, w, tolerance(w.dtype()));
        ok &= c.ok && g.dtype() == w.dtype();
        worst.push(c.max_abs_error);
    }
    (ok, worst)
}

/// The interpreter run the engine is compared with: its grid in order on one core, as `mosaic_cpu` runs
/// it. (By default the interpreter gives each chunk of `parallel` axes its own scratch, like a
/// megacore; for a kernel that is correct either way — the interpreter's tests hold it to the same
/// bits — this changes nothing, but a kernel that never initializes its scratch, like
/// `matmul_no_init_kernel` below, depends on it.)
fn interpret(call: &PallasCall, inputs: &[HostArray]) -> Vec<HostArray> {
    let sequential = InterpretOptions {
        parallel: false,
        ..InterpretOptions::default()
    };
    call.interpret_with(inputs, &sequential)
        .unwrap_or_else(|e| panic!("{}: interpret: {e}", call.name()))
}

/// Run `call` on `inputs` through the interpreter and through its Mosaic module; panic unless they agree.
fn agree(call: &PallasCall, inputs: &[HostArray]) {
    let want = interpret(call, inputs);
    let compiled =
        mosaic_cpu::compile(call.ir()).unwrap_or_else(|e| panic!("{}: compile: {e}", call.name()));
    let got = compiled
        .run(inputs)
        .unwrap_or_else(|e| panic!("{}: mosaic_cpu: {e}", call.name()));
    let (ok, worst) = compare(&got, &want);
    let worst: Vec<String> = worst.iter().map(|w| format!("{w:.1e}")).collect();
    println!(
        "{:<28} compile {:>7.1} ms   max |error| per output [{}]",
        call.name(),
        compiled.compile_time().as_secs_f64() * 1e3,
        worst.join(", ")
    );
    assert!(
        ok,
        "{}: mosaic_cpu disagrees with the interpreter (max errors {worst:?})",
        call.name()
    );
}

fn agree_random(call: &PallasCall, seed: u64) {
    agree(call, &reference::random_inputs(call, seed));
}

fn f32s(shape: [usize; 2], f: impl Fn(usize) -> f32) -> HostArray {
    HostArray::from_vec(shape, (0..shape[0] * shape[1]).map(f).collect::<Vec<_>>()).unwrap()
}

fn i32s(shape: [usize; 2], f: impl Fn(usize) -> i32) -> HostArray {
    HostArray::from_vec(shape, (0..shape[0] * shape[1]).map(f).collect::<Vec<_>>()).unwrap()
}

fn at<const R: usize>(shape: [usize; R], dtype: DType) -> ArrayType {
    ArrayType::new(shape, dtype)
}

// ---------------------------------------------------------------------------------------------- examples

#[test]
fn every_example_agrees_with_the_interpreter() {
    for (name, build) in common::EXAMPLES {
        let call = build().unwrap_or_else(|e| panic!("{name}: {e}"));
        agree_random(&call, 3);
    }
}

// ---------------------------------------------------------------------------------------------- math

// Both engines compute every float op of the op table with the same functions (the vector math,
// `kernel-math`: the interpreter through the table, the engine by calling it from the JIT'd code, or
// IEEE arithmetic itself), so they must give the same bits on every input.

/// `op` on `x` as a kernel traces it, `None` for an op without a float meaning. An exhaustive match:
/// a new row of the op table does not compile here until this test covers it.
fn unary_op<T: Float + Signed>(op: UnaryOp, x: Array<T>) -> Option<Array<T>> {
    Some(match op {
        UnaryOp::Neg => -x,
        UnaryOp::Not => return None,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.log(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Rsqrt => x.rsqrt(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Erf => x.erf(),
        UnaryOp::Log1p => x.log1p(),
        UnaryOp::Logistic => x.logistic(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round(),
    })
}

/// `op` on `x` and `y` as a kernel traces it (as [`unary_op`]).
fn binary_op<T: Float>(op: BinaryOp, x: Array<T>, y: Array<T>) -> Option<Array<T>> {
    Some(match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Max => maximum(x, y),
        BinaryOp::Min => minimum(x, y),
        BinaryOp::Pow => pow(x, y),
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Shl | BinaryOp::Shr => {
            return None
        }
    })
}

/// The special inputs: signed zeros and infinities, NaNs (quiet, negative, with a payload, signaling),
/// subnormals, the extremes, and the edges of the functions' ranges and reductions.
fn special_f32s() -> Vec<f32> {
    let bits = f32::from_bits;
    vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        bits(0xFFC0_0000),
        bits(0x7FC0_1234),
        bits(0x7F80_0001),
        bits(1),
        bits(0x8000_0001),
        bits(0x007F_FFFF),
        bits(0x8040_0000),
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        f32::EPSILON,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        3.0,
        -3.0,
        0.999_999_94,
        1.000_000_1,
        -0.999_999_94,
        -1.000_000_1,
        1e-30,
        -1e-38,
        1e30,
        -3e38,
        88.72,
        89.0,
        -87.34,
        -103.9,
        -104.0,
        9.02,
        -10.0,
        3.99,
        0.625,
        std::f32::consts::FRAC_PI_2,
        std::f32::consts::PI,
        -std::f32::consts::PI,
        131_072.0,
        131_073.0,
        1e20,
        12_345_679.0,
        16_777_216.0,
        -16_777_217.0,
        0.333_333_34,
        2.5,
        -40.5,
        150.0,
        -150.0,
        7.25,
    ]
}

/// `n` inputs of each kind from `rng`: any bit pattern (every exponent, NaN payloads), moderate values
/// where the functions bend (|x| < 12), and magnitudes over many decades.
fn random_f32s(rng: &mut common::rng::Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let r = rng.next();
            match i % 3 {
                0 => f32::from_bits(r as u32),
                1 => (r >> 40) as f32 / (1u64 << 24) as f32 * 24.0 - 12.0,
                _ => {
                    let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
                    sign * 10f32.powf((r >> 40) as f32 / (1u64 << 24) as f32 * 60.0 - 30.0)
                }
            }
        })
        .collect()
}

/// An element type of the test: f32 or bf16.
trait Elem: Float + Signed + HostElement + Copy {
    fn of(x: f32) -> Self;
    /// Half the bits of a random `u32` (all of them for f32).
    fn of_bits(r: u32) -> Self;
    fn bits(self) -> u32;
    fn value(self) -> f32;
}

impl Elem for f32 {
    fn of(x: f32) -> f32 {
        x
    }
    fn of_bits(r: u32) -> f32 {
        f32::from_bits(r)
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
    fn value(self) -> f32 {
        self
    }
}

impl Elem for bf16 {
    fn of(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    fn of_bits(r: u32) -> bf16 {
        bf16::from_bits((r >> 16) as u16)
    }
    fn bits(self) -> u32 {
        self.to_bits().into()
    }
    fn value(self) -> f32 {
        self.to_f32()
    }
}

/// Every output element of `call` whose bits differ between the engines, described (its inputs and
/// both results, values and bits).
fn disagreements<T: Elem>(call: &PallasCall, inputs: &[HostArray]) -> Vec<String> {
    let want = interpret(call, inputs);
    let got = mosaic_cpu::run(call.ir(), inputs)
        .unwrap_or_else(|e| panic!("{}: mosaic_cpu: {e}", call.name()));
    let slice = |a: &HostArray| a.as_slice::<T>().expect("dtype").to_vec();
    let (g, w) = (slice(&got[0]), slice(&want[0]));
    let args: Vec<Vec<T>> = inputs.iter().map(slice).collect();
    let show = |v: T| format!("{:e} ({:#x})", v.value(), v.bits());
    (0..w.len())
        .filter(|&i| g[i].bits() != w[i].bits())
        .map(|i| {
            let at: Vec<String> = args.iter().map(|a| show(a[i])).collect();
            format!(
                "{}({}): engine {}, interpreter {}",
                call.name(),
                at.join(", "),
                show(g[i]),
                show(w[i])
            )
        })
        .collect()
}

/// Every float op of the table on `T`: unary ops on the specials and `random` random inputs, binary
/// ops on every pair of specials and `random` random pairs. Returns the ops and inputs run, and every
/// disagreement.
fn every_float_op<T: Elem>(random: usize) -> (Vec<String>, usize, Vec<String>) {
    let dtype = T::DTYPE;
    let mut rng = common::rng::Rng(0x5EED_0000 + dtype.size_bytes() as u64);
    let specials: Vec<T> = special_f32s().into_iter().map(T::of).collect();
    let (mut ran, mut inputs, mut bad) = (Vec::new(), 0, Vec::new());
    let array = |v: &[T]| HostArray::from_vec([1, v.len()], v.to_vec()).expect("array");
    let spec = |n: usize| BlockSpec::new([1, n], |[_]| (0, 0));
    for &op in UnaryOp::ALL {
        if !op.operands().accepts(dtype) {
            continue;
        }
        let mut xs = specials.clone();
        xs.extend(random_f32s(&mut rng, random).into_iter().map(T::of));
        xs.extend((0..random).map(|_| T::of_bits(rng.next() as u32)));
        let n = xs.len();
        let call = pallas_call(move |x: Ref<T>, o: RefMut<T>| {
            o.store(unary_op(op, x.load()).expect("a float op"));
        })
        .name(format!("{}_{}", op.name(), dtype))
        .grid([1])
        .input(at([1, n], dtype), spec(n))
        .output(at([1, n], dtype), spec(n))
        .build()
        .unwrap_or_else(|e| panic!("{op:?} on {}: {e}", dtype));
        bad.extend(disagreements::<T>(&call, &[array(&xs)]));
        ran.push(call.name().to_string());
        inputs += n;
    }
    for &op in BinaryOp::ALL {
        if !op.operands().accepts(dtype) {
            continue;
        }
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for &x in &specials {
            for &y in &specials {
                xs.push(x);
                ys.push(y);
            }
        }
        for (x, y) in random_f32s(&mut rng, random)
            .into_iter()
            .zip(random_f32s(&mut rng, random))
        {
            xs.push(T::of(x));
            ys.push(T::of(y));
        }
        for _ in 0..random {
            xs.push(T::of_bits(rng.next() as u32));
            ys.push(T::of_bits(rng.next() as u32));
        }
        let n = xs.len();
        let call = pallas_call(move |x: Ref<T>, y: Ref<T>, o: RefMut<T>| {
            o.store(binary_op(op, x.load(), y.load()).expect("a float op"));
        })
        .name(format!("{}_{}", op.name(), dtype))
        .grid([1])
        .input(at([1, n], dtype), spec(n))
        .input(at([1, n], dtype), spec(n))
        .output(at([1, n], dtype), spec(n))
        .build()
        .unwrap_or_else(|e| panic!("{op:?} on {}: {e}", dtype));
        bad.extend(disagreements::<T>(&call, &[array(&xs), array(&ys)]));
        ran.push(call.name().to_string());
        inputs += n;
    }
    (ran, inputs, bad)
}

#[test]
fn every_float_op_gives_the_same_bits_in_both_engines() {
    let (mut ran, mut inputs, mut bad) = every_float_op::<f32>(4096);
    let (r, i, b) = every_float_op::<bf16>(4096);
    ran.extend(r);
    inputs += i;
    bad.extend(b);
    println!("{} kernels, {inputs} inputs: {}", ran.len(), ran.join(" "));
    // Every float op of the table, on both dtypes.
    let float_ops = UnaryOp::ALL
        .iter()
        .filter(|u| u.operands().has_float())
        .count()
        + BinaryOp::ALL
            .iter()
            .filter(|b| b.operands().has_float())
            .count();
    assert_eq!(ran.len(), 2 * float_ops, "ran {ran:?}");
    // Per kernel: how many elements differ, and the first three.
    let mut per_kernel: Vec<(&str, usize)> = Vec::new();
    let mut first = Vec::new();
    for b in &bad {
        let name = b.split('(').next().unwrap_or_default();
        match per_kernel.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => {
                *c += 1;
                if *c <= 3 {
                    first.push(b.as_str());
                }
            }
            None => {
                per_kernel.push((name, 1));
                first.push(b.as_str());
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} elements differ ({per_kernel:?}); the first of each:\n  {}",
        bad.len(),
        first.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------------- the DSL's constructs (dsl.rs)

#[tpu_kernel]
fn helper_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(softplus(softplus(x.load())));
}

#[kernel_fn]
fn softplus(x: Array<f32>) -> Array<f32> {
    (x.exp() + 1.0).log()
}

#[test]
fn the_language_constructs_agree() {
    let one = || BlockSpec::new([8, 128], |[_]| (0, 0));
    let f = || at([8, 128], F32);
    let helper = pallas_call(helper_kernel)
        .grid([1])
        .input(f(), one())
        .output(f(), one())
        .build()
        .expect("build");
    agree_random(&helper, 1);

    let rows = || BlockSpec::new([8, 128], |[i]| (i, 0));
    let control = pallas_call(control_flow_kernel)
        .grid([3])
        .input(at([24, 128], F32), rows())
        .output(at([24, 128], F32), rows())
        .build()
        .expect("build");
    agree_random(&control, 2);

    let squeezed = pallas_call(squeezed_kernel)
        .grid([4])
        .input(
            at([4, 8, 128], F32),
            BlockSpec::new([1, 8, 128], |[i]| (i, 0, 0)).squeeze(0),
        )
        .output(at([32, 128], F32), rows())
        .build()
        .expect("build");
    agree_random(&squeezed, 3);

    let halves = || BlockSpec::new([16, 128], |[_]| (0, 0));
    let windows = pallas_call(window_kernel)
        .grid([1])
        .input(at([16, 128], F32), halves())
        .output(at([16, 128], F32), halves())
        .build()
        .expect("build");
    agree_random(&windows, 4);

    let mixed = pallas_call(mixed_dtype_kernel)
        .grid([1])
        .input(at([8, 128], BF16), one())
        .input(at([8, 128], I32), one())
        .output(at([8, 128], F32), one())
        .output(at([8, 128], I32), one())
        .build()
        .expect("build");
    agree_random(&mixed, 5);
}

// ---------------------------------------------------------------------------------------------- dtype semantics (interpret.rs)

#[tpu_kernel]
fn saturating_cast_kernel(x: Ref<f32>, i: RefMut<i32>, u: RefMut<u8>, b: RefMut<bf16>) {
    let v = x.load();
    i.store(v.cast::<i32>());
    u.store(v.cast::<u8>());
    b.store(v.cast::<bf16>());
}

#[tpu_kernel]
fn int_to_bf16_kernel(x: Ref<i32>, y: Ref<u32>, a: RefMut<bf16>, b: RefMut<bf16>) {
    a.store(x.load().cast::<bf16>());
    b.store(y.load().cast::<bf16>());
}

#[test]
fn dtype_semantics_agree_bit_for_bit_where_they_are_exact() {
    let one = || BlockSpec::new([8, 128], |[_]| (0, 0));
    let shape = [8, 128];
    // bf16: rounding on every op, ties to even, NaN.
    let chain = pallas_call(bf16_chain_kernel)
        .grid([1])
        .input(at(shape, F32), one())
        .output(at(shape, F32), one())
        .build()
        .expect("build");
    agree_random(&chain, 4);
    let ties = f32s(shape, |i| {
        if i == 0 {
            f32::NAN
        } else {
            f32::from_bits(0x3F80_8000 + ((i as u32 % 2) << 16))
        }
    });
    let exact = |call: &PallasCall, inputs: &[HostArray]| {
        let want = interpret(call, inputs);
        let got = mosaic_cpu::run(call.ir(), inputs).expect("mosaic_cpu");
        for (g, w) in got.iter().zip(&want) {
            let bits = |a: &HostArray| {
                a.to_f64_vec()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(g), bits(w), "{}", call.name());
        }
    };
    exact(&chain, &[ties]);

    // Integers wrap; division by zero and MIN / -1 give XLA's results (the engine's guards).
    let arr = || at(shape, I32);
    let ints = pallas_call(int_kernel)
        .grid([1])
        .input(arr(), one())
        .input(arr(), one())
        .output(arr(), one())
        .output(arr(), one())
        .output(arr(), one())
        .build()
        .expect("build");
    let xs = i32s(shape, |i| [i32::MAX, i32::MIN, -7, 7, 40000][i % 5]);
    let ys = i32s(shape, |i| [0, -1, 2, 0, 3, -2, 1][i % 7]);
    exact(&ints, &[xs, ys]);

    // NaN and infinities: max/min propagate NaN, `!=` is unordered, exp overflows and underflows.
    let nans = pallas_call(nan_kernel)
        .grid([1])
        .input(at(shape, F32), one())
        .output(at(shape, F32), one())
        .output(at(shape, F32), one())
        .output(at(shape, I32), one())
        .output(at(shape, F32), one())
        .build()
        .expect("build");
    let x = f32s(shape, |i| match i {
        3 => f32::NAN,
        133 => f32::INFINITY,
        263 => f32::NEG_INFINITY,
        393 => 100.0,
        _ => (i % 128) as f32 / 64.0 - 1.0,
    });
    agree(&nans, &[x]);

    // float → int saturates, NaN → 0 (the engine's guards for fptosi/fptoui).
    let casts = pallas_call(saturating_cast_kernel)
        .grid([1])
        .input(at(shape, F32), one())
        .output(at(shape, I32), one())
        .output(at(shape, U8), one())
        .output(at(shape, BF16), one())
        .build()
        .expect("build");
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        3e9,
        -3e9,
        300.0,
        -0.7,
        -1.0,
        255.9,
        2.5,
    ];
    let x = f32s(shape, |i| {
        specials
            .get(i)
            .copied()
            .unwrap_or((i as f32 - 500.0) * 0.37)
    });
    exact(&casts, &[x]);

    // int → bf16 rounds once from the integer (through f32 it would round twice above 2^24:
    // 2^24 + 2^16 + 1 is past a bf16 tie, its f32 on it).
    let to_bf16 = pallas_call(int_to_bf16_kernel)
        .grid([1])
        .input(at(shape, I32), one())
        .input(at(shape, U32), one())
        .output(at(shape, BF16), one())
        .output(at(shape, BF16), one())
        .build()
        .expect("build");
    let mut rng = common::rng::Rng(11);
    let near_ties = |i: usize, r: u64| {
        let base = [
            16_842_753i64,
            33_685_505,
            25_165_824 + 65_537,
            1 << 30,
            7,
            0,
        ][i % 6];
        base + (r % 5) as i64 - 2
    };
    let xs = HostArray::from_vec(
        shape,
        (0..shape[0] * shape[1])
            .map(|i| {
                let v = near_ties(i, rng.next());
                match i % 4 {
                    0 => -v as i32,
                    1 => v as i32,
                    2 => rng.next() as i32,
                    _ => [i32::MIN, i32::MAX, -1, 1][i / 4 % 4],
                }
            })
            .collect::<Vec<i32>>(),
    )
    .expect("array");
    let ys = HostArray::from_vec(
        shape,
        (0..shape[0] * shape[1])
            .map(|i| match i % 3 {
                0 => near_ties(i, rng.next()) as u32,
                1 => rng.next() as u32,
                _ => [u32::MAX, 0, 1 << 31, 4_278_190_081][i / 3 % 4],
            })
            .collect::<Vec<u32>>(),
    )
    .expect("array");
    exact(&to_bf16, &[xs, ys]);
}

// ---------------------------------------------------------------------------------------------- grid semantics (interpret.rs)

#[test]
fn grid_semantics_agree() {
    // Edge blocks run past the array: padded on the way in, clipped on the way out.
    let edge = || BlockSpec::new([128, 128], |[i, j]| [i, j]);
    let call = pallas_call(add_edge_kernel)
        .grid([3, 2])
        .input(at([300, 200], F32), edge())
        .input(at([300, 200], F32), edge())
        .output(at([300, 200], F32), edge())
        .dimension_semantics([Parallel, Parallel])
        .build()
        .expect("build");
    agree_random(&call, 9);

    // Scratch persists along the reduction axis; output blocks revisited keep their contents.
    let (m, n, k, b) = (256, 256, 256, 128);
    let call = pallas_call(matmul_no_init_kernel)
        .grid([m / b, n / b, k / b])
        .input(at([m, k], BF16), BlockSpec::new([b, b], |[i, _, k]| [i, k]))
        .input(at([k, n], BF16), BlockSpec::new([b, b], |[_, j, k]| [k, j]))
        .output(at([m, n], BF16), BlockSpec::new([b, b], |[i, j, _]| [i, j]))
        .scratch(Vmem::new([b, b], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .build()
        .expect("build");
    agree_random(&call, 5);

    // Rows never stored read as zeros in both.
    let whole = || BlockSpec::new([16, 128], |[_]| (0, 0));
    let call = pallas_call(half_store_kernel)
        .grid([1])
        .input(at([16, 128], I32), whole())
        .output(at([16, 128], I32), whole())
        .build()
        .expect("build");
    agree_random(&call, 1);

    let tiles = || BlockSpec::new([64, 128], |[i, j]| [i, j]);
    let call = pallas_call(column_block_id_kernel)
        .grid([4, 4])
        .input(at([256, 512], F32), tiles())
        .output(at([256, 512], F32), tiles())
        .dimension_semantics([Parallel, Parallel])
        .build()
        .expect("build");
    agree_random(&call, 2);

    let row_spec = || BlockSpec::new([8, 256], |[i]| (i, 0));
    let call = pallas_call(block_column_sum_kernel)
        .grid([16])
        .input(at([128, 256], F32), row_spec())
        .output(at([128, 256], F32), row_spec())
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    agree_random(&call, 21);

    let call = pallas_call(step_count_kernel)
        .grid([3, 4])
        .output(
            at([24, 128], I32),
            BlockSpec::new([8, 128], |[i, _]| (i, 0)),
        )
        .scratch(Vmem::new([8, 128], I32))
        .dimension_semantics([Arbitrary, Arbitrary])
        .build()
        .expect("build");
    agree(&call, &[]);

    let call = pallas_call(shared_out_kernel)
        .grid([8])
        .input(at([64, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(at([8, 128], F32), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    agree_random(&call, 8);

    let call = pallas_call(read_between_kernel)
        .grid([3])
        .input(at([24, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(at([8, 128], F32), BlockSpec::new([8, 128], |[_]| (0, 0)))
        .output(at([24, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .dimension_semantics([Arbitrary])
        .build()
        .expect("build");
    agree_random(&call, 12);

    // Rows of 203 (not a multiple of any vector width) with NaN, ±inf and subnormal exps.
    let n = 203;
    let spec = || BlockSpec::new([8, n], |[i]| (i, 0));
    let call = pallas_call(exp_sum_kernel)
        .grid([3])
        .input(at([24, n], F32), spec())
        .output(at([24, n], F32), spec())
        .output(at([24, n], F32), spec())
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    let mut xs = HostArray::random([24, n], F32, 31)
        .unwrap()
        .into_vec::<f32>()
        .unwrap();
    for (i, x) in xs.iter_mut().enumerate() {
        *x *= 120.0;
        if i % 97 == 3 {
            *x = -90.0;
        }
    }
    xs[n + 5] = f32::NAN;
    xs[2 * n + 1] = f32::NEG_INFINITY;
    xs[3 * n + 7] = f32::INFINITY;
    agree(&call, &[HostArray::from_vec([24, n], xs).unwrap()]);

    let spec = || BlockSpec::new([8, 200], |[i]| (i, 0));
    let call = pallas_call(fused_reductions_kernel)
        .grid([2])
        .input(at([16, 200], F32), spec())
        .output(at([16, 200], F32), spec())
        .output(at([16, 200], F32), spec())
        .output(at([16, 200], BF16), spec())
        .dimension_semantics([Parallel])
        .build()
        .expect("build");
    let mut xs = HostArray::random([16, 200], F32, 21)
        .unwrap()
        .into_vec::<f32>()
        .unwrap();
    xs[5] = f32::NAN;
    xs[207] = -0.0;
    agree(&call, &[HostArray::from_vec([16, 200], xs).unwrap()]);

    let spec = || BlockSpec::new([32, 128], |[i, j]| [i, j]);
    let call = pallas_call(mixed_elementwise_kernel)
        .grid([8, 3])
        .input(at([256, 384], F32), spec())
        .input(at([256, 384], I32), spec())
        .output(at([256, 384], BF16), spec())
        .output(at([256, 384], I32), spec())
        .dimension_semantics([Parallel, Arbitrary])
        .build()
        .expect("build");
    let y = i32s([256, 384], |i| (i % 5) as i32 - 2);
    agree(&call, &[HostArray::random([256, 384], F32, 5).unwrap(), y]);
}

// ---------------------------------------------------------------------------------------------- scalar prefetch and SMEM (memory_spaces.rs)

#[test]
fn scalar_prefetch_and_smem_scratch_agree() {
    // A 2-D table read by an index map (the block) and by the body (the scale).
    let call = table_call().expect("build");
    agree_random(&call, 4);
    let tables = HostArray::from_vec([3, 2], vec![3, 2, 0, -1, 3, 5]).unwrap();
    agree(
        &call,
        &[tables, HostArray::random([32, 128], F32, 4).unwrap()],
    );
    // A prefetched length bounds a loop and picks a branch (every length, 0 included).
    let call = lengths_call().expect("build");
    let lens = HostArray::from_vec([3], vec![2, 0, 4]).unwrap();
    agree(
        &call,
        &[lens, HostArray::random([24, 512], F32, 5).unwrap()],
    );
    // An SMEM scratch cell counts the steps, persisting across them.
    let call = counter_call().expect("build");
    agree_random(&call, 6);
}

/// The interpreter's and the engine's errors for the same launch.
fn both_errors(call: &PallasCall, inputs: &[HostArray]) -> [KernelError; 2] {
    let sequential = InterpretOptions {
        parallel: false,
        ..InterpretOptions::default()
    };
    let theirs = call
        .interpret_with(inputs, &sequential)
        .expect_err("the interpreter fails");
    let ours = mosaic_cpu::run(call.ir(), inputs).expect_err("mosaic_cpu fails");
    [theirs, ours]
}

#[test]
fn an_out_of_range_block_from_the_table_is_the_same_error_in_both_engines() {
    let zeros = || HostArray::zeros([32, 128], F32).unwrap();
    // Block 4 of a 4-block array, at grid point [1]: the interpreter's check and message.
    let call = table_call().expect("build");
    let tables = HostArray::from_vec([3, 2], vec![0, 1, 4, 1, 0, 1]).unwrap();
    let [theirs, ours] = both_errors(&call, &[tables, zeros()]);
    assert_eq!(ours.kind, ErrorKind::OutOfBounds, "{ours}");
    assert_eq!(ours.to_string(), theirs.to_string());
    assert_eq!(ours.argument, theirs.argument);
    assert!(
        ours.message.contains("grid point [1]") && ours.message.contains("block [4, 0]"),
        "{ours}"
    );
    // A negative block number too.
    let tables = HostArray::from_vec([3, 2], vec![0, 1, 1, 1, -1, 1]).unwrap();
    let [theirs, ours] = both_errors(&call, &[tables, zeros()]);
    assert_eq!(ours.kind, ErrorKind::OutOfBounds, "{ours}");
    assert_eq!(ours.to_string(), theirs.to_string());
    // The example: a gather from block 8 of 8.
    let call = common::gather_prefetch::build().expect("build");
    let idx = HostArray::from_vec([4], vec![7, 0, 8, 1]).unwrap();
    let [theirs, ours] = both_errors(&call, &[idx, HostArray::zeros([64, 256], F32).unwrap()]);
    assert_eq!(ours.kind, ErrorKind::OutOfBounds, "{ours}");
    assert_eq!(ours.to_string(), theirs.to_string());
    assert_eq!(ours.argument.as_deref(), Some("input 1"), "{ours}");
}

#[test]
fn a_page_number_out_of_range_is_the_same_error_in_both_engines() {
    // paged_gather: sequence 2's sixth page is page 64 of 64. It is first touched as the next page
    // (p + 1) started while page 4 is added: the error is at that DMA's line of the example.
    let call = common::paged_gather::build().expect("build");
    let mut table: Vec<i32> = (0..64).collect();
    table[2 * 8 + 5] = 64;
    let table = HostArray::from_vec([8, 8], table).unwrap();
    let [theirs, ours] = both_errors(
        &call,
        &[table, HostArray::zeros([64, 16, 128], F32).unwrap()],
    );
    assert_eq!(ours.kind, ErrorKind::OutOfBounds, "{ours}");
    assert_eq!(ours.to_string(), theirs.to_string());
    assert!(ours.message.contains("64..65 along dimension 0"), "{ours}");
    let start_next = include_str!("../examples/paged_gather.rs")
        .lines()
        .position(|l| l.contains("async_copy(pages.at(page), buf.at(next), sems.at(next)).start()"))
        .expect("the example starts the next page's copy")
        + 1;
    let loc = ours.location.expect("located");
    assert!(loc.file.ends_with("paged_gather.rs"), "{ours}");
    assert_eq!(loc.line as usize, start_next, "{ours}");
}

#[test]
fn an_index_map_reading_past_its_table_is_an_error_at_the_same_line_in_both_engines() {
    // Grid step 2 reads row 2 of a 2-row table.
    let call = pallas_call(table_kernel)
        .grid([3])
        .scalar_prefetch(at([2, 2], I32))
        .input(
            at([32, 128], F32),
            BlockSpec::with_prefetch([8, 128], |[b], [t]| (t.at((b, 0)).load(), 0)), // OOB-TABLE
        )
        .output(at([24, 128], F32), BlockSpec::new([8, 128], |[b]| (b, 0)))
        .build()
        .expect("build");
    let tables = HostArray::from_vec([2, 2], vec![0, 1, 1, 1]).unwrap();
    let [theirs, ours] = both_errors(&call, &[tables, HostArray::zeros([32, 128], F32).unwrap()]);
    assert_eq!(ours.kind, ErrorKind::OutOfBounds, "{ours}");
    assert_eq!(
        ours.location.map(|l| l.line),
        Some(marked_line("OOB-TABLE")),
        "{ours}"
    );
    // The operand whose index map failed, as in the interpreter.
    assert_eq!(ours.argument.as_deref(), Some("input 1"), "{ours}");
    assert!(ours.message.contains("element [2, 0]"), "{ours}");
    assert_eq!(ours.to_string(), theirs.to_string());
}

#[tpu_kernel]
fn smem_oob_kernel(lens: Ref<i32, Smem>, x: Ref<f32>, o: RefMut<f32>, cell: RefMut<i32, Smem>) {
    let i = program_id(0);
    cell.at(i).store(i); // OOB-SMEM-STORE
    let n = lens.at(i + 1).load(); // OOB-SMEM-LOAD
    o.store(x.load() * n.cast::<f32>());
}

#[test]
fn out_of_bounds_smem_accesses_are_errors_at_the_same_line_in_both_engines() {
    let smem_oob = |lens: usize, cells: usize| {
        pallas_call(smem_oob_kernel)
            .grid([3])
            .scalar_prefetch(at([lens], I32))
            .input(at([24, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
            .output(at([24, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
            .scratch(Smem::new([cells], I32))
            .build()
            .expect("build")
    };
    // In bounds (a 4-entry table, 3 cells): they agree.
    let call = smem_oob(4, 3);
    let lens = HostArray::from_vec([4], vec![3, -2, 5, 7]).unwrap();
    agree(
        &call,
        &[lens, HostArray::random([24, 128], F32, 3).unwrap()],
    );
    // Step 2 reads entry 3 of a 3-entry table; step 2 stores into cell 2 of 2.
    for (lens, cells, tag, arg, grid_point) in [
        (3, 3, "OOB-SMEM-LOAD", "input 0", "grid point [2]"),
        (4, 2, "OOB-SMEM-STORE", "scratch 0", "grid point [2]"),
    ] {
        let call = smem_oob(lens, cells);
        let table = HostArray::from_vec([lens], vec![1i32; lens]).unwrap();
        let [theirs, ours] =
            both_errors(&call, &[table, HostArray::zeros([24, 128], F32).unwrap()]);
        assert_eq!(ours.kind, ErrorKind::OutOfBounds, "{tag}: {ours}");
        assert_eq!(
            ours.location.map(|l| l.line),
            Some(marked_line(tag)),
            "{ours}"
        );
        assert_eq!(ours.argument.as_deref(), Some(arg), "{ours}");
        assert!(ours.to_string().contains(grid_point), "{ours}");
        assert_eq!(ours.to_string(), theirs.to_string());
    }
}

// ---------------------------------------------------------------------------------------------- DMA and semaphores (dma.rs)

/// Copies between windows: into a window of a buffer, then between overlapping windows of it (the
/// source is read as it was before the copy), each counted on a semaphore of a 2-D array picked by the
/// grid index.
#[tpu_kernel]
fn dma_windows_kernel(x: Ref<f32>, o: RefMut<f32>, a: RefMut<f32>, sems: DmaSem) {
    let i = program_id(0);
    a.store(0.0);
    sync_copy(x, a.at(ds(0, 8)), sems.at((i % 2, 1)));
    sync_copy(a.at(ds(0, 8)), a.at(ds(4, 8)), sems.at((1, i % 2)));
    o.store(a.load());
}

#[test]
fn dma_and_semaphore_kernels_agree() {
    // A two-slot pipeline from HBM: copies started in one grid step, waited for in the next.
    agree_random(&pipelined_call().expect("build"), 8);
    // Regular semaphores: values read after signals and waits.
    agree_random(&semaphore_call().expect("build"), 9);
    // sync_copy between two VMEM refs.
    agree_random(&sync_call().expect("build"), 10);
    let windows = pallas_call(dma_windows_kernel)
        .grid([2])
        .input(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(at([32, 128], F32), BlockSpec::new([16, 128], |[i]| (i, 0)))
        .scratch(Vmem::new([16, 128], F32))
        .scratch(DmaSem::array([2, 2]))
        .build()
        .expect("build");
    agree_random(&windows, 11);
}

#[tpu_kernel]
fn dma_wait_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sems: DmaSem) {
    let i = program_id(0);
    let c = async_copy(x_hbm.at(ds(i * 8, 8)), buf, sems.at(i));
    if i == 0 {
        c.start();
    }
    c.wait(); // DEADLOCK-DMA
    o.store(buf.load());
}

#[tpu_kernel]
fn sem_wait_kernel(x: Ref<f32>, o: RefMut<f32>, s: Sem) {
    s.signal(1);
    if program_id(0) == 1 {
        s.wait(3); // DEADLOCK-SEM
    }
    o.store(x.load());
}

#[tpu_kernel]
fn slice_oob_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    sync_copy(x_hbm.at(ds(program_id(0) * 8, 8)), buf, sem); // OOB-SLICE
    o.store(buf.load());
}

#[test]
fn deadlocks_and_out_of_bounds_windows_are_the_same_errors_in_both_engines() {
    let rows = |n: usize| HostArray::random([n, 128], F32, 5).unwrap();
    // Step 1 waits on semaphore 1, which no copy signals.
    let call = pallas_call(dma_wait_kernel)
        .grid([2])
        .input_any(at([16, 128], F32))
        .output(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::array([2]))
        .build()
        .expect("build");
    let dma_wait = (call, rows(16), "DEADLOCK-DMA", ErrorKind::Deadlock);
    // Step 1 waits for 3 on a semaphore signalled once per step: it holds 2.
    let call = pallas_call(sem_wait_kernel)
        .grid([2])
        .input(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .scratch(Sem::one())
        .build()
        .expect("build");
    let sem_wait = (call, rows(16), "DEADLOCK-SEM", ErrorKind::Deadlock);
    // Step 2 copies rows 16..24 of a 16-row array.
    let call = pallas_call(slice_oob_kernel)
        .grid([3])
        .input_any(at([16, 128], F32))
        .output(at([24, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("build");
    let slice_oob = (call, rows(16), "OOB-SLICE", ErrorKind::OutOfBounds);
    for (call, x, tag, kind) in [dma_wait, sem_wait, slice_oob] {
        let [theirs, ours] = both_errors(&call, &[x]);
        assert_eq!(ours.kind, kind, "{tag}: {ours}");
        assert_eq!(
            ours.location.map(|l| l.line),
            Some(marked_line(tag)),
            "{tag}: {ours}"
        );
        assert_eq!(ours.to_string(), theirs.to_string(), "{tag}");
        println!("{tag}: {ours}");
    }
}

#[test]
fn semaphores_left_at_kernel_end_are_errors_in_both_engines() {
    let x = HostArray::random([8, 128], F32, 5).unwrap();
    // A regular semaphore signalled more than waited for: the interpreter's error.
    let unbalanced = pallas_call(|x: Ref<f32>, o: RefMut<f32>, s: Sem| {
        s.signal(2);
        s.wait(1);
        o.store(x.load());
    })
    .name("unbalanced")
    .input(at([8, 128], F32), BlockSpec::new([8, 128], |[]| (0, 0)))
    .output(at([8, 128], F32), BlockSpec::new([8, 128], |[]| (0, 0)))
    .scratch(Sem::one())
    .build()
    .expect("build");
    let [theirs, ours] = both_errors(&unbalanced, std::slice::from_ref(&x));
    assert_eq!(ours.kind, ErrorKind::Race, "{ours}");
    assert_eq!(ours.to_string(), theirs.to_string());
    // A copy never waited for: in flight for the interpreter, counted on its semaphore here.
    let never_waited = pallas_call(|x: Ref<f32>, o: RefMut<f32>, a: RefMut<f32>, sem: DmaSem| {
        async_copy(x, a, sem).start();
        o.store(x.load());
    })
    .name("never_waited")
    .input(at([8, 128], F32), BlockSpec::new([8, 128], |[]| (0, 0)))
    .output(at([8, 128], F32), BlockSpec::new([8, 128], |[]| (0, 0)))
    .scratch(Vmem::new([8, 128], F32))
    .scratch(DmaSem::one())
    .build()
    .expect("build");
    let [theirs, ours] = both_errors(&never_waited, &[x]);
    assert_eq!((ours.kind, theirs.kind), (ErrorKind::Race, ErrorKind::Race));
    assert!(
        ours.message
            .contains("DMA semaphore scratch 1 counts 4096 bytes of copies never waited for"),
        "{ours}"
    );
}

// ---------------------------------------------------------------------------------------------- scopes

#[test]
fn run_scoped_kernels_agree_and_every_entry_gets_fresh_scratch() {
    // A scoped VMEM buffer and DMA semaphore: x + 1 staged in the buffer, copied out by DMA.
    agree_random(&scoped_call().expect("build"), 12);
    // A scope entered three times per step: its VMEM buffer and SMEM counter start at zero each time.
    let call = scope_loop_call().expect("build");
    agree_random(&call, 13);
    let x = HostArray::random([16, 128], F32, 14).unwrap();
    let got = mosaic_cpu::run(call.ir(), std::slice::from_ref(&x)).expect("mosaic_cpu");
    for (g, v) in got[0]
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .zip(x.as_slice::<f32>().unwrap())
    {
        assert_eq!(
            g.to_bits(),
            (((0.0 + v) + v) + v).to_bits(),
            "{g} for x = {v}"
        );
    }
}

#[kernel_fn]
fn unbalanced_scope_body(x: Ref<f32>, o: RefMut<f32>, s: Sem) {
    s.signal(2);
    s.wait(1);
    o.store(x.load());
}

#[tpu_kernel]
fn unbalanced_scope_kernel(x: Ref<f32>, o: RefMut<f32>) {
    run_scoped(unbalanced_scope_body, (x, o), Sem::one()); // SCOPE-SEM
}

#[kernel_fn]
fn leaky_scope_body(x: Ref<f32>, buf: RefMut<f32>, sem: DmaSem) {
    async_copy(x, buf, sem).start();
}

#[tpu_kernel]
fn leaky_scope_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let scratch = (Vmem::new([8, 128], F32), DmaSem::one());
    run_scoped(leaky_scope_body, (x,), scratch); // SCOPE-DMA
    o.store(x.load());
}

#[kernel_fn]
fn scoped_cell_body(x: Ref<f32>, o: RefMut<f32>, cell: RefMut<i32, Smem>) {
    cell.at(program_id(0)).store(1); // SCOPE-OOB
    o.store(x.load() * cell.at(0).load().cast::<f32>());
}

#[tpu_kernel]
fn scoped_cell_kernel(x: Ref<f32>, o: RefMut<f32>) {
    run_scoped(scoped_cell_body, (x, o), Smem::new([1], I32));
}

#[test]
fn scope_errors_are_the_interpreter_s() {
    let x = HostArray::random([16, 128], F32, 5).unwrap();
    let build = |k: fn(Ref<f32>, RefMut<f32>)| {
        pallas_call(k)
            .grid([2])
            .input(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
            .output(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
            .build()
            .expect("build")
    };
    // A scoped semaphore signalled more than waited for: the same error at the run_scoped line.
    // A scoped SMEM store out of bounds (step 1 stores cell 1 of 1): the same error, named "scoped
    // buffer 0", at the store's line.
    for (kernel, tag, kind) in [
        (
            unbalanced_scope_kernel as fn(Ref<f32>, RefMut<f32>),
            "SCOPE-SEM",
            ErrorKind::Race,
        ),
        (scoped_cell_kernel, "SCOPE-OOB", ErrorKind::OutOfBounds),
    ] {
        let [theirs, ours] = both_errors(&build(kernel), std::slice::from_ref(&x));
        assert_eq!(ours.kind, kind, "{tag}: {ours}");
        assert_eq!(
            ours.location.map(|l| l.line),
            Some(marked_line(tag)),
            "{tag}: {ours}"
        );
        assert_eq!(ours.to_string(), theirs.to_string(), "{tag}");
        assert!(ours.message.contains("scoped buffer 0"), "{tag}: {ours}");
        println!("{tag}: {ours}");
    }
    // A copy never waited for inside its scope: in flight for the interpreter (at its start), counted
    // on the scope's DMA semaphore here (at the run_scoped line).
    let [theirs, ours] = both_errors(&build(leaky_scope_kernel), std::slice::from_ref(&x));
    assert_eq!((ours.kind, theirs.kind), (ErrorKind::Race, ErrorKind::Race));
    assert_eq!(
        ours.location.map(|l| l.line),
        Some(marked_line("SCOPE-DMA"))
    );
    assert!(
        ours.message.contains(
            "DMA semaphore scoped buffer 1 counts 4096 bytes of copies never waited for when its run_scoped scope ends"
        ),
        "{ours}"
    );
}

// ---------------------------------------------------------------------------------------------- HBM outputs and nested pipelines

/// Run `call` on `inputs` through both engines; panic unless every output agrees bit for bit.
fn agree_bits(call: &PallasCall, inputs: &[HostArray]) -> Vec<HostArray> {
    let want = interpret(call, inputs);
    let got = mosaic_cpu::run(call.ir(), inputs)
        .unwrap_or_else(|e| panic!("{}: mosaic_cpu: {e}", call.name()));
    assert_eq!(got.len(), want.len(), "{}", call.name());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let bits = |a: &HostArray| -> Vec<u32> {
            a.as_slice::<f32>()
                .expect("f32 output")
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(g), bits(w), "{}: output {k}", call.name());
    }
    got
}

#[test]
fn nested_pipelines_agree_bit_for_bit() {
    // 1 inner step (no slot reuse), 2 (both slots), 3 (odd: slot 0 reused), 8 (even, the libtpu case).
    for rows in [8, 16, 24, 64] {
        let call = pipeline_call(rows).expect("build");
        let inputs = reference::random_inputs(&call, rows as u64);
        let got = agree_bits(&call, &inputs);
        // Every element written: 2x + y, not the zeros the output starts as.
        let [x, y] = [&inputs[0], &inputs[1]].map(|a| a.as_slice::<f32>().unwrap());
        for (i, g) in got[0].as_slice::<f32>().unwrap().iter().enumerate() {
            assert_eq!(
                g.to_bits(),
                (x[i] * 2.0 + y[i]).to_bits(),
                "{rows} rows, element {i}"
            );
        }
    }
}

#[test]
fn dma_into_an_hbm_output_agrees_and_unwritten_rows_start_as_zeros_or_the_aliased_input() {
    for (steps, alias) in [(1, false), (3, false), (2, true), (3, true)] {
        let call = any_output_call(steps, alias).expect("build");
        let x = HostArray::random([16 * steps, 128], F32, 21).unwrap();
        let got = agree_bits(&call, std::slice::from_ref(&x));
        let (got, xs) = (
            got[0].as_slice::<f32>().unwrap(),
            x.as_slice::<f32>().unwrap(),
        );
        for (i, (g, v)) in got.iter().zip(xs).enumerate() {
            let band = i / (8 * 128);
            let want = match (band % 2, alias) {
                (0, _) => v * 3.0,
                (_, true) => *v,
                (_, false) => 0.0,
            };
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{steps} steps, alias {alias}: element {i} (band {band})"
            );
        }
    }
}

#[tpu_kernel]
fn triple_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() * 3.0);
}

#[test]
fn an_aliased_blocked_output_keeps_the_input_where_no_block_is_visited() {
    // tests/aliasing.rs's launch: only the even 8-row blocks are visited.
    let a = at([64, 128], F32);
    let spec = || BlockSpec::new([8, 128], |[i]| (i * 2, 0));
    let call = pallas_call(triple_kernel)
        .grid([4])
        .input(a.clone(), spec())
        .output(a, spec())
        .input_output_aliases([(0, 0)])
        .build()
        .expect("build");
    let x = HostArray::random([64, 128], F32, 22).unwrap();
    let got = agree_bits(&call, std::slice::from_ref(&x));
    let (got, xs) = (
        got[0].as_slice::<f32>().unwrap(),
        x.as_slice::<f32>().unwrap(),
    );
    for (i, (g, v)) in got.iter().zip(xs).enumerate() {
        let want = if (i / (8 * 128)) % 2 == 0 {
            v * 3.0
        } else {
            *v
        };
        assert_eq!(g.to_bits(), want.to_bits(), "element {i}");
    }
}

/// The line of this file ending with `// <tag>`.
fn marked_line(tag: &str) -> u32 {
    let at = include_str!("mosaic_cpu.rs")
        .lines()
        .position(|l| l.ends_with(&format!("// {tag}")))
        .expect("marker");
    at as u32 + 1
}

// ---------------------------------------------------------------------------------------------- every lowering rule

// The op-coverage kernels (tests/common/coverage.rs, shared with bytecode.rs): between them they reach every lowering rule and,
// per rule, every dtype class that picks a different Mosaic op.

fn coverage_calls() -> Vec<PallasCall> {
    common::coverage::calls()
        .into_iter()
        .map(|(_, c)| c)
        .collect()
}

#[test]
fn every_lowering_rule_is_checked_by_execution() {
    use tpu_kernel::runtime::serialize::{body, MAX_VERSION};
    let mut text = String::new();
    for call in coverage_calls() {
        agree_random(&call, 11);
        text += &body::body_text(call.ir(), MAX_VERSION).expect("body text");
    }
    // The examples count too (as in bytecode.rs): `every_example_agrees_with_the_interpreter` runs them.
    for (name, build) in common::EXAMPLES {
        let call = build().unwrap_or_else(|e| panic!("{name}: {e}"));
        text += &body::body_text(call.ir(), MAX_VERSION).expect("body text");
    }
    // Every name must be in the modules that agree — but the ops only kernels that talk across devices
    // emit: this engine runs one device (`common::SPMD_EXAMPLES`), so those ops are held by jaxlib's
    // verifier and libtpu's compiles instead (python/tests/test_ring_collectives.py).
    const ACROSS_DEVICES: [&str; 4] = [
        "tpu.device_id",
        "arith.divui",
        "arith.remui",
        "tpu.sem_barrier",
    ];
    let names = common::coverage::lowering_op_names();
    assert!(names.len() > 50, "found only {names:?}");
    let missing: Vec<_> = names
        .iter()
        .filter(|n| !ACROSS_DEVICES.contains(&n.as_str()))
        .filter(|n| !text.contains(&format!("\"stable_mosaic.{n}\"")))
        .collect();
    assert!(
        missing.is_empty(),
        "lowering rules no kernel of this suite runs through mosaic_cpu: {missing:?}"
    );
}

#[tpu_kernel]
fn store_then_masked_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let t = x.load();
    o.store(t + 1.0f32);
    o.store_masked(t * 2.0f32, iota::<i32>([8, 128], 1) < 64);
}

#[test]
fn a_masked_store_keeps_what_a_direct_write_put_in_the_block() {
    // Found by this engine: the interpreter's fused path wrote `t + 1` straight into the output array,
    // then its masked store started from zeros instead of that block (lanes ≥ 64 read 0, not t + 1).
    let spec = || BlockSpec::new([8, 128], |[i]| (i, 0));
    let call = pallas_call(store_then_masked_kernel)
        .grid([2])
        .input(at([16, 128], F32), spec())
        .output(at([16, 128], F32), spec())
        .build()
        .expect("build");
    agree_random(&call, 6);
    let x = reference::random_inputs(&call, 6);
    let fused = call.interpret(&x).expect("interpret");
    let xs = x[0].as_slice::<f32>().unwrap();
    let o = fused[0].as_slice::<f32>().unwrap();
    for (i, (v, x)) in o.iter().zip(xs).enumerate() {
        let want = if i % 128 < 64 { x * 2.0 } else { x + 1.0 };
        assert_eq!(*v, want, "element {i}");
    }
}

// ---------------------------------------------------------------------------------------------- errors

#[tpu_kernel]
fn oob_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let start = program_id(0) * 16;
    o.store(x.at((ds(start, 8), ..)).load()); // OOB-LOAD
}

#[test]
fn an_out_of_bounds_slice_is_an_error_at_the_same_line_in_both_engines() {
    let call = pallas_call(oob_kernel)
        .grid([2])
        .input(at([16, 128], F32), BlockSpec::new([16, 128], |[_]| (0, 0)))
        .output(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .dimension_semantics([Arbitrary])
        .build()
        .expect("build");
    let x = HostArray::random([16, 128], F32, 2).unwrap();
    let line = include_str!("mosaic_cpu.rs")
        .lines()
        .position(|l| l.ends_with("// OOB-LOAD"))
        .expect("marker")
        + 1;
    let theirs = call
        .interpret(std::slice::from_ref(&x))
        .expect_err("interpret");
    let ours = mosaic_cpu::run(call.ir(), &[x]).expect_err("grid step 1 reads rows 16..24");
    for err in [&theirs, &ours] {
        assert_eq!(err.kind, ErrorKind::OutOfBounds, "{err}");
        let loc = err.location.expect("located");
        assert!(loc.file.ends_with("mosaic_cpu.rs"), "{err}");
        assert_eq!(loc.line as usize, line, "{err}");
        assert!(err.to_string().contains("grid point [1]"), "{err}");
        assert_eq!(err.argument.as_deref(), Some("input 0"), "{err}");
    }
    // One message for the fault, whichever engine finds it (`semantics::refs`).
    assert_eq!(ours.message, theirs.message);
    assert!(
        ours.message.contains("window 16..24 along dimension 0"),
        "{ours}"
    );
}

#[test]
fn wrong_inputs_are_errors_not_panics() {
    let call = common::add::build().expect("build");
    let compiled = mosaic_cpu::compile(call.ir()).expect("compile");
    let x = HostArray::zeros([1024, 1024], F32).unwrap();
    let err = compiled
        .run(std::slice::from_ref(&x))
        .expect_err("one input");
    assert_eq!(err.kind, ErrorKind::Signature);
    let y = HostArray::zeros([1024, 512], F32).unwrap();
    assert_eq!(
        compiled.run(&[x, y]).expect_err("wrong shape").kind,
        ErrorKind::Shape
    );
}

// ---------------------------------------------------------------------------------------------- random launches

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4, max_shrink_iters: 10, ..ProptestConfig::default() })]

        #[test]
        fn elementwise_add(bm_t in 1usize..4, bn_t in 1usize..3, gm in 1usize..4, gn in 1usize..3, seed in 0u64..1000) {
            let (bm, bn) = (8 * bm_t, 128 * bn_t);
            agree_random(&common::add::add(at([bm * gm, bn * gn], F32), at([bm * gm, bn * gn], F32), (bm, bn)).expect("build"), seed);
        }

        #[test]
        fn row_softmax(rows_t in 1usize..4, n_t in 1usize..5, g in 1usize..5, seed in 0u64..1000) {
            let (br, n) = (8 * rows_t, 128 * n_t);
            agree_random(&common::softmax::softmax(at([br * g, n], F32), br).expect("build"), seed);
        }

        #[test]
        fn column_sum(bm_t in 1usize..4, bn_t in 1usize..3, gm in 1usize..5, gn in 1usize..3, seed in 0u64..1000) {
            let (bm, bn) = (8 * bm_t, 128 * bn_t);
            agree_random(&common::colsum::colsum(at([bm * gm, bn * gn], F32), (bm, bn)).expect("build"), seed);
        }

        #[test]
        fn rmsnorm_rows(rows_t in 1usize..3, n_t in 1usize..4, g in 1usize..4, seed in 0u64..1000) {
            let (br, n) = (16 * rows_t, 128 * n_t);
            agree_random(&common::rmsnorm::rmsnorm(at([br * g, n], BF16), at([1, n], F32), 1e-6, br).expect("build"), seed);
        }

        #[test]
        fn tiled_matmul(bm_t in 1usize..3, bk_t in 1usize..3, gm in 1usize..3, gk in 1usize..3, seed in 0u64..1000) {
            let (bm, bn, bk) = (16 * bm_t, 128, 128 * bk_t);
            agree_random(&common::matmul::matmul(at([bm * gm, bk * gk], BF16), at([bk * gk, bn], BF16), (bm, bn, bk)).expect("build"), seed);
        }
    }
}

// ---------------------------------------------------------------------------------------------- mutations

/// Apply `f` to the first op named `name` in the module (any function, any depth); panics if none.
fn mutate(m: &mut MModule, name: &str, f: impl FnOnce(&mut MOp)) {
    fn find<'a>(b: &'a mut MBlock, name: &str) -> Option<&'a mut MOp> {
        for op in &mut b.ops {
            if op.name == name {
                return Some(op);
            }
            for r in op.regions.iter_mut().flatten() {
                if let Some(found) = find(r, name) {
                    return Some(found);
                }
            }
        }
        None
    }
    let op = m
        .funcs
        .iter_mut()
        .find_map(|f| find(&mut f.body, name))
        .unwrap_or_else(|| panic!("no {name} in the module"));
    f(op);
}

fn set_attr(op: &mut MOp, name: &str, value: &str) {
    let slot = op
        .attrs
        .iter_mut()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("{} has no {name}", op.name));
    slot.1 = value.to_string();
}

/// Run `call`'s Mosaic module, changed by `change`, through mosaic_cpu.
fn run_mutated(
    call: &PallasCall,
    inputs: &[HostArray],
    change: impl FnOnce(&mut MModule),
) -> Result<Vec<HostArray>, KernelError> {
    let mut m = tpu_kernel::runtime::lower::lower_module(call.ir())?;
    change(&mut m);
    tpu_kernel::runtime::mosaic::mlir::with_context(|ctx| {
        let module = tpu_kernel::runtime::mosaic::mlir::build(ctx, &m)?;
        mosaic_cpu::compile_module(call.ir(), &module)?.run(inputs)
    })
}

#[tpu_kernel]
fn difference_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() - y.load());
}

#[test]
fn wrong_lowerings_make_the_engine_disagree() {
    type Change = fn(&mut MModule);
    let difference = pallas_call(difference_kernel)
        .grid([2])
        .input(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .input(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .output(at([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .build()
        .expect("build");
    let example = |name: &str| {
        let (_, build) = common::EXAMPLES
            .iter()
            .find(|(n, _)| *n == name)
            .expect("example");
        build().expect("build")
    };
    let cases: Vec<(&str, PallasCall, Change)> = vec![
        ("arith.addf → arith.subf (add)", example("add"), |m| {
            mutate(m, "arith.addf", |op| op.name = "arith.subf")
        }),
        ("arith.subf → arith.addf (x - y)", difference, |m| {
            mutate(m, "arith.subf", |op| op.name = "arith.addf")
        }),
        (
            "tpu.matmul contracting dims swapped (lhs contracts dim 0, rhs dim 1)",
            example("matmul"),
            |m| {
                mutate(m, "tpu.matmul", |op| {
                    set_attr(
                        op,
                        "dimension_numbers",
                        "#tpu.dot_dimension_numbers<[0], [1], [1], [0], [0, 1, 1, 0], [], []>",
                    )
                })
            },
        ),
        (
            "tpu.vector_store mask dropped (ops_tour)",
            example("ops_tour"),
            |m| {
                fn masked(op: &MOp) -> bool {
                    op.attrs
                        .iter()
                        .any(|(n, v)| *n == "operandSegmentSizes" && v.ends_with(", 1>"))
                }
                let op = m
                    .funcs
                    .iter_mut()
                    .flat_map(|f| f.body.ops.iter_mut())
                    .find(|op| op.name == "tpu.vector_store" && masked(op))
                    .expect("a masked store at the top level of ops_tour");
                op.operands.pop();
                let seg = op
                    .attrs
                    .iter_mut()
                    .find(|(n, _)| *n == "operandSegmentSizes")
                    .expect("segments");
                seg.1 = seg.1.replace(", 1>", ", 0>");
            },
        ),
        (
            "tpu.iota dimension 0 → 1 (causal_mask)",
            example("causal_mask"),
            |m| {
                mutate(m, "tpu.iota", |op| {
                    set_attr(op, "dimensions", "array<i32: 1>")
                })
            },
        ),
        (
            "tpu.transpose permutation [1, 0] → [0, 1]",
            example("transpose"),
            |m| {
                mutate(m, "tpu.transpose", |op| {
                    set_attr(op, "permutation", "array<i64: 0, 1>")
                })
            },
        ),
        (
            "vector.multi_reduction <add> → <maximumf> (colsum)",
            example("colsum"),
            |m| {
                mutate(m, "vector.multi_reduction", |op| {
                    set_attr(op, "kind", "#vector.kind<maximumf>")
                })
            },
        ),
        (
            "the index map reads idx[0], not idx[i] (gather_prefetch)",
            example("gather_prefetch"),
            |m| {
                // transform_0: `memref.load %table[%i]` → `memref.load %table[%c0]`.
                let f = &mut m.funcs[1];
                let at = f
                    .body
                    .ops
                    .iter()
                    .position(|op| op.name == "memref.load")
                    .expect("transform_0 reads the table");
                let zero = f.num_values;
                f.num_values += 1;
                let load = &mut f.body.ops[at];
                load.operands[1] = zero;
                let loc = load.loc;
                f.body.ops.insert(
                    at,
                    MOp {
                        name: "arith.constant",
                        loc,
                        operands: vec![],
                        results: vec![(zero, MType::index())],
                        attrs: vec![("value", "0 : index".into())],
                        regions: vec![],
                    },
                );
            },
        ),
        (
            "the DMA's source window starts at row 0, not i·128 (dma_double)",
            example("dma_double"),
            |m| {
                // The enqueue's `tpu.memref_slice %x[%i_times_128, %c0]` → `[%c0, %c0]` (the wait's
                // slice, which names the same window, is left as it was).
                let f = &mut m.funcs[0];
                let at = f
                    .body
                    .ops
                    .iter()
                    .position(|op| op.name == "tpu.memref_slice")
                    .expect("dma_double slices its input");
                let zero = f.body.ops[at].operands[2];
                f.body.ops[at].operands[1] = zero;
            },
        ),
        (
            "the store into a scoped buffer (memref.alloca) dropped (scoped_call)",
            scoped_call().expect("build"),
            |m| {
                let region = m.funcs[0]
                    .body
                    .ops
                    .iter_mut()
                    .find(|op| op.name == "tpu.region")
                    .and_then(|op| op.regions[0].as_mut())
                    .expect("scoped_call has a scope");
                let at = region
                    .ops
                    .iter()
                    .position(|op| op.name == "tpu.vector_store")
                    .expect("the scope stores into its buffer");
                region.ops.remove(at);
            },
        ),
        (
            "the pipeline's output copy lands at row 0, not j·8 (pipeline_call)",
            pipeline_call(32).expect("build"),
            |m| {
                // In the pipeline's loop body: the slice of the HBM output that the output copy
                // (the loop body's own `tpu.enqueue_dma`; the input copies sit in an `scf.if`)
                // targets, `tpu.memref_slice %o[%j_times_8, %c0]` → `[%c0, %c0]`. The waits'
                // slices, which only size the waits, are left as they were.
                fn body<'a>(ops: &'a mut [MOp], name: &str) -> &'a mut MBlock {
                    ops.iter_mut()
                        .find(|op| op.name == name)
                        .and_then(|op| op.regions[0].as_mut())
                        .unwrap_or_else(|| panic!("no {name}"))
                }
                let region = body(&mut m.funcs[0].body.ops, "tpu.region");
                let steps = body(&mut region.ops, "scf.for");
                let copy = steps
                    .ops
                    .iter()
                    .rfind(|op| op.name == "tpu.enqueue_dma")
                    .expect("the output copy");
                let target = copy.operands[1];
                let slice = steps
                    .ops
                    .iter_mut()
                    .find(|op| op.results.first().map(|r| r.0) == Some(target))
                    .expect("the output window");
                assert_eq!(slice.name, "tpu.memref_slice");
                slice.operands[1] = slice.operands[2];
            },
        ),
        (
            "output index map (j, i) → (i, j) (transpose)",
            example("transpose"),
            |m| {
                let ret = m.funcs[2]
                    .body
                    .ops
                    .iter_mut()
                    .find(|op| op.name == "func.return")
                    .expect("transform_1 returns");
                ret.operands.swap(0, 1);
            },
        ),
    ];
    for (what, call, change) in cases {
        let inputs = reference::random_inputs(&call, 7);
        let want = interpret(&call, &inputs);
        // The unchanged module, through the same path, agrees...
        let same = run_mutated(&call, &inputs, |_| {}).expect("unchanged module");
        assert!(
            compare(&same, &want).0,
            "{what}: the unchanged module disagrees"
        );
        // ...the changed one runs and does not.
        let got = run_mutated(&call, &inputs, change)
            .unwrap_or_else(|e| panic!("{what}: the mutated module should run: {e}"));
        let (ok, worst) = compare(&got, &want);
        let worst: Vec<String> = worst.iter().map(|w| format!("{w:.2e}")).collect();
        println!("{what:<72} max |error| [{}]", worst.join(", "));
        assert!(!ok, "{what}: mosaic_cpu did not notice the wrong lowering");
    }
}

#[test]
fn a_dropped_dma_wait_is_an_error() {
    // Copies complete at their start, so the data agree without the wait; the semaphore it would
    // have taken from does not: a copy never waited for is an error at kernel end.
    let call = pipelined_call().expect("build");
    let inputs = reference::random_inputs(&call, 7);
    let e = run_mutated(&call, &inputs, |m| {
        let body = &mut m.funcs[0].body.ops;
        let at = body
            .iter()
            .position(|op| op.name == "tpu.wait_dma")
            .expect("a top-level wait");
        body.remove(at);
    })
    .expect_err("a dropped wait fails");
    assert_eq!(e.kind, ErrorKind::Race, "{e}");
    assert!(e.message.contains("never waited for"), "{e}");
}

#[test]
fn a_module_that_moves_an_hbm_input_into_vmem_is_refused() {
    // Run as VMEM the input would be the same host buffer: the engine checks each ref's memory space
    // against the kernel's operand instead of letting the change pass.
    let call = common::dma_double::build().expect("build");
    let inputs = reference::random_inputs(&call, 7);
    let e = run_mutated(&call, &inputs, |m| {
        let f = &mut m.funcs[0];
        for t in [&mut f.inputs[1], &mut f.body.args[1].1] {
            let MType::MemRef { space, .. } = t else {
                panic!("the input is a ref")
            };
            *space = "#tpu.memory_space<vmem>";
        }
    })
    .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Lowering, "{e}");
    assert!(
        e.message.contains("input 0 is in Vmem, declared in Any"),
        "{e}"
    );
}

#[test]
fn a_module_that_stores_into_an_hbm_output_directly_is_refused() {
    // The kernel stages its block in VMEM and copies it out by DMA; the mutated store writes the HBM
    // output itself, which runs on the CPU but not on the TPU (only DMA reaches HBM).
    let call = any_output_call(1, false).expect("build");
    let inputs = reference::random_inputs(&call, 7);
    let e = run_mutated(&call, &inputs, |m| {
        let f = &mut m.funcs[0];
        let o_hbm = f.body.args[2].0;
        let store = f
            .body
            .ops
            .iter_mut()
            .find(|op| op.name == "tpu.vector_store")
            .expect("the store into the VMEM buffer");
        store.operands[1] = o_hbm;
    })
    .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Lowering, "{e}");
    assert!(
        e.message
            .contains("`tpu.vector_store` on a ref in Any: only DMA reaches HBM"),
        "{e}"
    );
}

#[test]
fn a_module_that_drops_its_scalar_prefetch_is_refused() {
    // The launch is read from the module: `scalar_prefetch = 0` would pass the table as a windowed
    // input. The engine checks the module against the kernel it was lowered from.
    let call = common::gather_prefetch::build().expect("build");
    let inputs = reference::random_inputs(&call, 7);
    let e = run_mutated(&call, &inputs, |m| {
        let slot = m.funcs[0]
            .attrs
            .iter_mut()
            .find(|(n, _)| *n == "scalar_prefetch")
            .expect("scalar_prefetch");
        slot.1 = "0 : i64".into();
    })
    .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Lowering, "{e}");
    assert!(
        e.message
            .contains("scalar_prefetch 0, 1 scalar-prefetch operands"),
        "{e}"
    );
}

#[test]
fn examples_run_their_mosaic_module_with_engine_mosaic() {
    use tpu_kernel::example::{parse_args, Emit, Engine};
    let args = |a: &[&str]| parse_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(args(&["--run"]), Ok(Emit::Run(Engine::Interpret)));
    assert_eq!(
        args(&["--run", "--engine", "mosaic"]),
        Ok(Emit::Run(Engine::Mosaic))
    );
    assert_eq!(
        args(&["--engine", "interpret", "--run"]),
        Ok(Emit::Run(Engine::Interpret))
    );
    assert!(
        args(&["--engine", "mosaic"]).is_err(),
        "--engine without --run"
    );
    assert!(args(&["--run", "--engine", "tpu"]).is_err());
}
