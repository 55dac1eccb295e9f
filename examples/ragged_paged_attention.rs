//! Ragged paged attention (issue 23): the algorithm of tpu-inference's ragged paged attention v3 —
//! vLLM TPU's production attention — with its Python signature, its KV cache layout and its
//! kernel's operands, written with this crate's primitives.
//!
//! **Operands** (tpu-inference's kernel's, made from its Python arguments by
//! `tpu_kernel.examples.ragged_paged_attention` as its `prepare_inputs` makes them): `q [Hkv, T,
//! Gp / pk, pk, D]` (the `G = Hq / Hkv` query heads of a kv head, padded to `Gp`, a multiple of the
//! packing `pk` — 2 for bf16, 1 for f32), the new tokens' keys and values merged into the cache's
//! row layout `kv [T, 2 Hkv / pk, pk, D]` (a token's row holds key 0, value 0, key 1, value 1, …;
//! bf16 packs a key and its value into one 32-bit word, the key in the low half), the paged
//! `kv_cache [pages, page_size, 2 Hkv / pk, pk, D]`, and the scalar-prefetched i32 `kv_lens [S]`,
//! `page_indices [S * pages_per_seq]` (the block table, flattened), `cu_q_lens [S + 1]` (sequence
//! `s` owns query tokens `cu_q_lens[s]..cu_q_lens[s+1]`, the last `q_len` of its `kv_len` tokens)
//! and `distribution [3]`: sequences `0..d0` decode (one query token), `d0..d1` prefill, `d1..d2`
//! are mixed. **Outputs**: the attention in `q`'s layout (aliased to `q`) and the cache with the new
//! tokens written into their pages (aliased to `kv_cache`).
//!
//! **One launch, `grid = (1,)`, every operand in HBM** (`input_any`): the kernel walks the sequences
//! of each case (decode, prefill, mixed — one loop each, traced with the case's block sizes and the
//! range read from `distribution`), and for each sequence
//! 1. copies its new rows of `kv` into their cache pages: one HBM-to-HBM copy per page touched, of
//!    a run-time number of rows (`ds(row, n)`), all counted on one semaphore, retired by one wait;
//! 2. for each block of `bq` query tokens (one copy of `[Hkv, n, Gp / pk, pk, D]`) walks its KV
//!    blocks of `bkv` tokens: block `b + 1`'s pages are copied into one slot of a double buffer (one
//!    copy per page it owns, of only the rows the sequence owns) while block `b` is computed from
//!    the other.
//!    Keys and values come out of the slot through a `u32` view by strided loads (a kv head's rows
//!    are `2 Hkv / pk` apart; for bf16 a word is split into its key and value), queries through a
//!    `u32` view bitcast back (token-major rows `t · Gp + g`), `bkv_c` tokens and `bq_c` query tokens
//!    at a time, kv head after kv head; an online softmax (flash attention) carries each query row's
//!    running max, sum and output in f32 VMEM scratch;
//! 3. divides by the sum and copies the block's output to HBM.
//!
//! Masks: a key after the query's position (causal; not in decode, whose one query is the last
//! token), at or past `kv_len`, or, with `sliding_window = w`, `w` or more positions before the
//! query, scores `mask_value`; values past `kv_len` are zeroed (a copy fills only the rows the
//! sequence owns; the rest of a slot is stale). KV blocks wholly before a query block's window are
//! not fetched.
//!
//! **Where it differs from tpu-inference** (measured against its `ref_ragged_paged_attention` in
//! `python/tests/test_ragged_paged_attention.py`):
//! - The cases are loops of one launch, not one launch each; the prefill loop runs whether or not
//!   `chunk_prefill_size` is given (tpu-inference's mixed launch starts at `distribution[1]`, so
//!   without it the prefill range is not computed at all); `chunk_prefill_size` only selects
//!   `p_block_sizes` over `m_block_sizes` — the query length stays dynamic.
//! - The softmax statistics and accumulator are f32 whatever `out_dtype` says (tpu-inference keeps
//!   them in `out_dtype`, bf16 by default for bf16 queries): `out_dtype` other than None/float32 is
//!   refused, naming it. The output is divided exactly (tpu-inference: an approximate reciprocal).
//! - The new tokens reach the cache by HBM-to-HBM copies before the attention reads them back from
//!   the cache; tpu-inference copies them into the KV block in VMEM and writes the cache from there.
//!   The query block, output block and the pages of the next sequence are not prefetched across
//!   sequences and query blocks (tpu-inference's pipeline runs on across them).
//! - The KV buffer is not padded against VMEM bank conflicts (tpu-inference adds a row when
//!   `2 Hkv / pk` strides conflict). A block's page copies and its kv heads are traced loops, where
//!   tpu-inference unrolls both (issuing the copies back to back, and overlapping one head's `p @ v`
//!   with the next head's `q kᵀ`): a smaller static schedule (fewer LLO ops and scheduled bundles,
//!   `python/tests/test_ragged_paged_attention_tpu.py`), whether faster on a TPU is unmeasured. Only
//!   the pages a block owns are copied (tpu-inference also issues size-0 copies for the others,
//!   which this crate's windows refuse).
//! - A decode sequence is one query block (tpu-inference's static query length 1): a "decode"
//!   sequence with more query tokens gets its first one computed.
//! - When the prefill and mixed block sizes agree (always, unless `p_block_sizes` differs), the
//!   prefill sequences run in the mixed loop: one copy of that code.
//! - libtpu's bounds and semaphore checks are off and the operands are pinned to HBM, as
//!   tpu-inference's (`disable_bounds_checks`, `disable_semaphore_checks`, `pltpu.HBM`).
//! - Block sizes: tpu-inference's defaults per generation (`default_blocks`); v4 takes the v5e rule
//!   (tpu-inference raises). A launch built for the CPU (`Executor::Cpu`: the JAX op's CPU lowering)
//!   caps the default query blocks at `CPU_QUERY_BLOCK` tokens (`cpu_query_blocks`: same bits). A KV chunk must divide its block and a query chunk its block (a default
//!   that does not is rounded; a given one is refused, naming its argument).
//! - f32, bf16 and 8-bit float (`float8_e4m3fn`, `float8_e5m2`) caches; over an 8-bit cache the
//!   queries are bf16 and the keys and values are widened to bf16 (exactly) for the MXU, where
//!   tpu-inference multiplies in the cache's type after rounding the queries to it (with `q_scale`:
//!   ours rounds them to it too, then widens them back).

