//! The example kernels exported as a kernel library: the same `examples/*.rs` files the example
//! binaries build, compiled into one `cdylib` whose C ABI the Python package loads as
//! `tpu_kernel.examples` (`pip install .` builds it and ships it inside the package), with the host
//! helpers the package's wrappers call (`group_metadata`).

#[allow(dead_code)]
#[path = "../../examples/activations.rs"]
mod activations;
#[allow(dead_code)]
#[path = "../../examples/add.rs"]
mod add;
#[allow(dead_code)]
#[path = "../../examples/all_gather_matmul.rs"]
mod all_gather_matmul;
#[allow(dead_code)]
#[path = "../../examples/causal_mask.rs"]
mod causal_mask;
#[allow(dead_code)]
#[path = "../../examples/colsum.rs"]
mod colsum;
#[allow(dead_code)]
#[path = "../../examples/dma_double.rs"]
mod dma_double;
#[allow(dead_code)]
#[path = "../../examples/flash_attention.rs"]
mod flash_attention;
#[allow(dead_code)]
#[path = "../../examples/fori_rowsum.rs"]
mod fori_rowsum;
#[allow(dead_code)]
#[path = "../../examples/gather_prefetch.rs"]
mod gather_prefetch;
#[allow(dead_code)]
#[path = "../../examples/grouped_matmul.rs"]
mod grouped_matmul;
#[allow(dead_code)]
#[path = "../../examples/inplace_scale.rs"]
mod inplace_scale;
#[allow(dead_code)]
#[path = "../../examples/matmul.rs"]
mod matmul;
#[allow(dead_code)]
#[path = "../../examples/ops_tour.rs"]
mod ops_tour;
#[allow(dead_code)]
#[path = "../../examples/paged_attention.rs"]
mod paged_attention;
#[allow(dead_code)]
#[path = "../../examples/paged_gather.rs"]
mod paged_gather;
#[allow(dead_code)]
#[path = "../../examples/quantized_matmul.rs"]
mod quantized_matmul;
#[allow(dead_code)]
#[path = "../../examples/quantized_matmul_w8a8.rs"]
mod quantized_matmul_w8a8;
#[allow(dead_code)]
#[path = "../../examples/ragged_paged_attention.rs"]
mod ragged_paged_attention;
#[allow(dead_code)]
#[path = "../../examples/ring_all_gather.rs"]
mod ring_all_gather;
#[allow(dead_code)]
#[path = "../../examples/ring_reduce_scatter.rs"]
mod ring_reduce_scatter;
#[allow(dead_code)]
#[path = "../../examples/rmsnorm.rs"]
mod rmsnorm;
#[allow(dead_code)]
#[path = "../../examples/softmax.rs"]
mod softmax;
#[allow(dead_code)]
#[path = "../../examples/strided.rs"]
mod strided;
#[path = "../../examples/transpose.rs"]
mod transpose;
#[allow(dead_code)]
#[path = "../../examples/values.rs"]
mod values;

tpu_kernel::export_library!(
    "examples",
    [
        activations::activations,
        all_gather_matmul::all_gather_matmul_launch,
        add::add,
        causal_mask::causal_mask,
        colsum::colsum,
        dma_double::dma_double,
        flash_attention::flash_attention,
        flash_attention::flash_attention_fwd,
        flash_attention::flash_attention_dkv,
        flash_attention::flash_attention_dq,
        fori_rowsum::fori_rowsum,
        gather_prefetch::gather_prefetch,
        grouped_matmul::grouped_matmul,
        inplace_scale::inplace_scale,
        matmul::matmul,
        matmul::matmul_dx,
        matmul::matmul_dw,
        ops_tour::ops_tour,
        paged_attention::paged_attention,
        paged_gather::paged_gather,
        quantized_matmul::quantized_matmul,
        quantized_matmul_w8a8::quantized_matmul_w8a8,
        ragged_paged_attention::ragged_paged_attention_launch,
        ring_all_gather::ring_all_gather,
        ring_reduce_scatter::ring_reduce_scatter,
        rmsnorm::rmsnorm,
        rmsnorm::rmsnorm_bwd,
        softmax::softmax,
        strided::strided,
        transpose::transpose,
        values::values,
    ],
    // plain Rust the Python package calls instead of re-implementing it
    host = [
        grouped_matmul::group_metadata,
        ragged_paged_attention::rpa_default_block_sizes
    ],
);
