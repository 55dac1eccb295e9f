//! Flash attention, forward and backward (issue 12): bf16 `q, k, v` of shape `[batch * heads, seq,
//! head_dim]`, softmax statistics in f32, `softmax(q kᵀ / sqrt(head_dim)) v`, causal or not.
//!
//! - **Forward** (`flash_attention`): grid `(batch * heads, seq / block_q, seq / block_k)`, the last axis
//!   `arbitrary`: each step folds one `[block_k, head_dim]` block of keys and values into the running
//!   maximum `m`, normaliser `l` and accumulator `acc` of its `block_q` queries (online softmax in VMEM
//!   scratch; `m` and `l` lane-replicated to 128 columns, as Pallas keeps them).
//! - **Residuals** (`flash_attention_fwd`, run in its place under differentiation): the same, plus the
//!   log-sum-exp `m + log l` of every query row, lane-replicated `[batch * heads, seq, 128]` f32.
//! - **Backward**: `flash_attention_dkv` (grid over key blocks, then query blocks: `dV = Σ pᵀ dO`,
//!   `dK = scale Σ dSᵀ q`) and `flash_attention_dq` (grid over query blocks, then key blocks:
//!   `dQ = scale Σ dS k`), with `p = exp(s - lse)`, `dS = p ⊙ (dO vᵀ - rowsum(dO ⊙ O))` recomputed per
//!   block from the residuals.
//!
//! With `causal`, blocks wholly above the diagonal are skipped — and their index maps clamped to the last
//! block needed, so a skipped step fetches nothing new — and the blocks that are computed are masked.

use tpu_kernel::prelude::*;

/// Scores of masked (future) keys: finite, so a row never holds only -inf (no NaN from `exp(-inf + inf)`).
const MASK: f32 = -0.7 * f32::MAX;

/// `q kᵀ · scale` for query block `i` and key block `j`, in f32; with `causal`, key `c` after query `r`
/// gets [`MASK`].
#[kernel_fn]
fn scores(
    q: Array<bf16>,
    k: Array<bf16>,
    i: Scalar<i32>,
    j: Scalar<i32>,
    causal: bool,
    scale: f32,
) -> Array<f32> {
    let (bq, bk) = (q.shape()[0], k.shape()[0]);
    let mut s = dot_nt(q, k) * scale;
    if causal {
        let row = iota::<i32>([bq, bk], 0) + i * (bq as i32);
        let col = iota::<i32>([bq, bk], 1) + j * (bk as i32);
        s = select(col <= row, s, MASK);
    }
    s
}

/// One forward step (query block `program_id(1)`, key block `program_id(2)`): fold the key/value block
/// into the running statistics.
#[allow(clippy::too_many_arguments)]
#[kernel_fn]
fn forward_step(
    q: Ref<bf16>,
    k: Ref<bf16>,
    v: Ref<bf16>,
    m_sc: RefMut<f32>,
    l_sc: RefMut<f32>,
    acc: RefMut<f32>,
    causal: bool,
    scale: f32,
) {
    let bq = q.shape()[0];
    let bk = k.shape()[0];
    let (i, j) = (program_id(1), program_id(2));
    if j == 0 {
        m_sc.store(full([bq, 128], MASK));
        l_sc.store(zeros());
        acc.store(zeros());
    }
    // Key blocks that start after this block's last query are all masked: skip them.
    let visible = (j * (bk as i32) < (i + 1) * (bq as i32)) | scalar(!causal);
    if visible {
        let s = scores(q.load(), k.load(), i, j, causal, scale);
        let m_prev = m_sc.load().slice((.., 0..1));
        let m_new = maximum(m_prev, s.max_keepdims(1));
        let p = (s - m_new).exp();
        let alpha = (m_prev - m_new).exp();
        let l_new = alpha * l_sc.load().slice((.., 0..1)) + p.sum_keepdims(1);
        acc.store(acc.load() * alpha + dot(p.cast::<bf16>(), v.load()));
        m_sc.store(m_new.broadcast_to([bq, 128]));
        l_sc.store(l_new.broadcast_to([bq, 128]));
    }
}

#[allow(clippy::too_many_arguments)]
#[tpu_kernel]
fn flash_attention_kernel(
    q: Ref<bf16>,
    k: Ref<bf16>,
    v: Ref<bf16>,
    o: RefMut<bf16>,
    m_sc: RefMut<f32>,
    l_sc: RefMut<f32>,
    acc: RefMut<f32>,
    causal: bool,
    scale: f32,
) {
    forward_step(q, k, v, m_sc, l_sc, acc, causal, scale);
    if program_id(2) == num_programs(2) - 1 {
        o.store((acc.load() / l_sc.load().slice((.., 0..1))).cast::<bf16>());
    }
}

