//! The narrow dtypes of the dtype table (`f16`, `float8_e4m3fn`, `float8_e5m2`): loads, stores and
//! casts of the 8-bit floats and their `dot`, in the interpreter and in Mosaic on CPU (the same bits),
//! what they lower to, and the launches our `build()` refuses because libtpu refuses them (f16 on
//! every generation, 8-bit-float matmuls on v4: `python/probe_dtypes.py`'s table, which
//! `python/tests/test_dtypes.py` compiles). Their numbers against jax/ml_dtypes, bit for bit: the
//! Python suite.

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::{HostArray, HostData};
use tpu_kernel::runtime::mosaic_cpu;
use tpu_kernel::ErrorKind;

const ROWS: usize = 64;
const COLS: usize = 256;

#[tpu_kernel]
fn copy_e4m3(x: Ref<f8e4m3fn>, o: RefMut<f8e4m3fn>) {
    o.store(x.load());
}

#[tpu_kernel]
fn copy_e5m2(x: Ref<f8e5m2>, o: RefMut<f8e5m2>) {
    o.store(x.load());
}

/// f32 → fp8 → f32 and f32 → fp8 → bf16: both roundings of the table, through a block.
#[tpu_kernel]
fn round_trip_e4m3(x: Ref<f32>, q: RefMut<f8e4m3fn>, back: RefMut<f32>, b16: RefMut<bf16>) {
    let v = x.load().cast::<f8e4m3fn>();
    q.store(v);
    back.store(v.cast::<f32>());
    b16.store(x.load().cast::<bf16>().cast::<f8e4m3fn>().cast::<bf16>());
}

#[tpu_kernel]
fn round_trip_e5m2(x: Ref<f32>, q: RefMut<f8e5m2>, back: RefMut<f32>, b16: RefMut<bf16>) {
    let v = x.load().cast::<f8e5m2>();
    q.store(v);
    back.store(v.cast::<f32>());
    b16.store(x.load().cast::<bf16>().cast::<f8e5m2>().cast::<bf16>());
}

/// An fp8-weight matmul: bf16 activations times e4m3 weights dequantized to bf16, scaled per output
/// column (the form issue 23's fp8 KV cache takes).
#[tpu_kernel]
fn fp8_weight_matmul(x: Ref<bf16>, w: Ref<f8e4m3fn>, scale: Ref<f32>, o: RefMut<f32>) {
    let acc = dot(x.load(), w.load().cast::<bf16>());
    o.store(acc * scale.load());
}

/// fp8 × fp8 on the MXU, accumulating in f32.
#[tpu_kernel]
fn fp8_dot(x: Ref<f8e5m2>, w: Ref<f8e5m2>, o: RefMut<f32>) {
    o.store(dot(x.load(), w.load()));
}

#[tpu_kernel]
fn f16_to_f32(x: Ref<f16>, o: RefMut<f32>) {
    o.store(x.load().cast::<f32>());
}

fn whole(shape: [usize; 2]) -> BlockSpec<'static> {
    BlockSpec::new(shape, |[]| (0, 0))
}

fn f32_array(v: Vec<f32>) -> HostArray {
    HostArray::from_vec([ROWS, COLS], v).unwrap()
}

