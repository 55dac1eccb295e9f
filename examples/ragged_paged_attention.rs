//! Ragged paged attention (issue 23): the algorithm of tpu-inference's ragged paged attention v3 —
//! vLLM TPU's production attention — with its Python signature and KV cache layout, written with
//! this crate's primitives.
//!
//! **Inputs** (tpu-inference's): `queries [T, Hq, D]`, the new tokens' `keys` and `values`
//! `[T, Hkv, D]`, the paged `kv_cache [pages, page_size, 2 Hkv / packing, packing, D]` (a token's
//! row holds key 0, value 0, key 1, value 1, …; bf16 packs a key and its value into one 32-bit word,
//! key in the low half), i32 `kv_lens [S]`, `page_indices [S * pages_per_seq]` (the block table,
//! flattened), `cu_q_lens [S + 1]` (sequence `s` owns query tokens `cu_q_lens[s]..cu_q_lens[s+1]`,
//! the last `q_len` of its `kv_len` tokens) and `distribution [3]`: sequences `0..d0` decode (one
//! query token), `d0..d1` prefill in chunks, `d1..d2` are mixed. **Outputs**: the attention
//! `[T, Hq, D]` of every query token against its sequence's first `kv_len` tokens (causal), and
//! the KV cache with the new tokens written into their pages (aliased to `kv_cache`).
//!
//! **One launch, `grid = (1,)`, everything in HBM** (`input_any`): the kernel walks the sequences
//! of each case (decode, prefill, mixed — one specialised loop each, the range read from
//! `distribution`, block sizes per case), and for each sequence
//! 1. writes its new keys and values into the cache: they are copied into VMEM per kv head,
//!    interleaved into the cache's row layout (for bf16: one u32 word per key/value pair, through a
//!    `u32` view of the buffer and strided stores), and copied to their pages — one copy per page
//!    touched, of a run-time number of rows (`ds(row, n)`), all counted on one semaphore and
//!    retired by one wait;
//! 2. for each block of `bq` query tokens (fetched by DMA) walks its KV blocks of `bkv` tokens:
//!    block `b + 1`'s pages are copied into one slot of a double buffer (one copy per page, of only
//!    the rows the sequence owns) while block `b` is computed from the other; keys and values come
//!    out of the slot through a `u32` view by strided loads (a kv head's rows are `2 Hkv / packing`
//!    apart), `bkv_c` tokens at a time; an online softmax (flash attention) carries the running
//!    max, sum and output of every query row in VMEM scratch;
//! 3. divides by the sum and sends the block's output to HBM.
//!
//! Grouped-query attention: the `G = Hq / Hkv` query heads of a kv head share one `[G·rows, D]`
//! matrix product. Decode blocks hold one token, so its `G` heads are `G` rows of one `[Hq, D]`
//! fetch; prefill and mixed blocks are fetched head by head into `[Hq, bq, D]` so a kv head's
//! queries are one `[G, bq_c, D]` window (`bq_c` rows per head, a multiple of the sublane tile).
//!
//! Masks: a key past the sequence's query position (causal; not in decode, whose one query is the
//! last token), past `kv_len`, or, with `sliding_window = w`, `w` or more tokens before the query,
//! scores `mask_value`; values past `kv_len` are zeroed (the rows a copy did not fill hold stale
//! data). KV blocks wholly before a query block's window are not fetched.

use tpu_kernel::dtype::{DotElement, Element};
use tpu_kernel::prelude::*;

/// The element types the KV cache may hold: how a kv head's keys and values are laid out in the
/// `u32` words of a cache row. f32 (packing 1): key `h` is row `2h`, value `h` row `2h + 1`. bf16
/// (packing 2): key and value `h` share row `h`, the key in the low 16 bits.
pub trait KvElement: DotElement<Acc = f32> + Element {
    /// Keys and values per 32-bit word.
    const PACKING: usize;
    /// The keys and values of words loaded from the key row and the value row of a head.
    fn unpack(k_words: Array<u32>, v_words: Array<u32>) -> (Array<Self>, Array<Self>);
    /// The words of the key row and the value row of a head (for bf16, one word twice).
    fn pack(k: Array<Self>, v: Array<Self>) -> (Array<u32>, Array<u32>);
}

impl KvElement for f32 {
    const PACKING: usize = 1;
    fn unpack(k_words: Array<u32>, v_words: Array<u32>) -> (Array<f32>, Array<f32>) {
        (k_words.bitcast::<f32>(), v_words.bitcast::<f32>())
    }
    fn pack(k: Array<f32>, v: Array<f32>) -> (Array<u32>, Array<u32>) {
        (k.bitcast::<u32>(), v.bitcast::<u32>())
    }
}

impl KvElement for bf16 {
    const PACKING: usize = 2;
    fn unpack(k_words: Array<u32>, v_words: Array<u32>) -> (Array<bf16>, Array<bf16>) {
        // A bf16 is the high half of the f32 of the same value: the key moves up, the value stays.
        let k = (k_words << 16u32).bitcast::<f32>().cast::<bf16>();
        let v = (v_words & 0xFFFF_0000u32).bitcast::<f32>().cast::<bf16>();
        (k, v)
    }
    fn pack(k: Array<bf16>, v: Array<bf16>) -> (Array<u32>, Array<u32>) {
        let lo = k.cast::<f32>().bitcast::<u32>() >> 16u32;
        let hi = v.cast::<f32>().bitcast::<u32>() & 0xFFFF_0000u32;
        let w = lo | hi;
        (w, w)
    }
}

/// The rows of a cache row's `u32` view holding kv head `h`'s key and value.
fn kv_rows<T: KvElement>(h: usize) -> (usize, usize) {
    if T::PACKING == 1 {
        (2 * h, 2 * h + 1)
    } else {
        (h, h)
    }
}

/// Block sizes of one case (tpu-inference's `(bq_sz, bkv_sz, bq_csz, bkv_csz)`): query tokens per
/// fetched block and per computed chunk, KV tokens per fetched block and per computed chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocks {
    pub bq: usize,
    pub bkv: usize,
    pub bq_c: usize,
    pub bkv_c: usize,
}