#[allow(clippy::too_many_arguments)]
#[tpu_kernel]
fn flash_attention_fwd_kernel(
    q: Ref<bf16>,
    k: Ref<bf16>,
    v: Ref<bf16>,
    o: RefMut<bf16>,
    lse: RefMut<f32>,
    m_sc: RefMut<f32>,
    l_sc: RefMut<f32>,
    acc: RefMut<f32>,
    causal: bool,
    scale: f32,
) {
    forward_step(q, k, v, m_sc, l_sc, acc, causal, scale);
    if program_id(2) == num_programs(2) - 1 {
        let l = l_sc.load();
        o.store((acc.load() / l.slice((.., 0..1))).cast::<bf16>());
        lse.store(m_sc.load() + l.log());
    }
}

/// `dK` and `dV` of key block `program_id(1)`, summed over query blocks `program_id(2)`.
#[allow(clippy::too_many_arguments)]
#[tpu_kernel]
fn flash_attention_dkv_kernel(
    q: Ref<bf16>,
    k: Ref<bf16>,
    v: Ref<bf16>,
    o: Ref<bf16>,
    lse: Ref<f32>,
    g: Ref<bf16>,
    dk: RefMut<bf16>,
    dv: RefMut<bf16>,
    dk_acc: RefMut<f32>,
    dv_acc: RefMut<f32>,
    causal: bool,
    scale: f32,
) {
    let bq = q.shape()[0];
    let bk = k.shape()[0];
    let (j, i) = (program_id(1), program_id(2));
    if i == 0 {
        dk_acc.store(zeros());
        dv_acc.store(zeros());
    }
    // Query blocks that end before this key block starts see none of its keys: skip them.
    let visible = ((i + 1) * (bq as i32) > j * (bk as i32)) | scalar(!causal);
    if visible {
        let qb = q.load();
        let gb = g.load();
        let s = scores(qb, k.load(), i, j, causal, scale);
        let p = (s - lse.load().slice((.., 0..1))).exp();
        dv_acc += dot_tn(p.cast::<bf16>(), gb);
        let dp = dot_nt(gb, v.load());
        let di = (gb.cast::<f32>() * o.load().cast::<f32>()).sum_keepdims(1);
        let ds = p * (dp - di);
        dk_acc += dot_tn(ds.cast::<bf16>(), qb);
    }
    if i == num_programs(2) - 1 {
        dk.store((dk_acc.load() * scale).cast::<bf16>());
        dv.store(dv_acc.load().cast::<bf16>());
    }
}

/// `dQ` of query block `program_id(1)`, summed over key blocks `program_id(2)`.
#[allow(clippy::too_many_arguments)]
#[tpu_kernel]
fn flash_attention_dq_kernel(
    q: Ref<bf16>,
    k: Ref<bf16>,
    v: Ref<bf16>,
    o: Ref<bf16>,
    lse: Ref<f32>,
    g: Ref<bf16>,
    dq: RefMut<bf16>,
    dq_acc: RefMut<f32>,
    di_sc: RefMut<f32>,
    causal: bool,
    scale: f32,
) {
    let bq = q.shape()[0];
    let bk = k.shape()[0];
    let (i, j) = (program_id(1), program_id(2));
    if j == 0 {
        dq_acc.store(zeros());
        let di = (g.load().cast::<f32>() * o.load().cast::<f32>()).sum_keepdims(1);
        di_sc.store(di.broadcast_to([bq, 128]));
    }
    let visible = (j * (bk as i32) < (i + 1) * (bq as i32)) | scalar(!causal);
    if visible {
        let kb = k.load();
        let s = scores(q.load(), kb, i, j, causal, scale);
        let p = (s - lse.load().slice((.., 0..1))).exp();
        let dp = dot_nt(g.load(), v.load());
        let ds = p * (dp - di_sc.load().slice((.., 0..1)));
        dq_acc += dot(ds.cast::<bf16>(), kb);
    }
    if j == num_programs(2) - 1 {
        dq.store((dq_acc.load() * scale).cast::<bf16>());
    }
}

