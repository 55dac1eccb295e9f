//! The example kernels, included as modules so tests use exactly what the examples build.
#![allow(dead_code)]

#[path = "../../examples/activations.rs"]
pub mod activations;
#[path = "../../examples/add.rs"]
pub mod add;
#[path = "../../examples/all_gather_matmul.rs"]
pub mod all_gather_matmul;
#[path = "../../examples/causal_mask.rs"]
pub mod causal_mask;
#[path = "../../examples/colsum.rs"]
pub mod colsum;
#[path = "../../examples/dma_double.rs"]
pub mod dma_double;
#[path = "../../examples/flash_attention.rs"]
pub mod flash_attention;
#[path = "../../examples/fori_rowsum.rs"]
pub mod fori_rowsum;
#[path = "../../examples/gather_prefetch.rs"]
pub mod gather_prefetch;
#[path = "../../examples/grouped_matmul.rs"]
pub mod grouped_matmul;
#[path = "../../examples/inplace_scale.rs"]
pub mod inplace_scale;
#[path = "../../examples/matmul.rs"]
pub mod matmul;
#[path = "../../examples/ops_tour.rs"]
pub mod ops_tour;
#[path = "../../examples/paged_attention.rs"]
pub mod paged_attention;
#[path = "../../examples/paged_gather.rs"]
pub mod paged_gather;
#[path = "../../examples/quantized_matmul.rs"]
pub mod quantized_matmul;
#[path = "../../examples/quantized_matmul_w8a8.rs"]
pub mod quantized_matmul_w8a8;
#[path = "../../examples/ragged_paged_attention.rs"]
pub mod ragged_paged_attention;
#[path = "../../examples/ring_all_gather.rs"]
pub mod ring_all_gather;
#[path = "../../examples/ring_reduce_scatter.rs"]
pub mod ring_reduce_scatter;
#[path = "../../examples/rmsnorm.rs"]
pub mod rmsnorm;
#[path = "../../examples/softmax.rs"]
pub mod softmax;
#[path = "../../examples/strided.rs"]
pub mod strided;
#[path = "../../examples/transpose.rs"]
pub mod transpose;
#[path = "../../examples/values.rs"]
pub mod values;

pub mod coverage;
pub mod kernels;
pub mod rng;

use tpu_kernel::{KernelError, PallasCall};

/// An example's `build` function.
pub type Build = fn() -> Result<PallasCall, KernelError>;

/// Every example: (name, build).
pub const EXAMPLES: &[(&str, Build)] = &[
    ("add", add::build),
    ("matmul", matmul::build),
    ("softmax", softmax::build),
    ("rmsnorm", rmsnorm::build),
    ("causal_mask", causal_mask::build),
    ("fori_rowsum", fori_rowsum::build),
    ("strided", strided::build),
    ("transpose", transpose::build),
    ("colsum", colsum::build),
    ("ops_tour", ops_tour::build),
    ("activations", activations::build),
    ("grouped_matmul", grouped_matmul::build),
    ("gather_prefetch", gather_prefetch::build),
    ("dma_double", dma_double::build),
    ("inplace_scale", inplace_scale::build),
    ("paged_gather", paged_gather::build),
    ("paged_attention", paged_attention::build),
    ("ragged_paged_attention", ragged_paged_attention::build),
    ("quantized_matmul", quantized_matmul::build),
    ("quantized_matmul_w8a8", quantized_matmul_w8a8::build),
    ("flash_attention", flash_attention::build),
    ("values", values::build),
];

/// The examples that talk to other devices of a mesh (remote copies, the barrier semaphore): built,
/// lowered and compiled like the others; the CPU engines run one device, so they are not interpreted.
pub const SPMD_EXAMPLES: &[(&str, Build)] = &[
    ("ring_all_gather", ring_all_gather::build),
    ("ring_reduce_scatter", ring_reduce_scatter::build),
    ("all_gather_matmul", all_gather_matmul::build),
];

/// Every example, one-device and SPMD.
pub fn all_examples() -> impl Iterator<Item = &'static (&'static str, Build)> {
    EXAMPLES.iter().chain(SPMD_EXAMPLES)
}

/// The Mosaic text of an example (built, lowered, verified by melior).
pub fn mosaic(name: &str) -> String {
    let (_, build) = all_examples()
        .find(|(n, _)| *n == name)
        .expect("unknown example");
    let call = build().unwrap_or_else(|e| panic!("{name}: build failed: {e}"));
    call.mosaic_mlir()
        .unwrap_or_else(|e| panic!("{name}: lowering failed: {e}"))
}