/// Which sequences a case covers: `distribution[lo]..distribution[hi]` (`lo = None`: from 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    Decode,
    Prefill,
    Mixed,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Decode => "decode",
            Case::Prefill => "prefill",
            Case::Mixed => "mixed",
        }
    }
}

/// The attention options (tpu-inference's keyword arguments that change the arithmetic).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    pub causal: bool,
    pub update_kv_cache: bool,
    pub skip_kv_mask: bool,
    pub sm_scale: f32,
    pub sliding_window: Option<i32>,
    pub soft_cap: Option<f32>,
    pub mask_value: f32,
    pub q_scale: Option<f32>,
    pub k_scale: Option<f32>,
    pub v_scale: Option<f32>,
}

/// What the kernel body is specialised on: the options, and per case its block sizes (`None`: the
/// case is not traced).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    pub options: Options,
    pub cases: [(Case, Option<Blocks>); 3],
    pub page_size: usize,
    pub pages_per_seq: usize,
}

/// The sequences `case` covers, read from `distribution`.
fn seq_range(distribution: Ref<i32, Smem>, case: Case) -> (Scalar<i32>, Scalar<i32>) {
    match case {
        Case::Decode => (scalar(0i32), distribution.at(0).load()),
        Case::Prefill => (distribution.at(0).load(), distribution.at(1).load()),
        Case::Mixed => (distribution.at(1).load(), distribution.at(2).load()),
    }
}

/// Write sequence `seq`'s new keys and values (query tokens `q0..q0 + q_len`, positions
/// `kv_len - q_len..kv_len`) into its cache pages, `bkv` tokens at a time through `merged`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn update_cache<T: KvElement>(
    page_indices: Ref<i32, Smem>,
    (keys, values): (Ref<T, Any>, Ref<T, Any>),
    cache: RefMut<T, Any>,
    (stage, merged): (RefMut<T>, RefMut<T>),
    sems: DmaSem,
    (seq, q0, q_len, kv_len): (Scalar<i32>, Scalar<i32>, Scalar<i32>, Scalar<i32>),
    plan: Plan,
) {
    let (ps, pps) = (plan.page_size as i32, plan.pages_per_seq as i32);
    let stage_shape = stage.shape();
    let (kv_heads, chunk) = (stage_shape[1], stage_shape[2]);
    let cache_shape = cache.shape();
    let rows_per_token = cache_shape[2];
    let cache_rows = cache.reshape([
        cache_shape[0] * cache_shape[1],
        cache_shape[2],
        cache_shape[3],
        cache_shape[4],
    ]);
    let words = merged
        .bitcast::<u32>()
        .reshape([chunk * rows_per_token, cache_shape[4]]);
    let gap = kv_len - q_len;
    let n_chunks = (q_len + (chunk as i32 - 1)) / chunk as i32;
    for c in 0..n_chunks {
        let t0 = c * chunk as i32;
        let n = (q_len - t0).min(chunk as i32);
        for h in unroll(0..kv_heads) {
            let sem = sems.at((4, 0));
            async_copy(
                keys.at((ds(q0 + t0, n), h)),
                stage.at((0, h, ds(0, n))),
                sem,
            )
            .start();
            async_copy(
                values.at((ds(q0 + t0, n), h)),
                stage.at((1, h, ds(0, n))),
                sem,
            )
            .start();
        }
        for h in unroll(0..kv_heads) {
            let sem = sems.at((4, 0));
            let k_dst = stage.at((0, h, ds(0, n)));
            async_copy(stage.at((0, h, ds(0, n))), k_dst, sem).wait();
            let v_dst = stage.at((1, h, ds(0, n)));
            async_copy(stage.at((1, h, ds(0, n))), v_dst, sem).wait();
        }
        for h in unroll(0..kv_heads) {
            let (kw, vw) = T::pack(stage.at((0, h)).load(), stage.at((1, h)).load());
            let (kr, vr) = kv_rows::<T>(h);
            let stride = rows_per_token;
            words
                .at(ds(kr as i32, chunk as i32).stride(stride))
                .store(kw);
            words
                .at(ds(vr as i32, chunk as i32).stride(stride))
                .store(vw);
        }
        // Positions p0..p0 + n of the sequence, over the pages they fall in.
        let p0 = gap + t0;
        let first = p0 / ps;
        let last = (p0 + n - 1) / ps;
        let mut done = scalar(0i32);
        for i in first..last + 1 {
            let at = p0 + done;
            let sz = ((i + 1) * ps - at).min(n - done);
            let page = page_indices.at(seq * pps + i).load();
            let dst = cache_rows.at(ds(page * ps + (at - i * ps), sz));
            async_copy(merged.at(ds(done, sz)), dst, sems.at((3, 0))).start();
            done += sz;
        }
        // One wait for every page's rows: the semaphore counts bytes.
        async_copy(merged.at(ds(0, n)), merged.at(ds(0, n)), sems.at((3, 0))).wait();
    }
}

/// Start (or, with `wait`, retire) the copies of KV block `b` of sequence `seq` (its first `rows`
/// tokens past `b * bkv`) from the cache pages into slot `slot` of `bkv_buf`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn fetch_kv<T: KvElement>(
    page_indices: Ref<i32, Smem>,
    cache: RefMut<T, Any>,
    bkv_buf: RefMut<T>,
    sems: DmaSem,
    (seq, b, kv_len, slot): (Scalar<i32>, Scalar<i32>, Scalar<i32>, Scalar<i32>),
    plan: Plan,
    bkv: usize,
    wait: bool,
) {
    let (ps, pps) = (plan.page_size as i32, plan.pages_per_seq as i32);
    let cache_shape = cache.shape();
    let cache_rows = cache.reshape([
        cache_shape[0] * cache_shape[1],
        cache_shape[2],
        cache_shape[3],
        cache_shape[4],
    ]);
    let rows = (kv_len - b * bkv as i32).min(bkv as i32);
    let sem = sems.at((0, slot));
    if wait {
        let dst = bkv_buf.at((slot, ds(0, rows)));
        async_copy(bkv_buf.at((slot, ds(0, rows))), dst, sem).wait();
    } else {
        let n_pages = bkv / plan.page_size;
        let last_index = page_indices.shape()[0] as i32 - 1;
        for i in unroll(0..n_pages) {
            let sz = (rows - (i * plan.page_size) as i32).max(0).min(ps);
            let index = (seq * pps + b * n_pages as i32 + i as i32).min(last_index);
            // Pages past the sequence's are not copied (a window holds at least one row).
            if sz > 0 {
                let page = page_indices.at(index).load();
                let src = cache_rows.at(ds(page * ps, sz));
                async_copy(
                    src,
                    bkv_buf.at((slot, ds((i * plan.page_size) as i32, sz))),
                    sem,
                )
                .start();
            }
        }
    }
}