/// Every f32 the probe of the roundings needs: each 8-bit pattern's value, the midpoints between
/// neighbours (ties), values just off them, overflow, NaN, infinities, signed zeros.
fn rounding_inputs() -> Vec<f32> {
    let mut v: Vec<f32> = Vec::new();
    for b in 0..=255u8 {
        for x in [
            f8e4m3fn::from_bits(b).to_f32(),
            f8e5m2::from_bits(b).to_f32(),
        ] {
            v.push(x);
            v.push(f32::from_bits(x.to_bits().wrapping_add(1)));
            v.push(f32::from_bits(x.to_bits().wrapping_sub(1)));
        }
    }
    for b in 0..=254u8 {
        for (a, c) in [
            (f8e4m3fn::from_bits(b), f8e4m3fn::from_bits(b + 1)),
            (f8e4m3fn::from_bits(b), f8e4m3fn::from_bits(b + 1)),
        ] {
            let mid = (a.to_f32() + c.to_f32()) / 2.0;
            v.extend([mid, -mid]);
        }
        let (a, c) = (f8e5m2::from_bits(b), f8e5m2::from_bits(b + 1));
        v.push((a.to_f32() + c.to_f32()) / 2.0);
    }
    v.extend([
        464.0,
        480.0,
        1e6,
        61440.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    v.extend([f32::NAN, -f32::NAN, f32::MIN_POSITIVE, 1e-30]);
    v.retain(|x| x.is_nan() || x.is_finite() || x.is_infinite());
    v.resize(ROWS * COLS, 0.5);
    v
}

fn both_engines(call: &PallasCall, inputs: &[HostArray]) -> Vec<HostArray> {
    let interp = call
        .interpret(inputs)
        .unwrap_or_else(|e| panic!("interpret: {e}"));
    let mosaic = mosaic_cpu::run(call.ir(), inputs).unwrap_or_else(|e| panic!("mosaic_cpu: {e}"));
    for (k, (a, b)) in interp.iter().zip(&mosaic).enumerate() {
        if a != b {
            let i = (0..a.len())
                .find(|&i| {
                    a.data().get_f64(i).map(f64::to_bits) != b.data().get_f64(i).map(f64::to_bits)
                })
                .unwrap_or(0);
            let raw = |h: &HostArray| match h.data() {
                HostData::BF16(v) => format!("{:#x}", v[i].to_bits()),
                HostData::F32(v) => format!("{:#x}", v[i].to_bits()),
                _ => String::new(),
            };
            eprintln!("raw: {} vs {} (input {})", raw(a), raw(b), raw(&inputs[0]));
            panic!(
                "output {k}: the engines differ first at {i}: interpreter {:?}, mosaic {:?} (input {:?})",
                a.data().get_f64(i),
                b.data().get_f64(i),
                inputs.first().and_then(|x| x.data().get_f64(i))
            );
        }
    }
    interp
}

fn bits8(a: &HostArray) -> Vec<u8> {
    match a.data() {
        HostData::F8E4M3FN(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostData::F8E5M2(v) => v.iter().map(|x| x.to_bits()).collect(),
        d => panic!("not an 8-bit float: {:?}", d.dtype()),
    }
}

#[test]
fn every_8bit_pattern_loads_and_stores_unchanged() {
    let all: Vec<u8> = (0..ROWS * COLS).map(|i| (i * 7 + 3) as u8).collect();
    let spec = || whole([ROWS, COLS]);
    for dtype in [F8E4M3FN, F8E5M2] {
        macro_rules! io {
            ($b:expr) => {
                $b.input(ArrayType::new([ROWS, COLS], dtype), spec())
                    .output(ArrayType::new([ROWS, COLS], dtype), spec())
                    .build()
                    .unwrap()
            };
        }
        let call = match dtype {
            F8E4M3FN => io!(pallas_call(copy_e4m3)),
            _ => io!(pallas_call(copy_e5m2)),
        };
        let data = match dtype {
            F8E4M3FN => HostData::F8E4M3FN(all.iter().map(|b| f8e4m3fn::from_bits(*b)).collect()),
            _ => HostData::F8E5M2(all.iter().map(|b| f8e5m2::from_bits(*b)).collect()),
        };
        let x = HostArray::new([ROWS, COLS], data).unwrap();
        let out = both_engines(&call, std::slice::from_ref(&x));
        assert_eq!(bits8(&out[0]), all, "{dtype}: every pattern, NaNs included");
    }
}

#[test]
fn casts_round_as_the_dtype_table_in_both_engines() {
    let inputs = rounding_inputs();
    let x = f32_array(inputs.clone());
    let shape = [ROWS, COLS];
    let spec = || whole(shape);
    for dtype in [F8E4M3FN, F8E5M2] {
        macro_rules! io {
            ($b:expr) => {
                $b.input(ArrayType::new(shape, F32), spec())
                    .output(ArrayType::new(shape, dtype), spec())
                    .output(ArrayType::new(shape, F32), spec())
                    .output(ArrayType::new(shape, BF16), spec())
                    .build()
                    .unwrap()
            };
        }
        let call = match dtype {
            F8E4M3FN => io!(pallas_call(round_trip_e4m3)),
            _ => io!(pallas_call(round_trip_e5m2)),
        };
        let out = both_engines(&call, std::slice::from_ref(&x));
        let want: Vec<u8> = inputs
            .iter()
            .map(|&v| match dtype {
                F8E4M3FN => f8e4m3fn::from_f32(v).to_bits(),
                _ => f8e5m2::from_f32(v).to_bits(),
            })
            .collect();
        assert_eq!(bits8(&out[0]), want, "{dtype}: f32 → {dtype}");
        let back = out[1].as_slice::<f32>().unwrap();
        for (i, (&q, &b)) in want.iter().zip(back).enumerate() {
            let exact = match dtype {
                F8E4M3FN => f8e4m3fn::from_bits(q).to_f32(),
                _ => f8e5m2::from_bits(q).to_f32(),
            };
            assert_eq!(
                b.to_bits(),
                exact.to_bits(),
                "{dtype} → f32 at {i} ({q:#x})"
            );
        }
        // bf16 → fp8 → bf16: the fp8 value of the bf16-rounded input, exactly in bf16.
        let b16 = out[2].as_slice::<bf16>().unwrap();
        for (i, &v) in inputs.iter().enumerate() {
            let r = bf16::from_f32(v).to_f32();
            let q = match dtype {
                F8E4M3FN => f8e4m3fn::from_f32(r).to_f32(),
                _ => f8e5m2::from_f32(r).to_f32(),
            };
            assert_eq!(
                b16[i].to_bits(),
                bf16::from_f32(q).to_bits(),
                "{dtype} via bf16 at {i} ({v:e})"
            );
        }
    }
}

/// Weights and activations that are small integers / 16ths, so every product and sum is exact in f32:
/// the result is the exact product, whatever the summation order.
fn exact_operands(m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..m * k)
        .map(|i| ((i * 5 % 9) as f32 - 4.0) / 4.0)
        .collect();
    let w = (0..k * n)
        .map(|i| ((i * 3 % 7) as f32 - 3.0) / 2.0)
        .collect();
    (x, w)
}

fn reference_matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut o = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            o[i * n + j] = (0..k).map(|p| x[i * k + p] * w[p * n + j]).sum();
        }
    }
    o
}

