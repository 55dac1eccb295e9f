//! Interpreter inputs (issue 13, item 2c): every example kernel on inputs full of special values — NaN
//! (quiet and signalling, with payloads), ±inf, ±0, subnormals, the largest finite values — gives the
//! same bits fused or not, on worker threads or not (the interpreter's bit-identity invariant); and
//! wrong input counts, dtypes and shapes are errors naming the input, never a panic.
//!
//! CI runs `TPU_KERNEL_FUZZ_INTERPRET` seeds per example (default 2); the long run:
//! `TPU_KERNEL_FUZZ_INTERPRET=50 cargo test --release --test fuzz_interpret -- --nocapture`.

mod common;

use common::rng::Rng;
use common::EXAMPLES;
use std::panic::{catch_unwind, AssertUnwindSafe};
use tpu_kernel::prelude::*;
use tpu_kernel::reference::random_inputs;
use tpu_kernel::runtime::interpret::{HostArray, HostData, InterpretOptions};

/// f32 special values (bit patterns): NaNs with payloads (quiet, signalling, negative), infinities,
/// zeros, subnormals, extremes.
const SPECIAL_F32: [u32; 12] = [
    0x7fc0_0000, // quiet NaN
    0x7fc0_0001, // quiet NaN, payload 1
    0x7f80_0001, // signalling NaN
    0xffc0_1234, // negative quiet NaN with a payload
    0x7f80_0000, // +inf
    0xff80_0000, // -inf
    0x0000_0000, // +0
    0x8000_0000, // -0
    0x0000_0001, // smallest subnormal
    0x807f_ffff, // largest negative subnormal
    0x7f7f_ffff, // f32::MAX
    0xff7f_ffff, // f32::MIN
];

/// `x` with about one in `every` of its float elements replaced by special values (a quarter: most
/// rows poisoned; one in 512: single specials meeting finite neighbours).
fn spiked(x: &HostArray, r: &mut Rng, every: u64) -> HostArray {
    let data = match x.data() {
        HostData::F32(v) => HostData::F32(
            v.iter()
                .map(|&e| match r.next() % every {
                    0 => f32::from_bits(SPECIAL_F32[(r.next() % 12) as usize]),
                    _ => e,
                })
                .collect(),
        ),
        HostData::BF16(v) => HostData::BF16(
            v.iter()
                .map(|&e| match r.next() % every {
                    0 => {
                        let high = (SPECIAL_F32[(r.next() % 12) as usize] >> 16) as u16;
                        bf16::from_bits(high | (r.next() as u16 & 1)) // a payload bit too
                    }
                    _ => e,
                })
                .collect(),
        ),
        _ => return x.clone(),
    };
    HostArray::new(x.shape(), data).expect("same shape")
}

fn bits(a: &HostArray) -> Vec<u64> {
    (0..a.len())
        .map(|i| match a.data() {
            HostData::F32(v) => v[i].to_bits() as u64,
            HostData::BF16(v) => v[i].to_bits() as u64,
            HostData::I32(v) => v[i] as u32 as u64,
            HostData::I8(v) => v[i] as u8 as u64,
            HostData::U8(v) => v[i] as u64,
            HostData::U32(v) => v[i] as u64,
            HostData::Bool(v) => v[i] as u64,
            HostData::F16(v) => v[i].to_bits() as u64,
            HostData::F8E4M3FN(v) => v[i].to_bits() as u64,
            HostData::F8E5M2(v) => v[i].to_bits() as u64,
            HostData::I4(v) => v[i].to_bits() as u64,
        })
        .collect()
}

