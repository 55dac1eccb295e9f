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
