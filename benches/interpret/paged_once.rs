//! `paged_decode_wait_once` (issue 22): the example's paged decode (`examples/paged_attention.rs`,
//! same shapes, inputs and reference) with the DMA pattern of production paged kernels (tpu-inference's
//! ragged paged attention): every group copies all its `per_group` pages — past the sequence's last
//! page, that page again, masked out by position like the tail of the last page — and the compute
//! step **waits once per slot** for all of them (one wait on the whole slot's window, whose bytes are
//! the sum of its page copies: byte-counted semaphores) instead of once per page. The kernel keeps the
//! example's name so that `tpu_kernel::reference` gives its inputs and expected outputs.
use tpu_kernel::prelude::*;

const MASK_VALUE: f32 = -0.7 * f32::MAX;

/// Start the `per_group` page copies of group `g` of sequence `b`, kv head `h`, into `slot`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn start_slot(
    page_indices: Ref<i32, Smem>,
    (k_pages, v_pages): (Ref<bf16, Any>, Ref<bf16, Any>),
    (k_buf, v_buf): (RefMut<bf16>, RefMut<bf16>),
    sems: DmaSem,
    (b, h): (Scalar<i32>, Scalar<i32>),
    n_pages: Scalar<i32>,
    g: Scalar<i32>,
    slot: Scalar<i32>,
) {
    let per_group = k_buf.shape()[1];
    for j in 0..per_group {
        let page = page_indices
            .at((b, (g * per_group + j).min(n_pages - 1)))
            .load();
        async_copy(
            k_pages.at((h, page)),
            k_buf.at((slot, j)),
            sems.at((0, slot)),
        )
        .start();
        async_copy(
            v_pages.at((h, page)),
            v_buf.at((slot, j)),
            sems.at((1, slot)),
        )
        .start();
    }
}

#[tpu_kernel]
#[allow(clippy::too_many_arguments)]
fn paged_attention_kernel(
    lengths: Ref<i32, Smem>,
    page_indices: Ref<i32, Smem>,
    q: Ref<bf16>,
    k_pages: Ref<bf16, Any>,
    v_pages: Ref<bf16, Any>,
    o: RefMut<bf16>,
    k_buf: RefMut<bf16>,
    v_buf: RefMut<bf16>,
    sems: DmaSem,
) {
    let (b, h) = (program_id(0), program_id(1));
    let (per_group, page_size) = (k_buf.shape()[1], k_buf.shape()[2]);
    let (heads, head_dim) = (q.shape()[0], q.shape()[1]);
    let tokens = per_group * page_size;
    let length = lengths.at(b).load();
    let n_pages = (length + (page_size - 1)) / page_size;
    let n_groups = (length + (tokens - 1)) / tokens;
    let (pages, bufs) = ((k_pages, v_pages), (k_buf, v_buf));
    if n_groups > 0 {
        let zero = scalar(0i32);
        start_slot(page_indices, pages, bufs, sems, (b, h), n_pages, zero, zero);
    }
    let q = q.load();
    let mut m = full([heads, 1], f32::NEG_INFINITY);
    let mut l = full([heads, 1], 0.0f32);
    let mut acc = full([heads, head_dim], 0.0f32);
    for g in 0..n_groups {
        let slot = g % 2;
        if g + 1 < n_groups {
            start_slot(
                page_indices,
                pages,
                bufs,
                sems,
                (b, h),
                n_pages,
                g + 1,
                1 - slot,
            );
        }
        // One wait per buffer for the whole slot: its bytes are all its pages' copies.
        async_copy(k_buf.at(slot), k_buf.at(slot), sems.at((0, slot))).wait();
        async_copy(v_buf.at(slot), v_buf.at(slot), sems.at((1, slot))).wait();
        let k = k_buf.at(slot).load().reshape([tokens, head_dim]);
        let s = dot_nt(q, k);
        let position = iota::<i32>([heads, tokens], 1) + g * tokens;
        let s = select(position < length, s, MASK_VALUE);
        let m_prev = m;
        m = maximum(m_prev, s.max_keepdims(1));
        let alpha = (m_prev - m).exp();
        let p = (s - m).exp();
        l = alpha * l + p.sum_keepdims(1);
        let v = v_buf.at(slot).load().reshape([tokens, head_dim]);
        acc = acc * alpha + dot(p.cast::<bf16>(), v);
    }
    o.store((acc / maximum(l, 1.0)).cast::<bf16>());
}

/// At the example's shapes (see `examples/paged_attention.rs`'s `build`).
pub fn build() -> Result<PallasCall, KernelError> {
    let (batch, heads, kv_heads, head_dim) = (8, 16, 2, 128);
    let (total_pages, page_size, pages_per_seq, per_group) = (256, 16, 32, 8);
    let group = heads / kv_heads;
    let q = ArrayType::new([batch, heads, head_dim], BF16);
    let pages = ArrayType::new([kv_heads, total_pages, page_size, head_dim], BF16);
    let heads_of = || BlockSpec::new([1, group, head_dim], |[b, h]| (b, h, 0)).squeeze(0);
    pallas_call(paged_attention_kernel)
        .grid([batch, kv_heads])
        .scalar_prefetch(ArrayType::new([batch], I32))
        .scalar_prefetch(ArrayType::new([batch, pages_per_seq], I32))
        .input(q.clone(), heads_of())
        .input_any(pages.clone())
        .input_any(pages)
        .output(q, heads_of())
        .scratch(Vmem::new([2, per_group, page_size, head_dim], BF16))
        .scratch(Vmem::new([2, per_group, page_size, head_dim], BF16))
        .scratch(DmaSem::array([2, 2]))
        .dimension_semantics([Parallel, Parallel])
        .build()
}