#[test]
fn special_values_give_the_same_bits_fused_or_not_threaded_or_not() {
    let seeds: u64 = std::env::var("TPU_KERNEL_FUZZ_INTERPRET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let mut compared = 0usize;
    for (name, build) in EXAMPLES {
        let call = build().unwrap_or_else(|e| panic!("{name}: {e}"));
        for seed in 0..seeds {
            let mut r = Rng(seed * 1000 + name.len() as u64);
            let inputs: Vec<HostArray> = random_inputs(&call, seed)
                .iter()
                .map(|x| spiked(x, &mut r, if seed % 2 == 0 { 512 } else { 4 }))
                .collect();
            let run = |fuse, parallel| {
                let opts = InterpretOptions {
                    fuse,
                    parallel,
                    ..Default::default()
                };
                call.interpret_with(&inputs, &opts).unwrap_or_else(|e| {
                    panic!("{name} seed {seed} fuse {fuse} parallel {parallel}: {e}")
                })
            };
            let plain = run(false, false);
            for (fuse, parallel) in [(true, true), (true, false), (false, true)] {
                let got = run(fuse, parallel);
                for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
                    let (g, p) = (bits(g), bits(p));
                    if let Some(at) = (0..g.len()).find(|&j| g[j] != p[j]) {
                        panic!(
                            "{name} seed {seed}: output {i} element {at} is {:#x} (fuse {fuse}, parallel {parallel}) but {:#x} plain",
                            g[at], p[at]
                        );
                    }
                }
                compared += 1;
            }
        }
    }
    println!("fuzz_interpret: {compared} runs compared bit for bit against the plain path");
}

#[test]
fn wrong_input_counts_dtypes_and_shapes_are_errors_naming_the_input() {
    for (name, build) in EXAMPLES {
        let call = build().unwrap_or_else(|e| panic!("{name}: {e}"));
        let good = random_inputs(&call, 0);
        let mut cases: Vec<(String, Vec<HostArray>)> = vec![
            ("one input too few".into(), good[..good.len() - 1].to_vec()),
            (
                "one input too many".into(),
                [good.clone(), vec![good[0].clone()]].concat(),
            ),
        ];
        for i in 0..good.len() {
            let mut wrong_dtype = good.clone();
            let other = if good[i].dtype() == F32 { I32 } else { F32 };
            wrong_dtype[i] = HostArray::zeros(good[i].shape(), other).unwrap();
            cases.push((format!("input {i} as {other}"), wrong_dtype));
            let mut wrong_shape = good.clone();
            let mut shape = good[i].shape().to_vec();
            shape[0] += 1;
            wrong_shape[i] = HostArray::zeros(&shape, good[i].dtype()).unwrap();
            cases.push((format!("input {i} of shape {shape:?}"), wrong_shape));
        }
        for (what, inputs) in cases {
            let r = catch_unwind(AssertUnwindSafe(|| call.interpret(&inputs)))
                .unwrap_or_else(|_| panic!("{name}, {what}: the interpreter panicked"));
            let e = r.expect_err(&format!("{name}, {what}: accepted"));
            assert!(
                e.message.contains("input") || e.argument.is_some(),
                "{name}, {what}: the error names no input: {e}"
            );
        }
    }
}

/// The reproducer: a signalling NaN in rmsnorm's x next to a NaN in w (and other payload
/// pairs) gives one result on every path — it once came out 0x7fc0 fused and 0x7fc1 plain.
#[test]
fn rmsnorm_nan_payloads_are_the_same_on_every_path() {
    let call = common::rmsnorm::build().expect("builds");
    let inputs = random_inputs(&call, 0);
    let (mut x, mut w) = (
        inputs[0].clone().into_vec::<bf16>().expect("bf16 x"),
        inputs[1].clone().into_vec::<f32>().expect("f32 w"),
    );
    for (xb, wb) in [
        (0x7f81u16, 0x7fc0_0000u32),
        (0x7f81, 0x7f80_0001),
        (0x7fc1, 0xffc0_0000),
        (0x7f80, 0x7fc0_0001),
    ] {
        x[3] = bf16::from_bits(xb);
        w[3] = f32::from_bits(wb);
        let inputs = [
            HostArray::from_vec(inputs[0].shape(), x.clone()).unwrap(),
            HostArray::from_vec(inputs[1].shape(), w.clone()).unwrap(),
        ];
        let got: Vec<u16> = [(false, false), (true, true), (true, false), (false, true)]
            .into_iter()
            .map(|(fuse, parallel)| {
                let opts = InterpretOptions {
                    fuse,
                    parallel,
                    ..Default::default()
                };
                let o = call.interpret_with(&inputs, &opts).expect("runs");
                o[0].as_slice::<bf16>().expect("bf16")[3].to_bits()
            })
            .collect();
        assert!(
            got.iter().all(|&b| b == got[0]),
            "x {xb:#x}, w {wb:#x}: {got:x?}"
        );
        assert_eq!(got[0] & 0x7f80, 0x7f80, "a NaN: {got:x?}");
    }
}