/// The checked shapes of a call: `(batch * heads, seq, head_dim)`, `q, k, v` and the other `[bh, seq, d]`
/// bf16 arrays (`o`, `g`) all of one shape, blocks dividing `seq`.
fn dims(arrays: &[(&str, &ArrayType)], block: (usize, usize)) -> Result<[usize; 3], KernelError> {
    let [bh, seq, d] = arrays[0].1.dims()?;
    for (name, a) in arrays {
        require(
            a.shape == arrays[0].1.shape,
            format!(
                "{name} is {:?} but q is {:?}: flash attention's q, k, v (and o, g) have one shape [batch * heads, seq, head_dim]",
                a.shape, arrays[0].1.shape
            ),
        )?;
        require(
            a.dtype == BF16,
            format!("{name} is {}: flash attention takes bf16", a.dtype),
        )?;
    }
    let (bq, bk) = block;
    require(
        bq > 0 && bk > 0 && seq % bq == 0 && seq % bk == 0,
        format!("block {block:?} must divide seq = {seq} (e.g. (128, 128))"),
    )?;
    Ok([bh, seq, d])
}

/// The key block holding query block `i`'s last row: with `causal`, later key blocks are all masked, so
/// index maps clamp to it and a skipped step fetches nothing new.
fn last_kv_block(
    i: Scalar<i32>,
    j: Scalar<i32>,
    causal: bool,
    bq: usize,
    bk: usize,
) -> Scalar<i32> {
    if causal {
        j.min(((i + 1) * (bq as i32) - 1) / (bk as i32))
    } else {
        j
    }
}

/// The first query block that sees any key of key block `j` (the dK/dV kernel's clamp).
fn first_q_block(
    j: Scalar<i32>,
    i: Scalar<i32>,
    causal: bool,
    bq: usize,
    bk: usize,
) -> Scalar<i32> {
    if causal {
        i.max(j * (bk as i32) / (bq as i32))
    } else {
        i
    }
}

/// The f32 `[bh, seq, 128]` log-sum-exp residual `flash_attention_fwd` writes.
fn lse_type(bh: usize, seq: usize) -> ArrayType {
    ArrayType::new([bh, seq, 128], F32)
}

/// Attention `softmax(q kᵀ / sqrt(head_dim)) v` (causal: query `r` sees keys `≤ r`) for bf16 `q, k, v`
/// of shape `[batch * heads, seq, head_dim]`, in `(block_q, block_k)` blocks; differentiable in `q`,
/// `k` and `v` (backward kernels `flash_attention_dkv` and `flash_attention_dq`).
#[export(
    fwd = flash_attention_fwd,
    grad(
        (k, v) = flash_attention_dkv(q, k, v, out0, out1, g, causal = causal, block = block),
        q = flash_attention_dq(q, k, v, out0, out1, g, causal = causal, block = block),
    )
)]
pub fn flash_attention(
    q: ArrayType,
    k: ArrayType,
    v: ArrayType,
    #[default(false)] causal: bool,
    #[default((128, 128))] block: (usize, usize),
) -> Result<PallasCall, KernelError> {
    forward(q, k, v, causal, block, false)
}

/// `flash_attention` plus the log-sum-exp of every query row (lane-replicated `[bh, seq, 128]` f32):
/// what the backward kernels read; run in its place under differentiation.
#[export]
pub fn flash_attention_fwd(
    q: ArrayType,
    k: ArrayType,
    v: ArrayType,
    #[default(false)] causal: bool,
    #[default((128, 128))] block: (usize, usize),
) -> Result<PallasCall, KernelError> {
    forward(q, k, v, causal, block, true)
}

fn forward(
    q: ArrayType,
    k: ArrayType,
    v: ArrayType,
    causal: bool,
    block: (usize, usize),
    residuals: bool,
) -> Result<PallasCall, KernelError> {
    let [bh, seq, d] = dims(&[("q", &q), ("k", &k), ("v", &v)], block)?;
    let (bq, bk) = block;
    let scale = 1.0 / (d as f32).sqrt();
    let rows = move |width: usize| query_rows(bq, width);
    let kv = move || key_blocks(block, d, causal);
    // One launch for both kernels (their Rust types differ, hence a macro rather than a variable).
    macro_rules! launch {
        ($kernel:expr, $($residual:expr)?) => {
            pallas_call($kernel.bind((causal, scale)))
                .grid([bh, q.blocks(1, bq)?, k.blocks(1, bk)?])
                .input(q, rows(d))
                .input(k, kv())
                .input(v, kv())
                .output(ArrayType::new([bh, seq, d], BF16), rows(d))
                $(.output($residual, rows(128)))?
                .scratch(Vmem::new([bq, 128], F32))
                .scratch(Vmem::new([bq, 128], F32))
                .scratch(Vmem::new([bq, d], F32))
                .dimension_semantics([Parallel, Parallel, Arbitrary])
                .build()
        };
    }
    if residuals {
        launch!(flash_attention_fwd_kernel, lse_type(bh, seq))
    } else {
        launch!(flash_attention_kernel,)
    }
}