use tpu_kernel::dtype::{DotElement, Element};
use tpu_kernel::prelude::*;

/// The element types the KV cache may hold: how a kv head's keys and values are laid out in the
/// `u32` words of a cache row, and the type the attention computes them in (`Q`, the queries'). f32
/// (packing 1): key `h` is row `2h`, value `h` row `2h + 1`. bf16 (packing 2): key and value `h` share
/// row `h`, the key in the low 16 bits. The 8-bit floats (packing 4, bf16 queries): key and value `h`
/// are bytes `2 (h mod 2)` and `2 (h mod 2) + 1` of row `h / 2`, widened to bf16 (exactly).
pub trait KvElement: Element {
    /// The queries' and the computation's element type.
    type Q: DotElement<Acc = f32>;
    /// Keys and values per 32-bit word.
    const PACKING: usize;
    /// The largest finite value (queries divided by `q_scale` are clipped to it, as tpu-inference's).
    const MAX: f32;
    /// The keys and values of kv head `h` in words loaded from its key row and value row.
    fn unpack(
        k_words: Array<u32>,
        v_words: Array<u32>,
        h: Scalar<i32>,
    ) -> (Array<Self::Q>, Array<Self::Q>);
}

impl KvElement for f32 {
    type Q = f32;
    const PACKING: usize = 1;
    const MAX: f32 = f32::MAX;
    fn unpack(
        k_words: Array<u32>,
        v_words: Array<u32>,
        _: Scalar<i32>,
    ) -> (Array<f32>, Array<f32>) {
        (k_words.bitcast::<f32>(), v_words.bitcast::<f32>())
    }
}

impl KvElement for bf16 {
    type Q = bf16;
    const PACKING: usize = 2;
    const MAX: f32 = 3.389_531_4e38;
    fn unpack(
        k_words: Array<u32>,
        v_words: Array<u32>,
        _: Scalar<i32>,
    ) -> (Array<bf16>, Array<bf16>) {
        // A bf16 is the high half of the f32 of the same value: the key moves up, the value stays.
        let k = (k_words << 16u32).bitcast::<f32>().cast::<bf16>();
        let v = (v_words & 0xFFFF_0000u32).bitcast::<f32>().cast::<bf16>();
        (k, v)
    }
}

/// Key and value bytes of kv head `h` (the pair `h mod 2` of its word) as `F`, widened to bf16.
fn unpack_8bit<F: Element>(
    k_words: Array<u32>,
    v_words: Array<u32>,
    h: Scalar<i32>,
) -> (Array<bf16>, Array<bf16>) {
    let shift = ((h % 2) * 16).cast::<u32>();
    let k = (k_words >> shift)
        .cast::<u8>()
        .bitcast::<F>()
        .cast::<bf16>();
    let v = (v_words >> (shift + 8u32))
        .cast::<u8>()
        .bitcast::<F>()
        .cast::<bf16>();
    (k, v)
}

impl KvElement for f8e4m3fn {
    type Q = bf16;
    const PACKING: usize = 4;
    const MAX: f32 = 448.0;
    fn unpack(
        k_words: Array<u32>,
        v_words: Array<u32>,
        h: Scalar<i32>,
    ) -> (Array<bf16>, Array<bf16>) {
        unpack_8bit::<f8e4m3fn>(k_words, v_words, h)
    }
}

impl KvElement for f8e5m2 {
    type Q = bf16;
    const PACKING: usize = 4;
    const MAX: f32 = 57344.0;
    fn unpack(
        k_words: Array<u32>,
        v_words: Array<u32>,
        h: Scalar<i32>,
    ) -> (Array<bf16>, Array<bf16>) {
        unpack_8bit::<f8e5m2>(k_words, v_words, h)
    }
}

