//! Flash attention, forward (issue 12): bf16 `q, k, v` of shape `[batch * heads, seq, head_dim]`, softmax
//! statistics in f32. Grid `(batch * heads, seq / block_q, seq / block_k)`, the last axis `arbitrary`:
//! each step folds one `[block_k, head_dim]` block of keys and values into the running maximum `m`,
//! normaliser `l` and accumulator `acc` of its `block_q` queries (online softmax, kept in VMEM scratch;
//! `m` and `l` lane-replicated to 128 columns, as Pallas keeps them). With `causal`, key blocks wholly
//! above the diagonal are skipped and the diagonal block is masked.

use tpu_kernel::prelude::*;

/// Scores of masked (future) keys: finite, so a row never holds only -inf (no NaN from `exp(-inf + inf)`).
const MASK: f32 = -0.7 * f32::MAX;

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
        let mut s = dot_nt(q.load(), k.load()) * scale;
        if causal {
            let row = iota::<i32>([bq, bk], 0) + i * (bq as i32);
            let col = iota::<i32>([bq, bk], 1) + j * (bk as i32);
            s = select(col <= row, s, MASK);
        }
        let m_prev = m_sc.load().slice((.., 0..1));
        let m_new = maximum(m_prev, s.max_keepdims(1));
        let p = (s - m_new).exp();
        let alpha = (m_prev - m_new).exp();
        let l_new = alpha * l_sc.load().slice((.., 0..1)) + p.sum_keepdims(1);
        acc.store(acc.load() * alpha + dot(p.cast::<bf16>(), v.load()));
        m_sc.store(m_new.broadcast_to([bq, 128]));
        l_sc.store(l_new.broadcast_to([bq, 128]));
    }
    if j == num_programs(2) - 1 {
        o.store((acc.load() / l_sc.load().slice((.., 0..1))).cast::<bf16>());
    }
}

/// Attention `softmax(q kᵀ / sqrt(head_dim)) v` (causal: query `r` sees keys `≤ r`) for bf16 `q, k, v`
/// of shape `[batch * heads, seq, head_dim]`, in `(block_q, block_k)` blocks.
#[export]
pub fn flash_attention(
    q: ArrayType,
    k: ArrayType,
    v: ArrayType,
    #[default(false)] causal: bool,
    #[default((128, 128))] block: (usize, usize),
) -> Result<PallasCall, KernelError> {
    let (bq, bk) = block;
    let [bh, seq, d] = q.dims()?;
    require(
        k.shape == q.shape && v.shape == q.shape,
        format!(
            "q is {:?}, k {:?}, v {:?}: flash_attention takes three arrays of one shape",
            q.shape, k.shape, v.shape
        ),
    )?;
    require(
        q.dtype == BF16 && k.dtype == BF16 && v.dtype == BF16,
        "q, k and v are bf16",
    )?;
    let scale = 1.0 / (d as f32).sqrt();
    let qspec = BlockSpec::new([1, bq, d], |[b, i, _]| (b, i, 0)).squeeze(0);
    let kvspec = || BlockSpec::new([1, bk, d], |[b, _, j]| (b, j, 0)).squeeze(0);
    pallas_call(flash_attention_kernel.bind((causal, scale)))
        .grid([bh, q.blocks(1, bq)?, k.blocks(1, bk)?])
        .input(q, qspec)
        .input(k, kvspec())
        .input(v, kvspec())
        .output(
            ArrayType::new([bh, seq, d], BF16),
            BlockSpec::new([1, bq, d], |[b, i, _]| (b, i, 0)).squeeze(0),
        )
        .scratch(Vmem::new([bq, 128], F32))
        .scratch(Vmem::new([bq, 128], F32))
        .scratch(Vmem::new([bq, d], F32))
        .dimension_semantics([Parallel, Parallel, Arbitrary])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    let a = ArrayType::new([2, 1024, 128], BF16);
    flash_attention(a.clone(), a.clone(), a, true, (128, 128))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
