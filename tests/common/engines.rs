//! The two CPU engines held to one answer: the interpreter and the Mosaic module run on the CPU
//! (`mosaic_cpu`), compared bit for bit, and the one-block launch the construct suites build.
#![allow(dead_code)] // each suite uses some of these

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::HostArray;
use tpu_kernel::runtime::mosaic_cpu;
use tpu_kernel::KernelError;

/// An f32 array's elements as their bits (so NaN payloads and signed zeros compare).
pub fn f32_bits(a: &HostArray) -> Vec<u32> {
    a.as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// An f32 or i32 array's elements as bits.
pub fn bits(a: &HostArray) -> Vec<u32> {
    let v = a
        .as_slice::<f32>()
        .map(|s| s.iter().map(|x| x.to_bits()).collect())
        .or_else(|| {
            a.as_slice::<i32>()
                .map(|s| s.iter().map(|x| *x as u32).collect())
        });
    v.expect("f32 or i32 output")
}

/// `x[i] = (i * 37 % 101 - 50) / 4`: exact in f32, both signs, no two neighbours equal; the values
/// and the array.
pub fn f32_input(shape: [usize; 2]) -> (Vec<f32>, HostArray) {
    let v: Vec<f32> = (0..shape[0] * shape[1])
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
        .collect();
    (v.clone(), HostArray::from_vec(shape, v).unwrap())
}

/// The interpreter and the Mosaic module run on the CPU give the same bits (f32 or i32 outputs);
/// the interpreter's outputs.
pub fn engines_agree(call: &PallasCall, inputs: &[HostArray]) -> Vec<HostArray> {
    let want = call
        .interpret(inputs)
        .unwrap_or_else(|e| panic!("{}: interpret: {e}", call.name()));
    let got = mosaic_cpu::compile(call.ir())
        .and_then(|c| c.run(inputs))
        .unwrap_or_else(|e| panic!("{}: mosaic_cpu: {e}", call.name()));
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(bits(g), bits(w), "{}: engines differ", call.name());
    }
    want
}

/// A one-step launch of `kernel` over one f32 input block and one f32 output block, each its whole
/// array.
pub fn one_block(
    kernel: impl tpu_kernel::launch::KernelFn<(Ref<f32>, RefMut<f32>)>,
    input: [usize; 2],
    output: [usize; 2],
) -> Result<PallasCall, KernelError> {
    pallas_call(kernel)
        .grid([1])
        .input(
            ArrayType::new(input, F32),
            BlockSpec::new(input, |[_]| (0, 0)),
        )
        .output(
            ArrayType::new(output, F32),
            BlockSpec::new(output, |[_]| (0, 0)),
        )
        .build()
}
