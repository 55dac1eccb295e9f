//! Paged-attention decode (the access pattern of jax's Pallas TPU `paged_attention`): one query token
//! per sequence attends to its keys and values, which live in a KV cache of fixed-size pages left in
//! HBM (`input_any`). Two scalar-prefetched i32 tables say which pages a sequence owns and how many of
//! its tokens are valid: `lengths [batch]` and `page_indices [batch, pages_per_seq]` (the block table).
//!
//! Grid step `(b, h)` computes the `G = num_heads / num_kv_heads` query heads of sequence `b` that
//! share kv head `h` (grouped-query attention: one `[G, head_dim]` query block, one MXU pass for all
//! `G` heads). It walks the sequence's pages in groups of `pages_per_compute_block`: only the
//! `ceil(len / page_size)` pages the sequence owns are DMA'd into VMEM, each group into one of two
//! slots while the previous group is computed (the next group's copies are in flight during the
//! current group's math), and an online softmax carries the running max, sum and output across
//! groups. Scores past the length are masked, so a 1-token sequence and a many-page one run the same
//! kernel; a length of 0 gives zeros.
//!
//! The last group of a sequence usually holds fewer owned pages than the slot has room for. Its
//! unowned key pages are left as they are (their scores are masked by a select, which drops whatever
//! the stale rows hold), and its unowned value pages are zeroed, so `p @ v` adds exactly `0` for them.

use tpu_kernel::prelude::*;

/// The score of a position past the length (jax's paged-attention mask value): finite, so
/// `exp(MASK_VALUE - max)` is 0 and no `inf - inf` can arise.
const MASK_VALUE: f32 = -0.7 * f32::MAX;

/// Start the DMAs of page group `g` of sequence `b` (kv head `h`) into slot `slot`: only the pages of
/// the group the sequence owns (`n_pages` in all), key page `j` to `k_buf[slot, j]` and value page `j`
/// to `v_buf[slot, j]`, counted on `sems[0, slot]` and `sems[1, slot]`; the value pages past them are
/// zeroed.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn start_group(
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
    let first = g * per_group;
    let owned = (n_pages - first).min(per_group);
    for j in 0..owned {
        let page = page_indices.at((b, first + j)).load();
        let k_sem = sems.at((0, slot));
        async_copy(k_pages.at((h, page)), k_buf.at((slot, j)), k_sem).start();
        let v_sem = sems.at((1, slot));
        async_copy(v_pages.at((h, page)), v_buf.at((slot, j)), v_sem).start();
    }
    for j in owned..per_group {
        v_buf.at((slot, j)).store(zeros());
    }
}