/// `s` scaled as the options say: `sm_scale`, then the key and query scales, then the soft cap
/// `cap · tanh(s / cap)`.
fn scaled_scores(s: Array<f32>, options: Options) -> Array<f32> {
    let mut s = s * options.sm_scale;
    if let Some(ks) = options.k_scale {
        s *= ks;
    }
    if let Some(qs) = options.q_scale {
        s *= qs;
    }
    if let Some(cap) = options.soft_cap {
        s = (s / cap).tanh() * cap;
    }
    s
}

/// `pv` times `v_scale`, if given.
fn scaled_values(pv: Array<f32>, options: Options) -> Array<f32> {
    match options.v_scale {
        Some(vs) => pv * vs,
        None => pv,
    }
}

/// One KV chunk folded into the running statistics of one kv head's query rows: scores of `q`
/// `[R, D]` (query positions `q_pos`, `[R, bkv_c]`) against `k` `[bkv_c, D]` (positions from
/// `k_first`), masked, into `stats` (`m`, `l`, lane-replicated) and `acc` rows `r0..r0 + R` of head
/// `h`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn fold_chunk<T: KvElement>(
    q: Array<T>,
    (k, v): (Array<T>, Array<T>),
    q_pos: Array<i32>,
    (k_first, kv_end): (Scalar<i32>, Scalar<i32>),
    (stats, acc): (RefMut<f32>, RefMut<f32>),
    (h, r0): (usize, usize),
    options: Options,
    causal: bool,
) {
    let rows = q.shape()[0];
    let bkv_c = k.shape()[0];
    let s = scaled_scores(dot_nt(q, k), options);
    let k_pos = iota::<i32>([rows, bkv_c], 1) + k_first;
    let mut v = v;
    let mut keep = k_pos < kv_end;
    if options.skip_kv_mask {
        keep = k_pos == k_pos;
    } else {
        let v_pos = iota::<i32>([bkv_c, v.shape()[1]], 0) + k_first;
        v = select(v_pos < kv_end, v, zeros_like(v));
    }
    if causal {
        keep = keep && k_pos <= q_pos;
    }
    if options.sliding_window.is_some() {
        let w = options.sliding_window.unwrap_or(0);
        keep = keep && q_pos < k_pos + w;
    }
    let s = select(keep, s, options.mask_value);
    let (m_ref, l_ref) = (
        stats.at((0, h, r0..r0 + rows)),
        stats.at((1, h, r0..r0 + rows)),
    );
    let m_prev = m_ref.load().slice((.., 0..1));
    let m_new = maximum(m_prev, s.max_keepdims(1));
    let p = (s - m_new).exp();
    let alpha = (m_prev - m_new).exp();
    let l_new = alpha * l_ref.load().slice((.., 0..1)) + p.sum_keepdims(1);
    let pv = scaled_values(dot(p.cast::<T>(), v), options);
    let a = acc.at((h, r0..r0 + rows));
    a.store(a.load() * alpha + pv);
    m_ref.store(m_new.broadcast_to([rows, 128]));
    l_ref.store(l_new.broadcast_to([rows, 128]));
}

/// `q` divided by `q_scale` (if given) in f32 and rounded back to the KV element type, as
/// tpu-inference quantizes queries before `q kᵀ`.
fn scaled_queries<T: KvElement>(q: Array<T>, options: Options) -> Array<T> {
    match options.q_scale {
        Some(qs) => (q.cast::<f32>() / qs).cast::<T>(),
        None => q,
    }
}

/// The queries of kv head `h`, chunk `c` of the query block in `q_buf`: decode (`[Hq, D]` rows of one
/// token) `[G, D]`; otherwise (`[Hq, bq, D]`, head-major) `[G · bq_c, D]`, row `g · bq_c + t`.
fn head_queries<T: KvElement>(
    q_buf: RefMut<T>,
    h: usize,
    c: usize,
    g: usize,
    bq_c: usize,
    decode: bool,
) -> Array<T> {
    if decode {
        q_buf.at(h * g..(h + 1) * g).load()
    } else {
        let d = q_buf.shape()[2];
        q_buf
            .at((h * g..(h + 1) * g, c * bq_c..(c + 1) * bq_c))
            .load()
            .reshape([g * bq_c, d])
    }
}

/// The query token (0-based within the block) of each row of [`head_queries`], `[R, cols]`.
fn row_tokens(g: usize, bq_c: usize, cols: usize, decode: bool) -> Array<i32> {
    if decode || bq_c == 1 {
        full([g * bq_c, cols], 0i32)
    } else {
        iota::<i32>([g, bq_c, cols], 1).reshape([g * bq_c, cols])
    }
}