/// The rows of a cache row's `u32` view holding kv head `h`'s key and value.
fn kv_rows<K: KvElement>(h: Scalar<i32>) -> (Scalar<i32>, Scalar<i32>) {
    match K::PACKING {
        1 => (h * 2, h * 2 + 1),
        2 => (h, h),
        _ => (h / 2, h / 2),
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
    /// The prefill sequences run in the mixed loop (`distribution[0]..distribution[2]`): their block
    /// sizes are the same, so one loop of that code serves both (half the code to lower).
    pub prefill_in_mixed: bool,
}

/// The sequences `case` covers, read from `distribution`.
fn seq_range(distribution: Ref<i32, Smem>, case: Case, plan: Plan) -> (Scalar<i32>, Scalar<i32>) {
    match case {
        Case::Decode => (scalar(0i32), distribution.at(0).load()),
        Case::Prefill => (distribution.at(0).load(), distribution.at(1).load()),
        Case::Mixed if plan.prefill_in_mixed => {
            (distribution.at(0).load(), distribution.at(2).load())
        }
        Case::Mixed => (distribution.at(1).load(), distribution.at(2).load()),
    }
}

/// Write sequence `seq`'s new keys and values (rows `q0..q0 + q_len` of `kv`, in the cache's row
/// layout; positions `kv_len - q_len..kv_len`) into its cache pages: one copy per page touched, of
/// a run-time number of rows, HBM to HBM, all counted on one semaphore and retired by one wait.
#[kernel_fn]
fn update_cache<K: KvElement>(
    page_indices: Ref<i32, Smem>,
    kv: Ref<K, Any>,
    cache: RefMut<K, Any>,
    sems: DmaSem,
    (seq, q0, q_len, kv_len): (Scalar<i32>, Scalar<i32>, Scalar<i32>, Scalar<i32>),
    plan: Plan,
) {
    let (ps, pps) = (plan.page_size as i32, plan.pages_per_seq as i32);
    let cache_rows = token_rows(cache);
    let p0 = kv_len - q_len;
    let first = p0 / ps;
    let last = (kv_len - 1) / ps;
    let mut done = scalar(0i32);
    for i in first..last + 1 {
        let at = p0 + done;
        let sz = ((i + 1) * ps - at).min(q_len - done);
        let page = page_indices.at(seq * pps + i).load();
        let dst = cache_rows.at(ds(page * ps + (at - i * ps), sz));
        async_copy(kv.at(ds(q0 + done, sz)), dst, sems.at((3, 0))).start();
        done += sz;
    }
    // One wait for every page's rows: the semaphore counts bytes.
    let all = cache_rows.at(ds(0, q_len));
    async_copy(cache_rows.at(ds(0, q_len)), all, sems.at((3, 0))).wait();
}

/// The cache `[pages, page_size, rows, packing, D]` as token rows `[pages · page_size, rows,
/// packing, D]` (tpu-inference's `kv_cache_hbm_ref.reshape(..)`).
fn token_rows<K: KvElement>(cache: RefMut<K, Any>) -> RefMut<K, Any> {
    let shape = cache.shape();
    cache.reshape([shape[0] * shape[1], shape[2], shape[3], shape[4]])
}

/// Start (or, with `wait`, retire) the copies of KV block `b` of sequence `seq` (its first `rows`
/// tokens past `b * bkv`) from the cache pages into slot `slot` of `bkv_buf`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn fetch_kv<K: KvElement>(
    page_indices: Ref<i32, Smem>,
    cache: RefMut<K, Any>,
    bkv_buf: RefMut<K>,
    sems: DmaSem,
    (seq, b, kv_len, slot): (Scalar<i32>, Scalar<i32>, Scalar<i32>, Scalar<i32>),
    plan: Plan,
    bkv: usize,
    wait: bool,
) {
    let (ps, pps) = (plan.page_size as i32, plan.pages_per_seq as i32);
    let cache_rows = token_rows(cache);
    let rows = (kv_len - b * bkv as i32).min(bkv as i32);
    let sem = sems.at((0, slot));
    if wait {
        let dst = bkv_buf.at((slot, ds(0, rows)));
        async_copy(bkv_buf.at((slot, ds(0, rows))), dst, sem).wait();
    } else {
        let n_pages = bkv / plan.page_size;
        // The pages the block owns, one copy each (a traced loop: only the owned ones, no branch).
        let owned = (rows + (ps - 1)) / ps;
        let first = seq * pps + b * n_pages as i32;
        for i in 0..owned {
            let sz = (rows - i * ps).min(ps);
            let page = page_indices.at(first + i).load();
            let dst = bkv_buf.at((slot, ds(i * ps, sz)));
            async_copy(cache_rows.at(ds(page * ps, sz)), dst, sem).start();
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
fn fold_chunk<T: DotElement<Acc = f32>>(
    q: Array<T>,
    (k, v): (Array<T>, Array<T>),
    q_pos: Array<i32>,
    (k_first, kv_end): (Scalar<i32>, Scalar<i32>),
    (stats, acc): (RefMut<f32>, RefMut<f32>),
    (h, r0): (Scalar<i32>, usize),
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

/// `q` divided by `q_scale` (if given) in f32, clipped to the cache type's range and rounded to it, as
/// tpu-inference quantizes queries before `q kᵀ` (then widened back to the queries' type, exactly).
fn scaled_queries<K: KvElement>(q: Array<K::Q>, options: Options) -> Array<K::Q> {
    match options.q_scale {
        Some(qs) => {
            let x = (q.cast::<f32>() / qs).clamp(-K::MAX, K::MAX);
            x.cast::<K>().cast::<K::Q>()
        }
        None => q,
    }
}

/// The query rows of kv head `h`, tokens `t0..t0 + n` of the block in `q_buf` (`[Hkv, bq, Gp / pk,
/// pk, D]`, tpu-inference's layout): `[n · Gp, D]`, token-major (row `t · Gp + g`), read as `u32`
/// words (a word packs `pk` heads) and bitcast back, as tpu-inference's `load_bq`.
fn head_queries<T: Element>(q_buf: RefMut<T>, h: Scalar<i32>, t0: usize, n: usize) -> Array<T> {
    let s = q_buf.shape();
    let rows_per_token = s[2];
    let words = q_buf
        .bitcast::<u32>()
        .at(h)
        .reshape([s[1] * rows_per_token, s[4]]);
    words
        .at(t0 * rows_per_token..(t0 + n) * rows_per_token)
        .load()
        .bitcast::<T>()
}

/// Store `out` (`[n · Gp, D]`, as [`head_queries`]) as the output rows of kv head `h`, tokens
/// `t0..t0 + n` of the block in `o_buf`.
fn store_head_output<T: Element>(
    o_buf: RefMut<T>,
    h: Scalar<i32>,
    t0: usize,
    n: usize,
    out: Array<T>,
) {
    let s = o_buf.shape();
    let rows_per_token = s[2];
    let words = o_buf
        .bitcast::<u32>()
        .at(h)
        .reshape([s[1] * rows_per_token, s[4]]);
    words
        .at(t0 * rows_per_token..(t0 + n) * rows_per_token)
        .store(out.bitcast::<u32>());
}

/// Attention of sequence `seq`'s query tokens (`q0..q0 + q_len`, the last of its `kv_len` tokens)
/// in blocks of `blocks.bq`, against its cache pages.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn attend<K: KvElement>(
    page_indices: Ref<i32, Smem>,
    q: Ref<K::Q, Any>,
    (o, cache): (RefMut<K::Q, Any>, RefMut<K, Any>),
    (bkv_buf, q_buf, o_buf): (RefMut<K>, RefMut<K::Q>, RefMut<K::Q>),
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
    let q_shape = q.shape();
    let (kv_heads, gp, d) = (q_shape[0], q_shape[2] * q_shape[3], q_shape[4]);
    let rows_per_token = cache.shape()[2];
    // The rows this case uses (the scratch is sized for the case with the largest query block).
    let live = gp * bq;
    let stats_shape = [kv_heads, live, stats.shape()[3]];
    let gap = kv_len - q_len;
    // A decode sequence has one query token (tpu-inference's static query length 1): one block.
    let mut num_bq = (q_len + (bq as i32 - 1)) / bq as i32;
    if decode {
        num_bq = scalar(1i32);
    }
    for bi in 0..num_bq {
        let qs = bi * bq as i32;
        let sz = (q_len - qs).min(bq as i32);
        // The query block: every kv head's tokens q0 + qs.. in one copy.
        let q_win = q_buf.at((.., ds(0, sz)));
        sync_copy(q.at((.., ds(q0 + qs, sz))), q_win, sems.at((1, 0)));
        stats
            .at((0, .., 0..live))
            .store(full(stats_shape, f32::NEG_INFINITY));
        stats.at((1, .., 0..live)).store(zeros());
        acc.at((.., 0..live)).store(zeros());
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
                    let rows = gp * bq_c;
                    let q_pos =
                        iota::<i32>([rows, bkv_c], 0) / gp as i32 + (q_first + (c * bq_c) as i32);
                    // A traced loop over kv heads: one copy of the compute in the code.
                    for h in 0..kv_heads as i32 {
                        let (kr, vr) = kv_rows::<K>(h);
                        let stride = rows_per_token;
                        let start = kv0 * stride as i32;
                        let kw = words.at(ds(start + kr, bkv_c as i32).stride(stride)).load();
                        // Packed caches hold a head's key and value in one word: one load for both
                        // (tpu-inference's `strided_load_kv`).
                        let mut vw = kw;
                        if K::PACKING == 1 {
                            vw = words.at(ds(start + vr, bkv_c as i32).stride(stride)).load();
                        }
                        let (k, v) = K::unpack(kw, vw, h);
                        let qh =
                            scaled_queries::<K>(head_queries(q_buf, h, c * bq_c, bq_c), options);
                        fold_chunk(
                            qh,
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
            let rows = gp * bq_c;
            for h in 0..kv_heads as i32 {
                let l = stats
                    .at((1, h, c * rows..(c + 1) * rows))
                    .load()
                    .slice((.., 0..1));
                let out = (acc.at((h, c * rows..(c + 1) * rows)).load() / l).cast::<K::Q>();
                store_head_output(o_buf, h, c * bq_c, bq_c, out);
            }
        }
        let o_win = o_buf.at((.., ds(0, sz)));
        sync_copy(o_win, o.at((.., ds(q0 + qs, sz))), sems.at((2, 0)));
    }
}

/// The scalar-prefetched tables: `kv_lens`, `page_indices`, `cu_q_lens`, `distribution`.
type Tables = (
    Ref<i32, Smem>,
    Ref<i32, Smem>,
    Ref<i32, Smem>,
    Ref<i32, Smem>,
);

/// One case's sequences: each one's cache update, then its attention.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn run_case<K: KvElement>(
    (kv_lens, page_indices, cu_q_lens, distribution): Tables,
    (q, kv): (Ref<K::Q, Any>, Ref<K, Any>),
    (o, cache): (RefMut<K::Q, Any>, RefMut<K, Any>),
    bufs: (RefMut<K>, RefMut<K::Q>, RefMut<K::Q>),
    sems: DmaSem,
    stats: (RefMut<f32>, RefMut<f32>),
    plan: Plan,
    case: (Case, Blocks),
) {
    let (lo, hi) = seq_range(distribution, case.0, plan);
    for seq in lo..hi {
        let q0 = cu_q_lens.at(seq).load();
        let q_len = cu_q_lens.at(seq + 1).load() - q0;
        let kv_len = kv_lens.at(seq).load();
        let at = (seq, q0, q_len, kv_len);
        if plan.options.update_kv_cache {
            update_cache(page_indices, kv, cache, sems, at, plan);
        }
        attend(
            page_indices,
            q,
            (o, cache),
            bufs,
            sems,
            stats,
            at,
            plan,
            case,
        );
    }
}

#[tpu_kernel]
#[allow(clippy::too_many_arguments)]
fn ragged_paged_attention_kernel<K: KvElement>(
    kv_lens: Ref<i32, Smem>,
    page_indices: Ref<i32, Smem>,
    cu_q_lens: Ref<i32, Smem>,
    distribution: Ref<i32, Smem>,
    q: Ref<K::Q, Any>,
    kv: Ref<K, Any>,
    _kv_cache: Ref<K, Any>,
    o: RefMut<K::Q, Any>,
    cache: RefMut<K, Any>,
    bkv_buf: RefMut<K>,
    q_buf: RefMut<K::Q>,
    o_buf: RefMut<K::Q>,
    sems: DmaSem,
    stats: RefMut<f32>,
    acc: RefMut<f32>,
    plan: Plan,
) {
    run_cases(
        (kv_lens, page_indices, cu_q_lens, distribution),
        (q, kv),
        (o, cache),
        (bkv_buf, q_buf, o_buf),
        sems,
        (stats, acc),
        plan,
    );
}

/// Every case of `plan`, in tpu-inference's order (decode, prefill, mixed), one after the other.
#[allow(clippy::too_many_arguments)]
fn run_cases<K: KvElement>(
    tables: Tables,
    inputs: (Ref<K::Q, Any>, Ref<K, Any>),
    outputs: (RefMut<K::Q, Any>, RefMut<K, Any>),
    bufs: (RefMut<K>, RefMut<K::Q>, RefMut<K::Q>),
    sems: DmaSem,
    stats: (RefMut<f32>, RefMut<f32>),
    plan: Plan,
) {
    for (case, blocks) in plan.cases {
        let Some(blocks) = blocks else { continue };
        let _scope = named_scope(case.name());
        run_case(
            tables,
            inputs,
            outputs,
            bufs,
            sems,
            stats,
            plan,
            (case, blocks),
        );
    }
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

/// The query block a launch built for the CPU defaults to, at most (tokens): tpu-inference's
/// defaults (128–256 tokens) pad a prefill chunk of 8–64 tokens to the whole block, which a TPU's
/// MXU absorbs and the interpreter pays for row by row; measured in `benches/interpret/rpa.rs`.
pub const CPU_QUERY_BLOCK: usize = 32;

/// tpu-inference's default `blocks` with the query block at most [`CPU_QUERY_BLOCK`] (and its chunk
/// at most the block): what the JAX op's CPU lowering runs. The query block does not change the
/// numbers (`tests/ragged_paged_attention.rs::query_block_sizes_do_not_change_the_bits`); the KV
/// blocks would (the online softmax's chunks), so they stay tpu-inference's.
pub fn cpu_query_blocks(b: Blocks) -> Blocks {
    let bq = b.bq.min(CPU_QUERY_BLOCK);
    Blocks {
        bq,
        bq_c: b.bq_c.min(bq),
        ..b
    }
}

/// [`default_blocks`] as a host function of the examples library (what the Python tests compare with
/// tpu-inference's `get_default_block_sizes`): `target` a generation's name, `case` "decode" or
/// "mixed", `kv_dtype` a dtype name, `[heads, kv_heads, head_dim]`, `[page_size, pages_per_seq,
/// max_tokens]` → `[bq, bkv, bq_c, bkv_c]`.
#[allow(dead_code)] // the example binary does not call it; examples-lib exports it
pub fn rpa_default_block_sizes(
    target: String,
    case: String,
    kv_dtype: String,
    [heads, kv_heads, head_dim]: [usize; 3],
    sizes: [usize; 3],
) -> Result<[usize; 4], KernelError> {
    let target = Target::parse(&target)?;
    let case = match case.as_str() {
        "decode" => Case::Decode,
        "mixed" | "prefill" => Case::Mixed,
        other => {
            return Err(arg_error(
                "case",
                format!("{other:?} is not decode, prefill or mixed"),
            ))
        }
    };
    let dtype = DType::from_name(&kv_dtype)
        .ok_or_else(|| arg_error("kv_dtype", format!("{kv_dtype:?} is not a dtype")))?;
    let b = default_blocks(
        target,
        case,
        dtype,
        (heads, kv_heads, head_dim),
        (sizes[0].max(1), sizes[1], sizes[2]),
    );
    Ok([b.bq, b.bkv, b.bq_c, b.bkv_c])
}

/// An argument error naming the Python argument.
fn arg_error(argument: &str, message: String) -> KernelError {
    KernelError::new(tpu_kernel::ErrorKind::Signature, message).for_argument(argument)
}

/// `blocks` (tpu-inference's defaults, or the caller's `argument`) made what this kernel computes
/// with: decode blocks hold one token; a query chunk divides its block; a KV chunk divides its
/// block. The defaults are rounded to fit; the caller's must fit as given.
fn fit_blocks(
    mut b: Blocks,
    case: Case,
    page_size: usize,
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
    b.bq_c = b.bq_c.min(b.bq);
    if !b.bq.is_multiple_of(b.bq_c) {
        refuse(format!("bq_csz {} must divide bq_sz {}", b.bq_c, b.bq))?;
        b.bq = align_to(b.bq, b.bq_c);
    }
    Ok(b)
}

/// Ragged paged attention, the launch behind tpu-inference v3's `ragged_paged_attention` (its
/// keyword arguments, its kernel's operands): `q [Hkv, T, Gp / pk, pk, D]` and `kv [T, 2 Hkv / pk, pk,
/// D]` as tpu-inference's `prepare_inputs` makes them (Python: `tpu_kernel.examples.
/// ragged_paged_attention` takes tpu-inference's `queries, keys, values, kv_cache, kv_lens, ..` and
/// makes them), `kv_cache` (`get_kv_cache_shape`), and the tables, first, as Pallas orders a launch's
/// operands. Returns the attention in `q`'s layout (aliased to `q`) and the updated cache (aliased
/// to `kv_cache`). `actual_num_q_heads` (the heads before padding `G` to `Gp`) only feeds the
/// default block sizes; `only_case` ("decode", "prefill" or "mixed") traces that case alone — what
/// the parity tests compare with tpu-inference's launch of the case. See the module docs for the differences from tpu-inference.
#[export(mutates(q, kv_cache))]
#[allow(clippy::too_many_arguments)]
pub fn ragged_paged_attention_launch(
    kv_lens: ArrayType,
    page_indices: ArrayType,
    cu_q_lens: ArrayType,
    distribution: ArrayType,
    q: ArrayType,
    kv: ArrayType,
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
    #[default(None)] actual_num_q_heads: Option<usize>,
    #[default(None)] only_case: Option<String>,
    target: Target,
) -> Result<PallasCall, KernelError> {
    let arrays = Arrays {
        q,
        kv,
        kv_cache,
        kv_lens,
        page_indices,
        cu_q_lens,
        distribution,
    };
    check_arrays(&arrays)?;
    let [kv_heads, tokens, _, _, head_dim] = arrays.q.dims()?;
    let [_, page_size, _, _, _] = arrays.kv_cache.dims()?;
    let [max_seqs] = arrays.kv_lens.dims()?;
    let [indices] = arrays.page_indices.dims()?;
    let heads = actual_num_q_heads.unwrap_or(arrays.q.shape[2] * arrays.q.shape[3] * kv_heads);
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
    if let Some(only) = only_case.as_deref() {
        if !["decode", "prefill", "mixed"].contains(&only) {
            return Err(arg_error(
                "only_case",
                format!("{only:?} is not a case: decode, prefill or mixed"),
            ));
        }
    }
    let q_dtype = arrays.q.dtype;
    let default_out = if q_dtype == F32 {
        "float32"
    } else {
        "bfloat16"
    };
    match out_dtype.as_deref() {
        None | Some("float32") => {}
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
    let pages_per_seq = indices / max_seqs;
    let kv_dtype = arrays.kv_cache.dtype;
    let dims = (heads, kv_heads, head_dim);
    let sizes = (page_size, pages_per_seq, tokens);
    let mut cases = [
        (Case::Decode, None),
        (Case::Prefill, None),
        (Case::Mixed, None),
    ];
    let prefill_name = if p_block_sizes.is_some() {
        "p_block_sizes"
    } else {
        "m_block_sizes"
    };
    for (i, (case, given, name)) in [
        (Case::Decode, d_block_sizes, "d_block_sizes"),
        (Case::Prefill, p_block_sizes.or(m_block_sizes), prefill_name),
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
            None => {
                let like = if case == Case::Decode {
                    Case::Decode
                } else {
                    Case::Mixed
                };
                let blocks = default_blocks(target, like, kv_dtype, dims, sizes);
                match Executor::current() {
                    Executor::Tpu => blocks,
                    Executor::Cpu => cpu_query_blocks(blocks),
                }
            }
        };
        let fitted = fit_blocks(blocks, case, page_size, given.map(|_| name))?;
        cases[i].1 = match only_case.as_deref() {
            Some(only) if only != case.name() => None,
            _ => Some(fitted),
        };
    }
    build_cases(
        arrays,
        options,
        cases,
        vmem_limit_bytes.map(|v| v as u64),
        target,
    )
}

/// The arrays of a launch, by tpu-inference's kernel operand names.
pub struct Arrays {
    pub q: ArrayType,
    pub kv: ArrayType,
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
    vmem_limit_bytes: Option<u64>,
    target: Target,
) -> Result<PallasCall, KernelError> {
    if ![F32, BF16, F8E4M3FN, F8E5M2].contains(&a.kv_cache.dtype) {
        return Err(arg_error(
            "kv_cache",
            format!("a {} KV cache is not supported (float32, bfloat16, float8_e4m3fn and float8_e5m2 are)", a.kv_cache.dtype),
        ));
    }
    check_arrays(&a)?;
    match a.kv_cache.dtype {
        BF16 => launch::<bf16>(a, options, cases, vmem_limit_bytes, target),
        F32 => launch::<f32>(a, options, cases, vmem_limit_bytes, target),
        F8E4M3FN => launch::<f8e4m3fn>(a, options, cases, vmem_limit_bytes, target),
        F8E5M2 => launch::<f8e5m2>(a, options, cases, vmem_limit_bytes, target),
        d => Err(arg_error(
            "kv_cache",
            format!("a {d} KV cache is not supported (float32, bfloat16, float8_e4m3fn and float8_e5m2 are)"),
        )),
    }
}

/// The launch's operands as tpu-inference's `static_validate_inputs` and kernel asserts hold them,
/// each mistake naming its argument.
fn check_arrays(a: &Arrays) -> Result<(), KernelError> {
    let named = |arg: &str, ok: bool, m: String| -> Result<(), KernelError> {
        if ok {
            Ok(())
        } else {
            Err(arg_error(arg, m))
        }
    };
    let dims5 = |arg: &str, t: &ArrayType| -> Result<[usize; 5], KernelError> {
        t.dims().map_err(|e| e.for_argument(arg))
    };
    let [kv_heads, tokens, gq, q_pk, head_dim] = dims5("q", &a.q)?;
    let dt = a.kv_cache.dtype;
    let packing = (32 / dt.bit_width() as usize).max(1);
    let [pages, page_size, rows, pk, cd] = dims5("kv_cache", &a.kv_cache)?;
    // The queries' type: the cache's, bf16 over an 8-bit cache.
    let q_dt = if dt == F32 { F32 } else { BF16 };
    let q_packing = (32 / q_dt.bit_width() as usize).max(1);
    named(
        "q",
        a.q.dtype == q_dt,
        format!(
            "q is {} but a {dt} kv_cache takes {q_dt} queries",
            a.q.dtype
        ),
    )?;
    named(
        "kv",
        a.kv.dtype == dt,
        format!("kv is {} but kv_cache is {dt}: they must agree", a.kv.dtype),
    )?;
    named("q", q_pk == q_packing && gq > 0, format!("q is {:?}: expected [kv_heads, tokens, heads per kv head / {q_packing}, {q_packing}, head_dim]", a.q.shape))?;
    named("q", head_dim % 128 == 0 && head_dim > 0, format!("head_dim {head_dim} must be a multiple of 128 (tpu-inference's prepare_inputs pads it)"))?;
    let want = [
        pages,
        page_size,
        align_to(kv_heads * 2, packing) / packing,
        packing,
        head_dim,
    ];
    named(
        "kv_cache",
        [pages, page_size, rows, pk, cd] == want && pages > 0,
        format!(
            "kv_cache is {:?}, expected {want:?} (tpu-inference's get_kv_cache_shape)",
            a.kv_cache.shape
        ),
    )?;
    named(
        "kv_cache",
        page_size > 0 && page_size % packing == 0,
        format!("page_size {page_size} must be a positive multiple of {packing}"),
    )?;
    named(
        "kv",
        a.kv.shape == [tokens, rows, pk, head_dim],
        format!(
            "kv is {:?}, expected [{tokens}, {rows}, {pk}, {head_dim}] (tpu-inference's merge_kv)",
            a.kv.shape
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
            arr.dtype == I32,
            format!("{name} is {}: it must be int32", arr.dtype),
        )?;
        named(
            name,
            arr.shape.len() == 1,
            format!("{name} is {:?}: it must be one-dimensional", arr.shape),
        )?;
    }
    let seqs = a.kv_lens.shape[0];
    let indices = a.page_indices.shape[0];
    named(
        "kv_lens",
        seqs > 0,
        "kv_lens must hold at least one sequence".into(),
    )?;
    named(
        "page_indices",
        indices > 0 && indices.is_multiple_of(seqs),
        format!("page_indices has {indices} entries, not a positive multiple of the {seqs} sequences of kv_lens"),
    )?;
    named(
        "cu_q_lens",
        a.cu_q_lens.shape == [seqs + 1],
        format!(
            "cu_q_lens is {:?}, expected [{}]",
            a.cu_q_lens.shape,
            seqs + 1
        ),
    )?;
    named(
        "distribution",
        a.distribution.shape == [3],
        format!("distribution is {:?}, expected [3]", a.distribution.shape),
    )?;
    Ok(())
}

fn launch<K: KvElement>(
    a: Arrays,
    options: Options,
    cases: [(Case, Option<Blocks>); 3],
    vmem_limit_bytes: Option<u64>,
    target: Target,
) -> Result<PallasCall, KernelError> {
    let [kv_heads, _, gq, q_pk, head_dim] = a.q.dims()?;
    let [_, page_size, rows, pk, _] = a.kv_cache.dims()?;
    let (dt, q_dt) = (a.kv_cache.dtype, a.q.dtype);
    let gp = gq * q_pk;
    let live = || cases.iter().filter_map(|(c, b)| b.map(|b| (*c, b)));
    let bkv_max = live().map(|(_, b)| b.bkv).max().unwrap_or(page_size);
    let bq_max = live().map(|(_, b)| b.bq).max().unwrap_or(1);
    let mut cases = cases;
    let prefill_in_mixed = cases[1].1.is_some() && cases[1].1 == cases[2].1;
    if prefill_in_mixed {
        cases[1].1 = None;
    }
    let plan = Plan {
        options,
        cases,
        page_size,
        pages_per_seq: a.page_indices.shape[0] / a.kv_lens.shape[0],
        prefill_in_mixed,
    };
    let call = pallas_call(ragged_paged_attention_kernel::<K>.bind(plan))
        .target(target)
        .grid([1])
        .scalar_prefetch(a.kv_lens)
        .scalar_prefetch(a.page_indices)
        .scalar_prefetch(a.cu_q_lens)
        .scalar_prefetch(a.distribution)
        .input_any(a.q.clone())
        .input_any(a.kv)
        .input_any(a.kv_cache.clone())
        .output_any(a.q)
        .output_any(a.kv_cache)
        .scratch(Vmem::new([2, bkv_max, rows, pk, head_dim], dt))
        .scratch(Vmem::new([kv_heads, bq_max, gq, q_pk, head_dim], q_dt))
        .scratch(Vmem::new([kv_heads, bq_max, gq, q_pk, head_dim], q_dt))
        .scratch(DmaSem::array([4, 2]))
        .scratch(Vmem::new([2, kv_heads, gp * bq_max, 128], F32))
        .scratch(Vmem::new([kv_heads, gp * bq_max, head_dim], F32))
        .input_output_aliases([(4, 0), (6, 1)])
        .dimension_semantics([Arbitrary])
        // As tpu-inference (its defaults): libtpu's checks around each small page copy cost more
        // than the copy; the CPU engines check every access.
        .disable_bounds_checks()
        .disable_semaphore_checks()
        // tpu-inference's operands are `pltpu.HBM`: XLA keeps them out of VMEM.
        .any_in_hbm();
    // tpu-inference's default: the TensorCore's whole VMEM (`get_tpu_info().vmem_capacity_bytes`), not
    // libtpu's default scoped limit — at a Llama-3-8B-like config the decode case needs more than the
    // latter (32.06 MiB against v6e's 32 MiB).
    call.vmem_limit_bytes(vmem_limit_bytes.unwrap_or(target.info().vmem_capacity_bytes))
        .build()
}

/// The example's shapes (small: the CI's): 64 tokens, 8 query heads over 2 kv heads, head_dim 128,
/// bf16, pages of 16 tokens, 4 sequences of up to 8 pages, 64 pages; the block sizes tpu-inference's
/// heuristic picks for v5e, given explicitly so that every generation builds the same kernel (the
/// Pallas twin, `python/tests/pallas_rpa.py`, has them too).
pub fn build_example() -> Result<PallasCall, KernelError> {
    let (tokens, heads, kv_heads, head_dim) = (64, 8, 2, 128);
    let (pages, page_size, seqs, pps) = (64, 16, 4, 8);
    ragged_paged_attention_launch(
        ArrayType::new([seqs], I32),
        ArrayType::new([seqs * pps], I32),
        ArrayType::new([seqs + 1], I32),
        ArrayType::new([3], I32),
        ArrayType::new([kv_heads, tokens, heads / kv_heads / 2, 2, head_dim], BF16),
        ArrayType::new([tokens, kv_heads, 2, head_dim], BF16),
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
        Some([1, 128, 1, 128]),
        None,
        Some([32, 128, 32, 64]),
        None,
        Some(heads),
        None,
        Target::current(),
    )
}

pub fn build() -> Result<PallasCall, KernelError> {
    build_example()
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