/// Wait for the `owned` key and value pages [`start_group`] copies into slot `slot`. A wait needs only
/// the destination and the semaphore: the destination stands in for the source, so no page number is
/// read again.
#[kernel_fn]
fn wait_group(
    (k_buf, v_buf): (RefMut<bf16>, RefMut<bf16>),
    sems: DmaSem,
    owned: Scalar<i32>,
    slot: Scalar<i32>,
) {
    for j in 0..owned {
        let k_sem = sems.at((0, slot));
        async_copy(k_buf.at((slot, j)), k_buf.at((slot, j)), k_sem).wait();
        let v_sem = sems.at((1, slot));
        async_copy(v_buf.at((slot, j)), v_buf.at((slot, j)), v_sem).wait();
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
        start_group(page_indices, pages, bufs, sems, (b, h), n_pages, zero, zero);
    }
    let q = q.load();
    let mut m = full([heads, 1], f32::NEG_INFINITY);
    let mut l = full([heads, 1], 0.0f32);
    let mut acc = full([heads, head_dim], 0.0f32);
    for g in 0..n_groups {
        let slot = g % 2;
        if g + 1 < n_groups {
            start_group(
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
        let owned = (n_pages - g * per_group).min(per_group);
        wait_group(bufs, sems, owned, slot);
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
    // l >= 1 once a token is seen (the largest score adds exp(0)); 0 only for an empty sequence.
    o.store((acc / maximum(l, 1.0)).cast::<bf16>());
}

/// Decode attention over a paged KV cache: `o[b, i] = softmax(q[b, i] . k[b, :len]) @ v[b, :len]`
/// (no scaling: pass `q` pre-scaled), with `k`/`v` of sequence `b` gathered from the pages
/// `page_indices[b, ..]` of kv head `i / G`. bf16 `q [batch, num_heads, head_dim]`, bf16 `k_pages`
/// and `v_pages [num_kv_heads, total_pages, page_size, head_dim]` (left in HBM), i32 `lengths [batch]`
/// (each at most `pages_per_seq * page_size`) and `page_indices [batch, pages_per_seq]` (page numbers
/// below `total_pages`; entries past a sequence's pages are never read); bf16 out like `q`.
#[export]
pub fn paged_attention(
    lengths: ArrayType,
    page_indices: ArrayType,
    q: ArrayType,
    k_pages: ArrayType,
    v_pages: ArrayType,
    #[default(8)] pages_per_compute_block: usize,
) -> Result<PallasCall, KernelError> {
    let [batch, num_heads, head_dim] = q.dims()?;
    let [num_kv_heads, _, page_size, kd] = k_pages.dims()?;
    let [lb] = lengths.dims()?;
    let [tb, _] = page_indices.dims()?;
    let per_group = pages_per_compute_block;
    for (name, a) in [("lengths", &lengths), ("page_indices", &page_indices)] {
        require(
            a.dtype == I32,
            format!("{name} is {}: it must be i32", a.dtype),
        )?;
    }
    for (name, a) in [("q", &q), ("k_pages", &k_pages), ("v_pages", &v_pages)] {
        require(
            a.dtype == BF16,
            format!("{name} is {}: this kernel takes bf16", a.dtype),
        )?;
    }
    require(
        v_pages.shape == k_pages.shape,
        format!(
            "k_pages is {:?} but v_pages is {:?}",
            k_pages.shape, v_pages.shape
        ),
    )?;
    require(
        kd == head_dim,
        format!("q has head_dim {head_dim}, the pages {kd}"),
    )?;
    require(
        lb == batch && tb == batch,
        format!("q has batch {batch}, lengths {lb}, page_indices {tb}: they must agree"),
    )?;
    require(
        num_kv_heads > 0 && num_heads % num_kv_heads == 0,
        format!("{num_heads} query heads do not split over {num_kv_heads} kv heads"),
    )?;
    require(per_group > 0, "pages_per_compute_block must be positive")?;
    let group = num_heads / num_kv_heads;
    // Step (b, h): the G query heads of kv head h in sequence b, a [G, head_dim] block.
    let heads_of = || BlockSpec::new([1, group, head_dim], |[b, h]| (b, h, 0)).squeeze(0);
    pallas_call(paged_attention_kernel)
        .grid([batch, num_kv_heads])
        .scalar_prefetch(lengths)
        .scalar_prefetch(page_indices)
        .input(q.clone(), heads_of())
        .input_any(k_pages.clone())
        .input_any(v_pages)
        .output(q, heads_of())
        .scratch(Vmem::new([2, per_group, page_size, head_dim], BF16))
        .scratch(Vmem::new([2, per_group, page_size, head_dim], BF16))
        .scratch(DmaSem::array([2, 2]))
        .dimension_semantics([Parallel, Parallel])
        .build()
}

/// The example's shapes: 8 sequences of up to 32 pages of 16 tokens (512 tokens), 16 query heads
/// over 2 kv heads (G = 8), head_dim 128, a pool of 256 pages, 8 pages (128 tokens) per group.
pub fn build() -> Result<PallasCall, KernelError> {
    let (batch, heads, kv_heads, head_dim) = (8, 16, 2, 128);
    let (total_pages, page_size, pages_per_seq) = (256, 16, 32);
    paged_attention(
        ArrayType::new([batch], I32),
        ArrayType::new([batch, pages_per_seq], I32),
        ArrayType::new([batch, heads, head_dim], BF16),
        ArrayType::new([kv_heads, total_pages, page_size, head_dim], BF16),
        ArrayType::new([kv_heads, total_pages, page_size, head_dim], BF16),
        8,
    )
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