/// Attention of sequence `seq`'s query tokens (`q0..q0 + q_len`, the last of its `kv_len` tokens)
/// in blocks of `blocks.bq`, against its cache pages.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn attend<T: KvElement>(
    page_indices: Ref<i32, Smem>,
    queries: Ref<T, Any>,
    o: RefMut<T, Any>,
    cache: RefMut<T, Any>,
    (bkv_buf, q_buf, o_buf): (RefMut<T>, RefMut<T>, RefMut<T>),
    sems: DmaSem,
    (stats, acc): (RefMut<f32>, RefMut<f32>),
    (seq, q0, q_len, kv_len): (Scalar<i32>, Scalar<i32>, Scalar<i32>, Scalar<i32>),
    plan: Plan,
    (case, blocks): (Case, Blocks),
) {
    let options = plan.options;
    let decode = case == Case::Decode;
    let causal = options.causal && !decode;
    let (bq, bkv, bq_c, bkv_c) = (blocks.bq, blocks.bkv, blocks.bq_c, blocks.bkv_c);
    let kv_heads = acc.shape()[0];
    let heads = queries.shape()[1];
    let d = queries.shape()[2];
    let g = heads / kv_heads;
    let rows_per_token = cache.shape()[2];
    let stats_shape = [stats.shape()[1], stats.shape()[2], stats.shape()[3]];
    let gap = kv_len - q_len;
    let num_bq = (q_len + (bq as i32 - 1)) / bq as i32;
    for bi in 0..num_bq {
        let qs = bi * bq as i32;
        let sz = (q_len - qs).min(bq as i32);
        // The query block.
        let q_sem = sems.at((1, 0));
        if decode {
            let dst = q_buf.reshape([1, heads, d]);
            sync_copy(queries.at(ds(q0 + qs, 1)), dst, q_sem);
        } else {
            for head in unroll(0..heads) {
                let dst = q_buf.at((head, ds(0, sz)));
                async_copy(queries.at((ds(q0 + qs, sz), head)), dst, q_sem).start();
            }
            for head in unroll(0..heads) {
                let dst = q_buf.at((head, ds(0, sz)));
                async_copy(q_buf.at((head, ds(0, sz))), dst, q_sem).wait();
            }
        }
        stats.at(0).store(full(stats_shape, f32::NEG_INFINITY));
        stats.at(1).store(zeros());
        acc.store(zeros());
        let q_first = gap + qs;
        let mut first_block = scalar(0i32);
        if options.sliding_window.is_some() {
            let w = options.sliding_window.unwrap_or(0);
            first_block = (q_first - w).max(0) / bkv as i32;
        }
        let mut visible = kv_len;
        if causal {
            visible = kv_len.min(q_first + bq as i32);
        }
        let end_block = (visible + (bkv as i32 - 1)) / bkv as i32;
        let zero = scalar(0i32);
        if first_block < end_block {
            fetch_kv(
                page_indices,
                cache,
                bkv_buf,
                sems,
                (seq, first_block, kv_len, zero),
                plan,
                bkv,
                false,
            );
        }
        for b in first_block..end_block {
            let slot = (b - first_block) % 2;
            if b + 1 < end_block {
                fetch_kv(
                    page_indices,
                    cache,
                    bkv_buf,
                    sems,
                    (seq, b + 1, kv_len, 1 - slot),
                    plan,
                    bkv,
                    false,
                );
            }
            fetch_kv(
                page_indices,
                cache,
                bkv_buf,
                sems,
                (seq, b, kv_len, slot),
                plan,
                bkv,
                true,
            );
            let words = bkv_buf
                .bitcast::<u32>()
                .at(slot)
                .reshape([bkv_buf.shape()[1] * rows_per_token, d]);
            let in_block = (visible - b * bkv as i32).max(0).min(bkv as i32);
            let n_chunks = (in_block + (bkv_c as i32 - 1)) / bkv_c as i32;
            for ci in 0..n_chunks {
                let kv0 = ci * bkv_c as i32;
                let k_first = b * bkv as i32 + kv0;
                for c in unroll(0..bq / bq_c) {
                    let rows = g * bq_c;
                    let q_pos = row_tokens(g, bq_c, bkv_c, decode) + (q_first + (c * bq_c) as i32);
                    for h in unroll(0..kv_heads) {
                        let (kr, vr) = kv_rows::<T>(h);
                        let stride = rows_per_token;
                        let start = kv0 * stride as i32;
                        let kw = words
                            .at(ds(start + kr as i32, bkv_c as i32).stride(stride))
                            .load();
                        let vw = words
                            .at(ds(start + vr as i32, bkv_c as i32).stride(stride))
                            .load();
                        let (k, v) = T::unpack(kw, vw);
                        let q = scaled_queries(head_queries(q_buf, h, c, g, bq_c, decode), options);
                        fold_chunk(
                            q,
                            (k, v),
                            q_pos,
                            (k_first, kv_len),
                            (stats, acc),
                            (h, c * rows),
                            options,
                            causal,
                        );
                    }
                }
            }
        }
        // The block's output: acc / l, per kv head and query chunk.
        for c in unroll(0..bq / bq_c) {
            let rows = g * bq_c;
            for h in unroll(0..kv_heads) {
                let l = stats
                    .at((1, h, c * rows..(c + 1) * rows))
                    .load()
                    .slice((.., 0..1));
                let out = (acc.at((h, c * rows..(c + 1) * rows)).load() / l).cast::<T>();
                if decode {
                    o_buf.at(h * g..(h + 1) * g).store(out);
                } else {
                    o_buf
                        .at((h * g..(h + 1) * g, c * bq_c..(c + 1) * bq_c))
                        .store(out.reshape([g, bq_c, d]));
                }
            }
        }
        let o_sem = sems.at((2, 0));
        if decode {
            let src = o_buf.reshape([1, heads, d]);
            sync_copy(src, o.at(ds(q0 + qs, 1)), o_sem);
        } else {
            for head in unroll(0..heads) {
                let src = o_buf.at((head, ds(0, sz)));
                async_copy(src, o.at((ds(q0 + qs, sz), head)), o_sem).start();
            }
            for head in unroll(0..heads) {
                let src = o_buf.at((head, ds(0, sz)));
                async_copy(o_buf.at((head, ds(0, sz))), src, o_sem).wait();
            }
        }
    }
}

/// The scalar-prefetched tables: `kv_lens`, `page_indices`, `cu_q_lens`, `distribution`.
type Tables = (
    Ref<i32, Smem>,
    Ref<i32, Smem>,
    Ref<i32, Smem>,
    Ref<i32, Smem>,
);