#[test]
fn an_fp8_weight_matmul_dequantizes_exactly_in_both_engines() {
    let (m, k, n) = (128, 256, 128);
    let (xv, wv) = exact_operands(m, k, n);
    let scale: Vec<f32> = (0..n).map(|j| 0.5 + (j % 4) as f32 * 0.25).collect();
    for &t in Target::ALL {
        let call = pallas_call(fp8_weight_matmul)
            .target(t)
            .input(ArrayType::new([m, k], BF16), whole([m, k]))
            .input(ArrayType::new([k, n], F8E4M3FN), whole([k, n]))
            .input(ArrayType::new([1, n], F32), whole([1, n]))
            .output(ArrayType::new([m, n], F32), whole([m, n]))
            .build()
            .unwrap_or_else(|e| panic!("{t}: a dequantizing matmul builds everywhere: {e}"));
        if t != Target::DEFAULT {
            continue;
        }
        let x =
            HostArray::from_vec([m, k], xv.iter().map(|v| bf16::from_f32(*v)).collect()).unwrap();
        let w = HostArray::from_vec([k, n], wv.iter().map(|v| f8e4m3fn::from_f32(*v)).collect())
            .unwrap();
        let s = HostArray::from_vec([1, n], scale.clone()).unwrap();
        let out = both_engines(&call, &[x, w, s]);
        let want: Vec<f32> = reference_matmul(&xv, &wv, m, k, n)
            .iter()
            .enumerate()
            .map(|(i, v)| v * scale[i % n])
            .collect();
        let got = out[0].as_slice::<f32>().unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "exact products and sums: the same bits"
        );
    }
}