/// The cotangents of `k` and `v` given the forward's `o` and log-sum-exp `lse` and the cotangent `g` of
/// `o`; a tuple `(dk, dv)`.
#[allow(clippy::too_many_arguments)]
#[export]
pub fn flash_attention_dkv(
    q: ArrayType,
    k: ArrayType,
    v: ArrayType,
    o: ArrayType,
    lse: ArrayType,
    g: ArrayType,
    #[default(false)] causal: bool,
    #[default((128, 128))] block: (usize, usize),
) -> Result<PallasCall, KernelError> {
    let [bh, seq, d] = backward_dims([&q, &k, &v, &o, &lse, &g], block)?;
    let (bq, bk) = block;
    let scale = 1.0 / (d as f32).sqrt();
    let rows = move |width: usize| {
        BlockSpec::new([1, bq, width], move |[b, j, i]| {
            (b, first_q_block(j, i, causal, bq, bk), 0)
        })
        .squeeze(0)
    };
    let keys = move || BlockSpec::new([1, bk, d], |[b, j, _]| (b, j, 0)).squeeze(0);
    pallas_call(flash_attention_dkv_kernel.bind((causal, scale)))
        .grid([bh, k.blocks(1, bk)?, q.blocks(1, bq)?])
        .input(q, rows(d))
        .input(k, keys())
        .input(v, keys())
        .input(o, rows(d))
        .input(lse, rows(128))
        .input(g, rows(d))
        .output(ArrayType::new([bh, seq, d], BF16), keys())
        .output(ArrayType::new([bh, seq, d], BF16), keys())
        .scratch(Vmem::new([bk, d], F32))
        .scratch(Vmem::new([bk, d], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .build()
}

/// The cotangent of `q` given the forward's `o` and log-sum-exp `lse` and the cotangent `g` of `o`.
#[allow(clippy::too_many_arguments)]
#[export]
pub fn flash_attention_dq(
    q: ArrayType,
    k: ArrayType,
    v: ArrayType,
    o: ArrayType,
    lse: ArrayType,
    g: ArrayType,
    #[default(false)] causal: bool,
    #[default((128, 128))] block: (usize, usize),
) -> Result<PallasCall, KernelError> {
    let [bh, seq, d] = backward_dims([&q, &k, &v, &o, &lse, &g], block)?;
    let (bq, bk) = block;
    let scale = 1.0 / (d as f32).sqrt();
    let rows = move |width: usize| query_rows(bq, width);
    let kv = move || key_blocks(block, d, causal);
    pallas_call(flash_attention_dq_kernel.bind((causal, scale)))
        .grid([bh, q.blocks(1, bq)?, k.blocks(1, bk)?])
        .input(q, rows(d))
        .input(k, kv())
        .input(v, kv())
        .input(o, rows(d))
        .input(lse, rows(128))
        .input(g, rows(d))
        .output(ArrayType::new([bh, seq, d], BF16), rows(d))
        .scratch(Vmem::new([bq, d], F32))
        .scratch(Vmem::new([bq, 128], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .build()
}

/// On grid `(b, i, j)` (query block `i`, key block `j`: the forward and dQ kernels), the `width` columns
/// of query block `i`'s rows.
fn query_rows(bq: usize, width: usize) -> BlockSpec<'static> {
    BlockSpec::new([1, bq, width], |[b, i, _]| (b, i, 0)).squeeze(0)
}

/// On the same grid, key (or value) block `j`, clamped with `causal` to the last block query block
/// `i` sees (see [`last_kv_block`]).
fn key_blocks((bq, bk): (usize, usize), d: usize, causal: bool) -> BlockSpec<'static> {
    BlockSpec::new([1, bk, d], move |[b, i, j]| {
        (b, last_kv_block(i, j, causal, bq, bk), 0)
    })
    .squeeze(0)
}

/// The checked `(batch * heads, seq, head_dim)` of a backward kernel's arrays `q, k, v, o, lse, g`.
fn backward_dims(
    [q, k, v, o, lse, g]: [&ArrayType; 6],
    block: (usize, usize),
) -> Result<[usize; 3], KernelError> {
    let [bh, seq, d] = dims(&[("q", q), ("k", k), ("v", v), ("o", o), ("g", g)], block)?;
    let want = lse_type(bh, seq);
    require(
        lse.shape == want.shape && lse.dtype == F32,
        format!(
            "lse is {}{:?}: the log-sum-exp residual of flash_attention_fwd is f32{:?}",
            lse.dtype, lse.shape, want.shape
        ),
    )?;
    Ok([bh, seq, d])
}

pub fn build() -> Result<PallasCall, KernelError> {
    let a = ArrayType::new([2, 1024, 128], BF16);
    flash_attention(a.clone(), a.clone(), a, false, (128, 128))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