/// One case's VMEM buffers: the KV double buffer, the staged and merged new tokens, the query and
/// output blocks.
type Buffers<T> = (RefMut<T>, RefMut<T>, RefMut<T>, RefMut<T>, RefMut<T>);

/// One case's sequences: each one's cache update, then its attention.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn run_case<T: KvElement>(
    (kv_lens, page_indices, cu_q_lens, distribution): Tables,
    (queries, keys, values): (Ref<T, Any>, Ref<T, Any>, Ref<T, Any>),
    (o, cache): (RefMut<T, Any>, RefMut<T, Any>),
    (bkv_buf, stage, merged, q_buf, o_buf): Buffers<T>,
    sems: DmaSem,
    (stats, acc): (RefMut<f32>, RefMut<f32>),
    plan: Plan,
    (case, blocks): (Case, Blocks),
) {
    let (lo, hi) = seq_range(distribution, case);
    for seq in lo..hi {
        let q0 = cu_q_lens.at(seq).load();
        let q_len = cu_q_lens.at(seq + 1).load() - q0;
        let kv_len = kv_lens.at(seq).load();
        if plan.options.update_kv_cache {
            update_cache(
                page_indices,
                (keys, values),
                cache,
                (stage, merged),
                sems,
                (seq, q0, q_len, kv_len),
                plan,
            );
        }
        attend(
            page_indices,
            queries,
            o,
            cache,
            (bkv_buf, q_buf, o_buf),
            sems,
            (stats, acc),
            (seq, q0, q_len, kv_len),
            plan,
            (case, blocks),
        );
    }
}

/// The kernel's scratch, grouped: the KV double buffer, the new tokens' staging and merged rows, the
/// decode and block query/output buffers, the semaphores, the softmax statistics and accumulator.
type Scratch<T> = (
    (RefMut<T>, RefMut<T>, RefMut<T>),
    (RefMut<T>, RefMut<T>, RefMut<T>, RefMut<T>),
    DmaSem,
    (RefMut<f32>, RefMut<f32>),
);

/// Every case of `plan`, in tpu-inference's order (decode, prefill, mixed), one after the other.
#[allow(clippy::too_many_arguments)]
fn run_cases<T: KvElement>(
    prefetch: Tables,
    new: (Ref<T, Any>, Ref<T, Any>, Ref<T, Any>),
    out: (RefMut<T, Any>, RefMut<T, Any>),
    scratch: Scratch<T>,
    plan: Plan,
) {
    let ((bkv_buf, stage, merged), (q_decode, o_decode, q_block, o_block), sems, stats) = scratch;
    for (case, blocks) in plan.cases {
        let Some(blocks) = blocks else { continue };
        let (q_buf, o_buf) = if case == Case::Decode {
            (q_decode, o_decode)
        } else {
            (q_block, o_block)
        };
        let _scope = named_scope(case.name());
        run_case(
            prefetch,
            new,
            out,
            (bkv_buf, stage, merged, q_buf, o_buf),
            sems,
            stats,
            plan,
            (case, blocks),
        );
    }
}