#[test]
fn fp8_dots_run_where_libtpu_takes_them_and_v4_refuses() {
    let (m, k, n) = (128, 256, 128);
    let (xv, wv) = exact_operands(m, k, n);
    for &t in Target::ALL {
        let built = pallas_call(fp8_dot)
            .target(t)
            .input(ArrayType::new([m, k], F8E5M2), whole([m, k]))
            .input(ArrayType::new([k, n], F8E5M2), whole([k, n]))
            .output(ArrayType::new([m, n], F32), whole([m, n]))
            .build();
        if !t.info().matmul_dtypes.contains(&F8E5M2) {
            let e = built.expect_err("v4 refuses an fp8 matmul, as libtpu does");
            assert_eq!(e.kind, ErrorKind::DType);
            assert!(
                e.message
                    .contains("v4 does not multiply float8_e5m2 blocks"),
                "{}",
                e.message
            );
            assert!(e.location.is_some(), "at the dot's line");
            continue;
        }
        let call = built.unwrap_or_else(|e| panic!("{t}: {e}"));
        if t != Target::DEFAULT {
            continue;
        }
        let q = |v: &[f32]| v.iter().map(|x| f8e5m2::from_f32(*x)).collect::<Vec<_>>();
        let x = HostArray::from_vec([m, k], q(&xv)).unwrap();
        let w = HostArray::from_vec([k, n], q(&wv)).unwrap();
        let out = both_engines(&call, &[x, w]);
        let want = reference_matmul(&xv, &wv, m, k, n);
        let got = out[0].as_slice::<f32>().unwrap();
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
    assert_eq!(Target::V4.info().matmul_dtypes, &[F32, BF16]);
}

#[test]
fn f16_kernels_are_refused_on_every_generation_naming_the_op() {
    for &t in Target::ALL {
        let e = pallas_call(f16_to_f32)
            .target(t)
            .input(ArrayType::new([ROWS, COLS], F16), whole([ROWS, COLS]))
            .output(ArrayType::new([ROWS, COLS], F32), whole([ROWS, COLS]))
            .build()
            .expect_err("libtpu compiles no f16 vector");
        assert_eq!(e.kind, ErrorKind::DType);
        let why = format!("{} does not compile f16 values (`load", t.name());
        assert!(e.message.contains(&why), "{t}: {}", e.message);
        assert!(
            e.message.contains("float8_e4m3fn, float8_e5m2"),
            "the message lists what the target takes: {}",
            e.message
        );
        let loc = e.location.expect("at the load's line");
        assert!(loc.file.ends_with("dtypes.rs"), "{loc:?}");
    }
}

#[test]
fn the_8bit_floats_lower_to_mosaic_types_and_casts() {
    let shape = [ROWS, COLS];
    let call = pallas_call(round_trip_e4m3)
        .input(ArrayType::new(shape, F32), whole(shape))
        .output(ArrayType::new(shape, F8E4M3FN), whole(shape))
        .output(ArrayType::new(shape, F32), whole(shape))
        .output(ArrayType::new(shape, BF16), whole(shape))
        .build()
        .unwrap();
    let text = call.mosaic_mlir().unwrap();
    for (op, want) in [
        (
            "arith.truncf",
            "vector<64x256xf32> to vector<64x256xf8E4M3FN>",
        ),
        (
            "arith.extf",
            "vector<64x256xf8E4M3FN> to vector<64x256xf32>",
        ),
        (
            "arith.truncf",
            "vector<64x256xbf16> to vector<64x256xf8E4M3FN>",
        ),
        (
            "arith.extf",
            "vector<64x256xf8E4M3FN> to vector<64x256xbf16>",
        ),
        (
            "func.func",
            "memref<64x256xf8E4M3FN, #tpu.memory_space<vmem>>",
        ),
    ] {
        assert!(
            text.lines().any(|l| l.contains(op) && l.contains(want)),
            "missing `{op} .. {want}` in\n{text}"
        );
    }
}

// ------------------------------------------------------------------------------------------ int4
// One byte per element on the host (`dtype/int4.rs`), packed eight to a word in VMEM; a storage
// dtype (libtpu: "Only vector<i16> and vector<i32> are supported, but got 'i4'"), cast to compute.

#[tpu_kernel]
fn copy_i4(x: Ref<i4>, o: RefMut<i4>) {
    o.store(x.load());
}

/// Every cast out of int4 the probe compiles: to f32, bf16, i32, i8.
#[tpu_kernel]
fn widen_i4(x: Ref<i4>, f: RefMut<f32>, b: RefMut<bf16>, i: RefMut<i32>, j: RefMut<i8>) {
    let v = x.load();
    f.store(v.cast::<f32>());
    b.store(v.cast::<bf16>());
    i.store(v.cast::<i32>());
    j.store(v.cast::<i8>());
}

/// Every cast into int4: f32 and bf16 round toward zero and saturate (NaN → 0), i32 and i8 wrap.
#[tpu_kernel]
fn narrow_to_i4(
    x: Ref<f32>,
    n: Ref<i32>,
    f: RefMut<i4>,
    b: RefMut<i4>,
    i: RefMut<i4>,
    j: RefMut<i4>,
) {
    f.store(x.load().cast::<i4>());
    b.store(x.load().cast::<bf16>().cast::<i4>());
    i.store(n.load().cast::<i4>());
    j.store(n.load().cast::<i8>().cast::<i4>());
}

/// int4 × int4 on the MXU, accumulating in i32.
#[tpu_kernel]
fn i4_dot(x: Ref<i4>, w: Ref<i4>, o: RefMut<i32>) {
    o.store(dot(x.load(), w.load()));
}

/// bf16 activations times int4 weights dequantized to bf16 in the kernel (what libtpu compiles on
/// every generation, v4 included).
#[tpu_kernel]
fn i4_weight_matmul(x: Ref<bf16>, w: Ref<i4>, o: RefMut<f32>) {
    o.store(dot(x.load(), w.load().cast::<bf16>()));
}

fn i4_data(n: usize) -> Vec<i4> {
    (0..n).map(|i| i4::wrapping((i * 7 + 3) as i64)).collect()
}

fn i4_values(a: &HostArray) -> Vec<i8> {
    match a.data() {
        HostData::I4(v) => v.iter().map(|x| x.get()).collect(),
        d => panic!("not int4: {:?}", d.dtype()),
    }
}

#[test]
fn every_int4_value_loads_and_stores_unchanged_in_both_engines() {
    let shape = [ROWS, COLS];
    let call = pallas_call(copy_i4)
        .input(ArrayType::new(shape, I4), whole(shape))
        .output(ArrayType::new(shape, I4), whole(shape))
        .build()
        .unwrap();
    let data = i4_data(ROWS * COLS);
    let x = HostArray::from_vec(shape, data.clone()).unwrap();
    let out = both_engines(&call, std::slice::from_ref(&x));
    let want: Vec<i8> = data.iter().map(|v| v.get()).collect();
    assert_eq!(i4_values(&out[0]), want);
    assert!((-8..=7).all(|v| want.contains(&v)), "all 16 values");
}

#[test]
fn int4_casts_widen_exactly_and_narrow_as_xla_in_both_engines() {
    let shape = [ROWS, COLS];
    let spec = || whole(shape);
    let widen = pallas_call(widen_i4)
        .input(ArrayType::new(shape, I4), spec())
        .output(ArrayType::new(shape, F32), spec())
        .output(ArrayType::new(shape, BF16), spec())
        .output(ArrayType::new(shape, I32), spec())
        .output(ArrayType::new(shape, I8), spec())
        .build()
        .unwrap();
    let data = i4_data(ROWS * COLS);
    let x = HostArray::from_vec(shape, data.clone()).unwrap();
    let out = both_engines(&widen, std::slice::from_ref(&x));
    for (i, v) in data.iter().enumerate() {
        let v = v.get();
        assert_eq!(
            out[0].as_slice::<f32>().unwrap()[i].to_bits(),
            (v as f32).to_bits()
        );
        assert_eq!(
            out[1].as_slice::<bf16>().unwrap()[i],
            bf16::from_f32(v as f32)
        );
        assert_eq!(out[2].as_slice::<i32>().unwrap()[i], v as i32);
        assert_eq!(out[3].as_slice::<i8>().unwrap()[i], v);
    }

    let narrow = pallas_call(narrow_to_i4)
        .input(ArrayType::new(shape, F32), spec())
        .input(ArrayType::new(shape, I32), spec())
        .output(ArrayType::new(shape, I4), spec())
        .output(ArrayType::new(shape, I4), spec())
        .output(ArrayType::new(shape, I4), spec())
        .output(ArrayType::new(shape, I4), spec())
        .build()
        .unwrap();
    // Floats at and around every integer of -10..=10, halves, the saturation edges, NaN, infinities.
    let mut fs: Vec<f32> = Vec::new();
    for k in -10..=10 {
        let x = k as f32;
        fs.extend([
            x,
            x + 0.5,
            x - 0.5,
            x + 0.999,
            f32::from_bits(x.to_bits() + 1),
        ]);
    }
    fs.extend([
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        -1e30,
        -0.0,
        7.9999,
        -8.9999,
    ]);
    fs.resize(ROWS * COLS, 0.25);
    // Integers: every value of -300..300 and the i32 extremes (wrapping).
    let mut ns: Vec<i32> = (-300..300).collect();
    ns.extend([i32::MIN, i32::MAX, i32::MIN + 7, 8, 15, 16, -9, -16, -17]);
    ns.resize(ROWS * COLS, 5);
    let xs = f32_array(fs.clone());
    let ni = HostArray::from_vec(shape, ns.clone()).unwrap();
    let out = both_engines(&narrow, &[xs, ni]);
    let sat = |x: f32| i4::saturating_from_f64(x as f64).get();
    let want_f: Vec<i8> = fs.iter().map(|&x| sat(x)).collect();
    let want_b: Vec<i8> = fs
        .iter()
        .map(|&x| sat(bf16::from_f32(x).to_f32()))
        .collect();
    let want_i: Vec<i8> = ns.iter().map(|&n| i4::wrapping(n as i64).get()).collect();
    let want_j: Vec<i8> = ns
        .iter()
        .map(|&n| i4::wrapping(n as i8 as i64).get())
        .collect();
    assert_eq!(
        i4_values(&out[0]),
        want_f,
        "f32 → int4: toward zero, saturated, NaN → 0"
    );
    assert_eq!(i4_values(&out[1]), want_b, "bf16 → int4");
    assert_eq!(i4_values(&out[2]), want_i, "i32 → int4 wraps");
    assert_eq!(i4_values(&out[3]), want_j, "i8 → int4 wraps");
    assert_eq!(
        &want_f[..5],
        &[-8, -8, -8, -8, -8],
        "-10 and around saturate"
    );
    assert_eq!(sat(f32::NAN), 0);
    assert_eq!(i4::wrapping(9).get(), -7);
}

fn i4_operands(m: usize, k: usize, n: usize) -> (Vec<i4>, Vec<i4>) {
    let x = (0..m * k)
        .map(|i| i4::wrapping((i * 5 % 16) as i64))
        .collect();
    let w = (0..k * n)
        .map(|i| i4::wrapping((i * 3 % 16) as i64))
        .collect();
    (x, w)
}

#[test]
fn int4_dots_are_exact_where_libtpu_takes_them_and_v4_refuses() {
    let (m, k, n) = (128, 256, 128);
    let (xv, wv) = i4_operands(m, k, n);
    let want: Vec<i32> = (0..m * n)
        .map(|ij| {
            let (i, j) = (ij / n, ij % n);
            (0..k)
                .map(|p| xv[i * k + p].get() as i32 * wv[p * n + j].get() as i32)
                .sum()
        })
        .collect();
    for &t in Target::ALL {
        let built = pallas_call(i4_dot)
            .target(t)
            .input(ArrayType::new([m, k], I4), whole([m, k]))
            .input(ArrayType::new([k, n], I4), whole([k, n]))
            .output(ArrayType::new([m, n], I32), whole([m, n]))
            .build();
        if t == Target::V4 {
            let e = built.expect_err("v4 refuses an int4 matmul, as libtpu does (E2001)");
            assert_eq!(e.kind, ErrorKind::DType);
            assert!(
                e.message.contains("v4 does not multiply int4 blocks"),
                "{}",
                e.message
            );
            assert!(e
                .location
                .expect("at the dot's line")
                .file
                .ends_with("dtypes.rs"));
            continue;
        }
        let call = built.unwrap_or_else(|e| panic!("{t}: {e}"));
        if t != Target::DEFAULT {
            continue;
        }
        let x = HostArray::from_vec([m, k], xv.clone()).unwrap();
        let w = HostArray::from_vec([k, n], wv.clone()).unwrap();
        let out = both_engines(&call, &[x, w]);
        assert_eq!(out[0].as_slice::<i32>().unwrap(), &want[..]);
    }
    // The weight-only form builds on every generation, v4 included (libtpu compiles it there).
    let (xf, _) = exact_operands(m, k, n);
    for &t in Target::ALL {
        let call = pallas_call(i4_weight_matmul)
            .target(t)
            .input(ArrayType::new([m, k], BF16), whole([m, k]))
            .input(ArrayType::new([k, n], I4), whole([k, n]))
            .output(ArrayType::new([m, n], F32), whole([m, n]))
            .build()
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        if t != Target::DEFAULT {
            continue;
        }
        let x =
            HostArray::from_vec([m, k], xf.iter().map(|v| bf16::from_f32(*v)).collect()).unwrap();
        let w = HostArray::from_vec([k, n], wv.clone()).unwrap();
        let out = both_engines(&call, &[x, w]);
        let wf: Vec<f32> = wv.iter().map(|v| v.to_f32()).collect();
        let want = reference_matmul(&xf, &wf, m, k, n);
        let got = out[0].as_slice::<f32>().unwrap();
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn int4_rank1_blocks_take_1024_element_tiles_and_the_hint_builds() {
    let launch = |block: usize| {
        pallas_call(copy_i4)
            .grid([4096 / block])
            .input(
                ArrayType::new([4096], I4),
                BlockSpec::new([block], |[i]| (i,)),
            )
            .output(
                ArrayType::new([4096], I4),
                BlockSpec::new([block], |[i]| (i,)),
            )
            .build()
    };
    // libtpu / Pallas: 1024 and 2048 compile, 512 is refused ("a multiple of 1024").
    let e = launch(512).expect_err("512 is not a multiple of int4's 1024-element tile");
    assert_eq!(e.kind, ErrorKind::Tiling);
    assert!(
        e.message.contains("divisible by 1024") && e.message.contains("try 1024"),
        "{}",
        e.message
    );
    launch(1024).expect("the hint builds");
    launch(2048).unwrap();
    // Rank 2: (8, 128) blocks, as every dtype.
    let call = pallas_call(copy_i4)
        .grid([8, 2])
        .input(
            ArrayType::new([64, 256], I4),
            BlockSpec::new([8, 128], |[i, j]| (i, j)),
        )
        .output(
            ArrayType::new([64, 256], I4),
            BlockSpec::new([8, 128], |[i, j]| (i, j)),
        )
        .build()
        .unwrap();
    let data = i4_data(64 * 256);
    let x = HostArray::from_vec([64, 256], data.clone()).unwrap();
    let out = both_engines(&call, &[x]);
    assert_eq!(
        i4_values(&out[0]),
        data.iter().map(|v| v.get()).collect::<Vec<_>>()
    );
}

#[test]
fn int4_lowers_to_mosaic_i4_and_its_casts() {
    let shape = [ROWS, COLS];
    let call = pallas_call(widen_i4)
        .input(ArrayType::new(shape, I4), whole(shape))
        .output(ArrayType::new(shape, F32), whole(shape))
        .output(ArrayType::new(shape, BF16), whole(shape))
        .output(ArrayType::new(shape, I32), whole(shape))
        .output(ArrayType::new(shape, I8), whole(shape))
        .build()
        .unwrap();
    let text = call.mosaic_mlir().unwrap();
    for (op, want) in [
        ("arith.sitofp", "vector<64x256xi4> to vector<64x256xf32>"),
        ("arith.sitofp", "vector<64x256xi4> to vector<64x256xbf16>"),
        ("arith.extsi", "vector<64x256xi4> to vector<64x256xi32>"),
        ("arith.extsi", "vector<64x256xi4> to vector<64x256xi8>"),
        ("func.func", "memref<64x256xi4, #tpu.memory_space<vmem>>"),
    ] {
        assert!(
            text.lines().any(|l| l.contains(op) && l.contains(want)),
            "missing `{op} .. {want}` in\n{text}"
        );
    }
    // The VMEM estimate counts int4 packed: half a byte per element, rows padded to 8 (to 8 below 5
    // rows too: 32 bits per lane). libtpu 0.0.51 on v5e, a whole-array (rows, 256) int4 copy (two
    // buffers), `used_scoped_memory_configs`: rows 1..=8 2048 bytes, 9..=16 4096, 17..=24 6144, 32
    // 8192, 33 10240, 64 16384, 65 18432.
    use tpu_kernel::runtime::check::padded_bytes;
    assert_eq!(padded_bytes(&[64, 256], I4), 64 * 256 / 2);
    for (rows, used) in [
        (1, 2048),
        (4, 2048),
        (5, 2048),
        (8, 2048),
        (9, 4096),
        (17, 6144),
        (32, 8192),
        (33, 10240),
        (64, 16384),
        (65, 18432),
    ] {
        assert_eq!(2 * padded_bytes(&[rows, 256], I4), used, "{rows} rows");
    }
}

#[test]
fn rank1_int4_blocks_shorter_than_a_tile_are_refused_even_whole_and_the_hints_build() {
    let launch = |n: usize| {
        pallas_call(copy_i4)
            .input(ArrayType::new([n], I4), BlockSpec::new([n], |[]| (0,)))
            .output(ArrayType::new([n], I4), BlockSpec::new([n], |[]| (0,)))
            .build()
    };
    launch(2048).expect("a whole 2048-long array");
    // libtpu: whole-array int4 blocks of 128, 512, 1536, 2000 are refused on every generation.
    for n in [128, 512, 1536, 2000] {
        let e = launch(n).expect_err("no whole-array exception for rank-1 int4");
        assert_eq!(e.kind, ErrorKind::Tiling);
        assert!(e.message.contains("multiple of 1024"), "{}", e.message);
    }
    // 2000: the hint is 1024-element blocks (the edge block padded), which builds.
    let e = launch(2000).unwrap_err();
    assert!(e.message.contains("try 1024"), "{}", e.message);
    pallas_call(copy_i4)
        .grid([2])
        .input(
            ArrayType::new([2000], I4),
            BlockSpec::new([1024], |[i]| (i,)),
        )
        .output(
            ArrayType::new([2000], I4),
            BlockSpec::new([1024], |[i]| (i,)),
        )
        .build()
        .expect("the hint builds");
    // 512: the hint is a 2-D array [4, 128], which builds.
    let e = launch(512).unwrap_err();
    assert!(
        e.message.contains("reshape the array to [4, 128]"),
        "{}",
        e.message
    );
    pallas_call(copy_i4)
        .input(ArrayType::new([4, 128], I4), whole([4, 128]))
        .output(ArrayType::new([4, 128], I4), whole([4, 128]))
        .build()
        .expect("the hint builds");
}

#[path = "common/xla.rs"]
mod xla;

#[tpu_kernel]
fn int4_sum_rows(x: Ref<i4>, o: RefMut<i4>, w: RefMut<i32>) {
    let v = x.load();
    o.store(v);
    w.store(v.cast::<i32>() * 3);
}

/// int4 through the XLA FFI handler, given S4 buffers packed two per byte as XLA:CPU lays them out
/// (an odd element count: the last byte half used).
#[export]
pub fn int4_through_ffi(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    pallas_call(int4_sum_rows)
        .input(x, whole([m, n]))
        .output(ArrayType::new([m, n], I4), whole([m, n]))
        .output(ArrayType::new([m, n], I32), whole([m, n]))
        .build()
}

#[test]
fn the_ffi_handler_unpacks_and_packs_xlas_s4_buffers() {
    use tpu_kernel::__private::export::{Library, Request};
    let lib = Library::new("int4", vec![__tpu_kernel_export_int4_through_ffi()]);
    let shape = [3, 131];
    let data = i4_data(3 * 131);
    let x = HostArray::from_vec(shape, data.clone()).unwrap();
    let req = serde_json::json!({"kernel": "int4_through_ffi", "inputs": [{"shape": shape, "dtype": "int4"}]});
    let built = lib.build(&Request::from_json(&req).unwrap()).unwrap();
    let input = xla::XlaBuffer::of(&x);
    assert_eq!(
        input.bytes().len(),
        197, // 393 elements
        "packed, as XLA hands S4 over"
    );
    assert_eq!(
        input.bytes()[0],
        data[0].to_bits() | (data[1].to_bits() << 4)
    );
    let (o, w) = (
        xla::XlaBuffer::zeros(&shape, I4),
        xla::XlaBuffer::zeros(&shape, I32),
    );
    xla::call(&lib, &built.ffi_request, &[&input], &[&o, &w]).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        o.bytes(),
        input.bytes(),
        "the int4 output packed back bit for bit"
    );
    assert_eq!(
        i4_values(&o.to_host()),
        data.iter().map(|v| v.get()).collect::<Vec<_>>()
    );
    let wants: Vec<i32> = data.iter().map(|v| v.get() as i32 * 3).collect();
    assert_eq!(w.to_host().as_slice::<i32>().unwrap(), &wants[..]);
}

#[test]
fn int4_host_arrays_refuse_values_out_of_range() {
    let ok = HostArray::from_i8_as_i4(
        [2, 8],
        &[-8, -1, 0, 7, 1, 2, 3, 4, -8, -1, 0, 7, 1, 2, 3, 4],
    )
    .unwrap();
    assert_eq!(i4_values(&ok)[..4], [-8, -1, 0, 7]);
    let e = HostArray::from_i8_as_i4([4], &[0, 7, 8, -9]).expect_err("8 is not an int4");
    assert_eq!(e.kind, ErrorKind::DType);
    assert!(e.message.contains("int4 element 2 is 8"), "{}", e.message);
    assert!(HostArray::from_i8_as_i4([1], &[-9]).is_err());
    assert_eq!(i4::new(8), None);
    assert_eq!(i4::new(-9), None);
}

/// An int4 window copied from HBM by DMA (rows 16..32 of a [64, 256] array), then stored.
#[tpu_kernel]
fn int4_dma_rows(x_hbm: Ref<i4, Any>, o: RefMut<i4>, buf: RefMut<i4>, sem: DmaSem) {
    let c = async_copy(x_hbm.at((16..32, ..)), buf, sem);
    c.start();
    c.wait();
    o.store(buf.load());
}

#[test]
fn int4_windows_copy_by_dma_in_both_engines() {
    let call = pallas_call(int4_dma_rows)
        .input_any(ArrayType::new([64, 256], I4))
        .output(ArrayType::new([16, 256], I4), whole([16, 256]))
        .scratch(Vmem::new([16, 256], I4))
        .scratch(DmaSem::one())
        .build()
        .unwrap();
    let data = i4_data(64 * 256);
    let x = HostArray::from_vec([64, 256], data.clone()).unwrap();
    let out = both_engines(&call, &[x]);
    let want: Vec<i8> = data[16 * 256..32 * 256].iter().map(|v| v.get()).collect();
    assert_eq!(i4_values(&out[0]), want);
    let text = call.mosaic_mlir().unwrap();
    assert!(
        text.contains("memref<16x256xi4, #tpu.memory_space<vmem>>"),
        "{text}"
    );
}

/// int4 with the unsigned types (sign-extended out, wrapped in — XLA's convert, which jax.jit gives:
/// int4 -1 → u8 255, u8 200 → int4 -8) and an int4 constant (`full`); libtpu compiles the Pallas
/// twins of these casts and of `jnp.full(.., int4)` on v4, v5e, v5p, v6e and tpu7x.
#[tpu_kernel]
fn i4_unsigned(
    x: Ref<i4>,
    u: Ref<u8>,
    w: Ref<u32>,
    a: RefMut<u8>,
    b: RefMut<u32>,
    c: RefMut<i4>,
    d: RefMut<i4>,
) {
    a.store(x.load().cast::<u8>());
    b.store(x.load().cast::<u32>());
    c.store(u.load().cast::<i4>());
    d.store(w.load().cast::<i4>());
}

#[tpu_kernel]
fn i4_constant(k: RefMut<i4>) {
    k.store(full([ROWS, COLS], i4::wrapping(-3)));
}

#[test]
fn int4_and_the_unsigned_types_and_constants_in_both_engines() {
    let shape = [ROWS, COLS];
    let t = |d| ArrayType::new(shape, d);
    let call = pallas_call(i4_unsigned)
        .input(t(I4), whole(shape))
        .input(t(U8), whole(shape))
        .input(t(U32), whole(shape))
        .output(t(U8), whole(shape))
        .output(t(U32), whole(shape))
        .output(t(I4), whole(shape))
        .output(t(I4), whole(shape))
        .build()
        .unwrap();
    let n = ROWS * COLS;
    let data = i4_data(n);
    let us: Vec<u8> = (0..n).map(|i| (i * 37) as u8).collect();
    let ws: Vec<u32> = (0..n)
        .map(|i| (i as u32).wrapping_mul(0x9E37_79B9))
        .collect();
    let out = both_engines(
        &call,
        &[
            HostArray::from_vec(shape, data.clone()).unwrap(),
            HostArray::from_vec(shape, us.clone()).unwrap(),
            HostArray::from_vec(shape, ws.clone()).unwrap(),
        ],
    );
    let a: Vec<u8> = data.iter().map(|v| v.get() as u8).collect();
    let b: Vec<u32> = data.iter().map(|v| v.get() as i32 as u32).collect();
    assert_eq!(out[0].as_slice::<u8>().unwrap(), &a[..]);
    assert_eq!(out[1].as_slice::<u32>().unwrap(), &b[..]);
    let c: Vec<i8> = us.iter().map(|&u| i4::wrapping(u as i64).get()).collect();
    let d: Vec<i8> = ws.iter().map(|&w| i4::wrapping(w as i64).get()).collect();
    assert_eq!(i4_values(&out[2]), c);
    assert_eq!(i4_values(&out[3]), d);
    let constant = pallas_call(i4_constant)
        .output(t(I4), whole(shape))
        .build()
        .unwrap();
    let k = both_engines(&constant, &[]);
    assert!(i4_values(&k[0]).iter().all(|&v| v == -3));
    assert_eq!(
        (i4::wrapping(-1).get() as u8, i4::wrapping(200).get()),
        (255, -8),
        "as jax.jit"
    );
}