#[tpu_kernel]
#[allow(clippy::too_many_arguments)]
fn ragged_paged_attention_kernel<T: KvElement>(
    kv_lens: Ref<i32, Smem>,
    page_indices: Ref<i32, Smem>,
    cu_q_lens: Ref<i32, Smem>,
    distribution: Ref<i32, Smem>,
    queries: Ref<T, Any>,
    keys: Ref<T, Any>,
    values: Ref<T, Any>,
    _kv_cache: Ref<T, Any>,
    o: RefMut<T, Any>,
    cache: RefMut<T, Any>,
    bkv_buf: RefMut<T>,
    stage: RefMut<T>,
    merged: RefMut<T>,
    q_decode: RefMut<T>,
    o_decode: RefMut<T>,
    q_block: RefMut<T>,
    o_block: RefMut<T>,
    sems: DmaSem,
    stats: RefMut<f32>,
    acc: RefMut<f32>,
    plan: Plan,
) {
    run_cases(
        (kv_lens, page_indices, cu_q_lens, distribution),
        (queries, keys, values),
        (o, cache),
        (
            (bkv_buf, stage, merged),
            (q_decode, o_decode, q_block, o_block),
            sems,
            (stats, acc),
        ),
        plan,
    );
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn align_to(a: usize, b: usize) -> usize {
    cdiv(a, b) * b
}

/// tpu-inference's `get_default_block_sizes`: its heuristic per TPU generation (v5e and v6e one
/// rule, tpu7x another; v4 and v5p take the v5e rule, where tpu-inference raises).
pub fn default_blocks(
    target: Target,
    case: Case,
    kv_dtype: DType,
    (heads, kv_heads, head_dim): (usize, usize, usize),
    (page_size, pages_per_seq, max_tokens): (usize, usize, usize),
) -> Blocks {
    let packing = (32 / kv_dtype.bit_width() as usize).max(1);
    let kv_heads_x2 = align_to(kv_heads * 2, packing).next_power_of_two();
    let head_dim = align_to(head_dim, 128);
    let group = (heads / kv_heads.max(1)).max(1).next_power_of_two();
    let max_q = max_tokens.max(1).next_power_of_two();
    let max_kv = pages_per_seq * page_size;
    let peak = 16 * 1024 * 1024 * packing / 4 / head_dim / kv_heads_x2;
    let (bq, bkv, bq_c, bkv_c) = if case == Case::Decode {
        (1, peak.min(max_kv), 1, peak.min(max_kv))
    } else if target.info().generation >= 7 {
        (
            (2048 / group).min(max_q / 2),
            2048.min(max_kv / 2),
            (1024 / group).min(max_q / 2),
            512.min(align_to(max_kv / 2, page_size)),
        )
    } else {
        (
            (1024 / group).min(max_q / 2),
            1024.min(max_kv),
            (512 / group).min(max_q),
            512.min(align_to(max_kv / 2, page_size)),
        )
    };
    Blocks {
        bq: bq.max(1),
        bkv: align_to(bkv.max(1), page_size),
        bq_c: bq_c.max(1),
        bkv_c: align_to(bkv_c.max(1), page_size),
    }
}

/// An argument error naming the Python argument.
fn arg_error(argument: &str, message: String) -> KernelError {
    KernelError::new(
        tpu_kernel::ErrorKind::Signature,
        format!("{argument}: {message}"),
    )
    .for_argument(argument)
}

/// `blocks` (tpu-inference's defaults, or the caller's `argument`) made what this kernel computes
/// with: decode blocks hold one token; a query chunk divides its block; with more than one query
/// head per kv head a chunk of more than one token is a multiple of the sublane tile (`tile`), as
/// its `[G, bq_c, D]` queries fold into `[G · bq_c, D]` rows; a KV chunk divides its block. The
/// defaults are rounded to fit; the caller's must fit as given.
fn fit_blocks(
    mut b: Blocks,
    case: Case,
    (page_size, group, tile): (usize, usize, usize),
    given: Option<&str>,
) -> Result<Blocks, KernelError> {
    let refuse = |what: String| match given {
        Some(argument) => Err(arg_error(argument, what)),
        None => Ok(()),
    };
    for (name, v) in [
        ("bq_sz", b.bq),
        ("bkv_sz", b.bkv),
        ("bq_csz", b.bq_c),
        ("bkv_csz", b.bkv_c),
    ] {
        if v == 0 {
            return Err(arg_error(
                given.unwrap_or("block sizes"),
                format!("{name} must be positive"),
            ));
        }
    }
    if !b.bkv.is_multiple_of(page_size) || !b.bkv_c.is_multiple_of(page_size) {
        refuse(format!(
            "bkv_sz {} and bkv_csz {} must be multiples of page_size {page_size}",
            b.bkv, b.bkv_c
        ))?;
        b.bkv = align_to(b.bkv, page_size);
        b.bkv_c = align_to(b.bkv_c, page_size);
    }
    if b.bkv_c > b.bkv || !b.bkv.is_multiple_of(b.bkv_c) {
        refuse(format!("bkv_csz {} must divide bkv_sz {}", b.bkv_c, b.bkv))?;
        let pages = b.bkv / page_size;
        let want = (b.bkv_c / page_size).min(pages);
        let fit = (1..=want)
            .rev()
            .find(|p| pages.is_multiple_of(*p))
            .unwrap_or(1);
        b.bkv_c = fit * page_size;
    }
    if case == Case::Decode {
        b.bq = 1;
        b.bq_c = 1;
        return Ok(b);
    }
    if !b.bq.is_multiple_of(b.bq_c) && b.bq_c < b.bq {
        refuse(format!("bq_csz {} must divide bq_sz {}", b.bq_c, b.bq))?;
    }
    b.bq_c = b.bq_c.min(b.bq);
    if group > 1 && b.bq_c > 1 && !b.bq_c.is_multiple_of(tile) {
        refuse(format!(
            "with {group} query heads per kv head, bq_csz {} must be 1 or a multiple of {tile} (the sublane tile of the query dtype)",
            b.bq_c
        ))?;
        b.bq_c = align_to(b.bq_c, tile);
    }
    if !b.bq.is_multiple_of(b.bq_c) {
        b.bq = align_to(b.bq, b.bq_c);
    }
    Ok(b)
}

/// Ragged paged attention, tpu-inference v3's `ragged_paged_attention` with its keyword arguments,
/// returning the attention `[T, Hq, D]` and the updated cache (aliased to `kv_cache`). The arrays
/// come in the launch's operand order — the scalar-prefetched tables first, as Pallas orders a
/// launch's operands; `tpu_kernel.examples.ragged_paged_attention` (Python) takes them in
/// tpu-inference's order and calls this. See the module docs for the layouts and the differences.
#[export(mutates(kv_cache))]
#[allow(clippy::too_many_arguments)]
pub fn ragged_paged_attention_launch(
    kv_lens: ArrayType,
    page_indices: ArrayType,
    cu_q_lens: ArrayType,
    distribution: ArrayType,
    queries: ArrayType,
    keys: ArrayType,
    values: ArrayType,
    kv_cache: ArrayType,
    #[default(true)] use_causal_mask: bool,
    #[default(true)] update_kv_cache: bool,
    #[default(false)] skip_kv_mask: bool,
    #[default(1.0)] sm_scale: f32,
    #[default(None)] sliding_window: Option<i64>,
    #[default(None)] soft_cap: Option<f32>,
    #[default(None)] out_dtype: Option<String>,
    #[default(None)] mask_value: Option<f32>,
    #[default(None)] q_scale: Option<f32>,
    #[default(None)] k_scale: Option<f32>,
    #[default(None)] v_scale: Option<f32>,
    #[default(None)] chunk_prefill_size: Option<i64>,
    #[default(None)] d_block_sizes: Option<[usize; 4]>,
    #[default(None)] p_block_sizes: Option<[usize; 4]>,
    #[default(None)] m_block_sizes: Option<[usize; 4]>,
    #[default(None)] vmem_limit_bytes: Option<i64>,
    target: Target,
) -> Result<PallasCall, KernelError> {
    let arrays = Arrays {
        queries,
        keys,
        values,
        kv_cache,
        kv_lens,
        page_indices,
        cu_q_lens,
        distribution,
    };
    let [tokens, heads, head_dim] = arrays
        .queries
        .dims()
        .map_err(|e| e.for_argument("queries"))?;
    let [_, kv_heads, _] = arrays.keys.dims().map_err(|e| e.for_argument("keys"))?;
    let [_, page_size, _, _, _] = arrays
        .kv_cache
        .dims()
        .map_err(|e| e.for_argument("kv_cache"))?;
    let [max_seqs] = arrays
        .kv_lens
        .dims()
        .map_err(|e| e.for_argument("kv_lens"))?;
    let [indices] = arrays
        .page_indices
        .dims()
        .map_err(|e| e.for_argument("page_indices"))?;
    if use_causal_mask && skip_kv_mask {
        return Err(arg_error(
            "skip_kv_mask",
            "can not skip the kv mask when using the causal mask".into(),
        ));
    }
    if let Some(w) = sliding_window {
        if w <= 0 || w > i32::MAX as i64 {
            return Err(arg_error(
                "sliding_window",
                format!("{w} must be positive (and fit in i32)"),
            ));
        }
    }
    if soft_cap == Some(0.0) {
        return Err(arg_error("soft_cap", "must not be 0.0".into()));
    }
    if let Some(c) = chunk_prefill_size {
        if c <= 0 {
            return Err(arg_error(
                "chunk_prefill_size",
                format!("{c} must be positive"),
            ));
        }
    }
    if let Some(v) = vmem_limit_bytes {
        if v <= 0 {
            return Err(arg_error(
                "vmem_limit_bytes",
                format!("{v} must be positive"),
            ));
        }
    }
    let q_dtype = arrays.queries.dtype;
    let default_out = if q_dtype == F32 {
        "float32"
    } else {
        "bfloat16"
    };
    match out_dtype.as_deref() {
        None | Some("float32") | Some("f32") => {}
        Some(other) => {
            return Err(arg_error(
                "out_dtype",
                format!("{other} accumulators are not supported: this kernel accumulates in float32 (pass None or float32; tpu-inference's default for these queries is {default_out})"),
            ))
        }
    }
    let out_min = if q_dtype == F32 {
        f32::MIN
    } else {
        bf16::MIN.to_f32()
    };
    let options = Options {
        causal: use_causal_mask,
        update_kv_cache,
        skip_kv_mask,
        sm_scale,
        sliding_window: sliding_window.map(|w| w as i32),
        soft_cap,
        mask_value: mask_value.unwrap_or(out_min),
        q_scale,
        k_scale,
        v_scale,
    };
    require(max_seqs > 0, "kv_lens must hold at least one sequence")
        .map_err(|e| e.for_argument("kv_lens"))?;
    require(
        indices % max_seqs == 0,
        format!("page_indices has {indices} entries, not a multiple of the {max_seqs} sequences of kv_lens"),
    )
    .map_err(|e| e.for_argument("page_indices"))?;
    let pages_per_seq = indices / max_seqs;
    let kv_dtype = arrays.kv_cache.dtype;
    let group = heads / kv_heads.max(1);
    let tile = 8 * (32 / q_dtype.bit_width() as usize).max(1);
    let dims = (heads, kv_heads, head_dim);
    let sizes = (page_size, pages_per_seq, tokens);
    let mut cases = [
        (Case::Decode, None),
        (Case::Prefill, None),
        (Case::Mixed, None),
    ];
    for (i, (case, given, name)) in [
        (Case::Decode, d_block_sizes, "d_block_sizes"),
        (
            Case::Prefill,
            p_block_sizes.or(m_block_sizes),
            if p_block_sizes.is_some() {
                "p_block_sizes"
            } else {
                "m_block_sizes"
            },
        ),
        (Case::Mixed, m_block_sizes, "m_block_sizes"),
    ]
    .into_iter()
    .enumerate()
    {
        let blocks = match given {
            Some([bq, bkv, bq_c, bkv_c]) => Blocks {
                bq,
                bkv,
                bq_c,
                bkv_c,
            },
            None => default_blocks(
                target,
                if case == Case::Prefill {
                    Case::Mixed
                } else {
                    case
                },
                kv_dtype,
                dims,
                sizes,
            ),
        };
        let given = given.map(|_| name);
        cases[i].1 = Some(fit_blocks(
            blocks,
            case,
            (page_size.max(1), group, tile),
            given,
        )?);
    }
    build_cases(
        arrays,
        options,
        cases,
        pages_per_seq,
        vmem_limit_bytes.map(|v| v as u64),
        target,
    )
}

/// The eight arrays of a call, by tpu-inference's names.
pub struct Arrays {
    pub queries: ArrayType,
    pub keys: ArrayType,
    pub values: ArrayType,
    pub kv_cache: ArrayType,
    pub kv_lens: ArrayType,
    pub page_indices: ArrayType,
    pub cu_q_lens: ArrayType,
    pub distribution: ArrayType,
}

/// The launch for `cases` (a case without blocks is left out: the tests build decode and mixed
/// alone to compare each with tpu-inference's launch of that case).
pub fn build_cases(
    a: Arrays,
    options: Options,
    cases: [(Case, Option<Blocks>); 3],
    pages_per_seq: usize,
    vmem_limit_bytes: Option<u64>,
    target: Target,
) -> Result<PallasCall, KernelError> {
    check_arrays(&a)?;
    match a.kv_cache.dtype {
        BF16 => {
            launch::<bf16>(a, options, cases, pages_per_seq, vmem_limit_bytes, target)
        }
        F32 => launch::<f32>(a, options, cases, pages_per_seq, vmem_limit_bytes, target),
        d => Err(arg_error(
            "kv_cache",
            format!("a {d} KV cache is not supported yet (bfloat16 and float32 are)"),
        )),
    }
}

/// tpu-inference's `static_validate_inputs`, each mistake naming its argument.
fn check_arrays(a: &Arrays) -> Result<(), KernelError> {
    let named = |arg: &str, r: Result<(), KernelError>| r.map_err(|e| e.for_argument(arg));
    let [tokens, heads, head_dim] = a.queries.dims().map_err(|e| e.for_argument("queries"))?;
    let [kt, kv_heads, kd] = a.keys.dims().map_err(|e| e.for_argument("keys"))?;
    named(
        "values",
        require(
            a.values.shape == a.keys.shape,
            format!(
                "values is {:?} but keys is {:?}",
                a.values.shape, a.keys.shape
            ),
        ),
    )?;
    named(
        "keys",
        require(
            kt == tokens,
            format!("keys has {kt} tokens, queries {tokens}"),
        ),
    )?;
    named(
        "keys",
        require(
            kd == head_dim,
            format!("keys has head_dim {kd}, queries {head_dim}"),
        ),
    )?;
    named(
        "keys",
        require(
            kv_heads > 0 && heads % kv_heads == 0,
            format!("{heads} query heads do not split over {kv_heads} kv heads"),
        ),
    )?;
    named(
        "queries",
        require(head_dim % 128 == 0, format!("head_dim {head_dim} is not supported: it must be a multiple of 128 (tpu-inference pads it to one; this kernel does not yet)")),
    )?;
    let dt = a.kv_cache.dtype;
    for (name, arr) in [
        ("queries", &a.queries),
        ("keys", &a.keys),
        ("values", &a.values),
    ] {
        named(
            name,
            require(
                arr.dtype == dt,
                format!(
                    "{name} is {} but kv_cache is {dt}: they must agree",
                    arr.dtype
                ),
            ),
        )?;
    }
    let packing = (32 / dt.bit_width() as usize).max(1);
    let [pages, page_size, rows, pk, cd] =
        a.kv_cache.dims().map_err(|e| e.for_argument("kv_cache"))?;
    let want = [
        pages,
        page_size,
        align_to(kv_heads * 2, packing) / packing,
        packing,
        head_dim,
    ];
    named(
        "kv_cache",
        require(
            [pages, page_size, rows, pk, cd] == want,
            format!(
                "kv_cache is {:?}, expected {want:?} (tpu-inference's get_kv_cache_shape)",
                a.kv_cache.shape
            ),
        ),
    )?;
    named(
        "kv_cache",
        require(
            page_size % packing == 0 && page_size > 0,
            format!("page_size {page_size} must be a positive multiple of {packing}"),
        ),
    )?;
    for (name, arr) in [
        ("kv_lens", &a.kv_lens),
        ("page_indices", &a.page_indices),
        ("cu_q_lens", &a.cu_q_lens),
        ("distribution", &a.distribution),
    ] {
        named(
            name,
            require(
                arr.dtype == I32,
                format!("{name} is {}: it must be int32", arr.dtype),
            ),
        )?;
        named(
            name,
            require(
                arr.shape.len() == 1,
                format!("{name} is {:?}: it must be one-dimensional", arr.shape),
            ),
        )?;
    }
    let seqs = a.kv_lens.shape[0];
    named(
        "cu_q_lens",
        require(
            a.cu_q_lens.shape == [seqs + 1],
            format!(
                "cu_q_lens is {:?}, expected [{}]",
                a.cu_q_lens.shape,
                seqs + 1
            ),
        ),
    )?;
    named(
        "distribution",
        require(
            a.distribution.shape == [3],
            format!("distribution is {:?}, expected [3]", a.distribution.shape),
        ),
    )?;
    Ok(())
}

fn launch<T: KvElement>(
    a: Arrays,
    options: Options,
    cases: [(Case, Option<Blocks>); 3],
    pages_per_seq: usize,
    vmem_limit_bytes: Option<u64>,
    target: Target,
) -> Result<PallasCall, KernelError> {
    let [_, heads, head_dim] = a.queries.dims()?;
    let [_, kv_heads, _] = a.keys.dims()?;
    let [_, page_size, rows, pk, _] = a.kv_cache.dims()?;
    let dt = a.kv_cache.dtype;
    let group = heads / kv_heads;
    let live = || cases.iter().filter_map(|(c, b)| b.map(|b| (*c, b)));
    let bkv_max = live().map(|(_, b)| b.bkv).max().unwrap_or(page_size);
    let bq_block = live()
        .filter(|(c, _)| *c != Case::Decode)
        .map(|(_, b)| b.bq)
        .max()
        .unwrap_or(1);
    let bq_max = live().map(|(_, b)| b.bq).max().unwrap_or(1);
    let plan = Plan {
        options,
        cases,
        page_size,
        pages_per_seq,
    };
    let mut call = pallas_call(ragged_paged_attention_kernel::<T>.bind(plan))
        .target(target)
        .grid([1])
        .scalar_prefetch(a.kv_lens)
        .scalar_prefetch(a.page_indices)
        .scalar_prefetch(a.cu_q_lens)
        .scalar_prefetch(a.distribution)
        .input_any(a.queries.clone())
        .input_any(a.keys)
        .input_any(a.values)
        .input_any(a.kv_cache.clone())
        .output_any(a.queries)
        .output_any(a.kv_cache)
        .scratch(Vmem::new([2, bkv_max, rows, pk, head_dim], dt))
        .scratch(Vmem::new([2, kv_heads, bkv_max, head_dim], dt))
        .scratch(Vmem::new([bkv_max, rows, pk, head_dim], dt))
        .scratch(Vmem::new([heads, head_dim], dt))
        .scratch(Vmem::new([heads, head_dim], dt))
        .scratch(Vmem::new([heads, bq_block, head_dim], dt))
        .scratch(Vmem::new([heads, bq_block, head_dim], dt))
        .scratch(DmaSem::array([5, 2]))
        .scratch(Vmem::new([2, kv_heads, group * bq_max, 128], F32))
        .scratch(Vmem::new([kv_heads, group * bq_max, head_dim], F32))
        .input_output_aliases([(7, 1)])
        .dimension_semantics([Arbitrary]);
    if let Some(v) = vmem_limit_bytes {
        call = call.vmem_limit_bytes(v);
    }
    call.build()
}

/// The example's shapes (small: the CI's): 64 tokens, 8 query heads over 2 kv heads, head_dim 128,
/// bf16, pages of 16 tokens, 4 sequences of up to 8 pages, 64 pages.
pub fn build_example() -> Result<PallasCall, KernelError> {
    let (tokens, heads, kv_heads, head_dim) = (64, 8, 2, 128);
    let (pages, page_size, seqs, pps) = (64, 16, 4, 8);
    ragged_paged_attention_launch(
        ArrayType::new([seqs], I32),
        ArrayType::new([seqs * pps], I32),
        ArrayType::new([seqs + 1], I32),
        ArrayType::new([3], I32),
        ArrayType::new([tokens, heads, head_dim], BF16),
        ArrayType::new([tokens, kv_heads, head_dim], BF16),
        ArrayType::new([tokens, kv_heads, head_dim], BF16),
        ArrayType::new([pages, page_size, kv_heads, 2, head_dim], BF16),
        true,
        true,
        false,
        1.0,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        Target::DEFAULT,
    )
}

pub fn build() -> Result<PallasCall, KernelError> {
    build_example()
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
