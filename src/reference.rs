//! Plain-Rust references for the example kernels, keyed by kernel name: straightforward loops (f64
//! accumulation) written independently of the interpreter, used by `--run`, the interpreter tests and the
//! benchmark. Shapes come from the inputs; constants (`eps`, `scale`) are the examples' `build()` values.

use crate::runtime::interpret::HostArray;
use crate::{KernelError, PallasCall};
use half::bf16;

/// How close a result must be: `|got - want| <= atol + rtol * |want|` elementwise (non-finite values must
/// match exactly).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

impl Tolerance {
    pub const EXACT: Tolerance = Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };
    /// One bf16 rounding step (2^-8 relative), plus a little absolute slack.
    pub const BF16: Tolerance = Tolerance {
        atol: 1e-2,
        rtol: 1.0 / 128.0,
    };
    pub const F32: Tolerance = Tolerance {
        atol: 1e-5,
        rtol: 1e-5,
    };
}

/// The worst element of a comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// Largest `|got - want|` over elements where both are finite (∞ if a non-finite value differs).
    pub max_abs_error: f64,
    /// Whether every element is within the tolerance.
    pub ok: bool,
}

/// Compare two arrays of the same shape.
pub fn compare(got: &HostArray, want: &HostArray, tol: Tolerance) -> Comparison {
    if got.shape() != want.shape() {
        return Comparison {
            max_abs_error: f64::INFINITY,
            ok: false,
        };
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut max_abs_error: f64 = 0.0;
    let mut ok = true;
    for (a, b) in g.iter().zip(&w) {
        if !a.is_finite() || !b.is_finite() {
            let same = (a.is_nan() && b.is_nan()) || a == b;
            if !same {
                max_abs_error = f64::INFINITY;
                ok = false;
            }
            continue;
        }
        let e = (a - b).abs();
        max_abs_error = max_abs_error.max(e);
        if e > tol.atol + tol.rtol * b.abs() {
            ok = false;
        }
    }
    Comparison { max_abs_error, ok }
}

/// Random inputs for a kernel (deterministic in `seed`), one per kernel input. Scalar-prefetch tables
/// hold block numbers: random values in `0..b`, `b` the number of blocks along the leading dimension of
/// the first operand whose index map reads them; with no such operand, a table read by the body only
/// holds page numbers of the first ANY (HBM) input: `b` is its leading dimension.
///
/// `grouped_matmul_kernel`'s three tables are one piece of metadata: random group sizes (some empty,
/// boundaries inside tiles) turned into it by [`group_metadata`]; `paged_attention_kernel`'s are
/// ragged lengths and a block table of distinct pages (`paged_attention_inputs`).
pub fn random_inputs(call: &PallasCall, seed: u64) -> Vec<HostArray> {
    let k = call.ir();
    if k.name == "grouped_matmul_kernel" {
        if let Some(inputs) = grouped_matmul_inputs(call, seed) {
            return inputs;
        }
    }
    if k.name == "paged_attention_kernel" {
        if let Some(inputs) = paged_attention_inputs(call, seed) {
            return inputs;
        }
    }
    if k.name == "ragged_paged_attention_kernel" {
        if let Some(inputs) = ragged_paged_attention_inputs(call, seed) {
            return inputs;
        }
    }
    let blocks = k
        .operands
        .iter()
        .find_map(|o| {
            let b = o.block.as_ref().filter(|b| b.index_map.reads_refs())?;
            Some(o.shape.first()?.div_ceil(*b.block_shape.first()?))
        })
        .or_else(|| {
            k.inputs()
                .find(|o| o.space == crate::ir::MemSpace::Any)
                .and_then(|o| o.shape.first().copied())
        })
        .unwrap_or(1)
        .max(1);
    k.inputs()
        .enumerate()
        .map(|(i, o)| {
            let r = HostArray::random(&o.shape, o.dtype, seed + i as u64)
                .expect("build() checked these shapes");
            match (i < k.scalar_prefetch, r.as_slice::<i32>()) {
                (true, Some(v)) => {
                    let v = v.iter().map(|x| x.rem_euclid(blocks as i32)).collect();
                    HostArray::from_vec(&o.shape, v).unwrap_or(r)
                }
                _ => r,
            }
        })
        .collect()
}

/// Random group sizes for `grouped_matmul_kernel` (inputs: offsets `[G + 1]`, group ids and m tiles
/// `[m / tm + G - 1]`, lhs `[m, k]`, rhs `[G, k, n]`): `G - 1` random cut points in `0..=m`, so groups
/// may be empty and boundaries fall anywhere; the metadata from [`group_metadata`].
fn grouped_matmul_inputs(call: &PallasCall, seed: u64) -> Option<Vec<HostArray>> {
    let k = call.ir();
    let ops: Vec<_> = k.inputs().collect();
    let [offsets, ids, tiles, lhs, rhs] = ops.as_slice() else {
        return None;
    };
    let (m, groups) = (*lhs.shape.first()?, offsets.shape.first()?.checked_sub(1)?);
    let tm = *lhs.block.as_ref()?.block_shape.first()?;
    let mut next = below(seed);
    let mut cuts: Vec<usize> = (0..groups.saturating_sub(1))
        .map(|_| next(m as u64 + 1) as usize)
        .collect();
    cuts.sort_unstable();
    let bounds: Vec<usize> = std::iter::once(0).chain(cuts).chain([m]).collect();
    let sizes: Vec<i32> = bounds.windows(2).map(|w| (w[1] - w[0]) as i32).collect();
    let (o, g, t) = group_metadata(&sizes, tm);
    Some(vec![
        HostArray::from_vec(&offsets.shape, o).ok()?,
        HostArray::from_vec(&ids.shape, g).ok()?,
        HostArray::from_vec(&tiles.shape, t).ok()?,
        HostArray::random(&lhs.shape, lhs.dtype, seed + 3).expect("build() checked these shapes"),
        HostArray::random(&rhs.shape, rhs.dtype, seed + 4).expect("build() checked these shapes"),
    ])
}

/// A seeded xorshift stream: each call gives a number below its argument (below 1 for 0).
fn below(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n.max(1)
    }
}

/// A block table of `entries` slots from a shuffled pool of `pool` pages (distinct while the pool
/// lasts, then repeating), as a KV cache hands pages out.
fn block_table(pool: usize, entries: usize, next: &mut impl FnMut(u64) -> u64) -> Vec<i32> {
    let mut pages: Vec<i32> = (0..pool as i32).collect();
    for i in (1..pages.len()).rev() {
        pages.swap(i, next(i as u64 + 1) as usize);
    }
    (0..entries).map(|i| pages[i % pool.max(1)]).collect()
}

/// Ragged inputs for `paged_attention_kernel` (inputs: lengths `[B]`, page indices `[B, P]`, q `[B, H,
/// D]`, k and v pages `[KVH, N, ps, D]`): lengths `1`, `P * ps` (every page), `0` (an empty sequence,
/// which gives zeros) and `ps + 1` (one token into a second page) first, the others random in
/// `0..=P * ps`; the block table a random permutation of the pool's pages (distinct pages when there
/// are enough, as a KV cache hands them out), entries past a sequence's length included.
fn paged_attention_inputs(call: &PallasCall, seed: u64) -> Option<Vec<HostArray>> {
    let k = call.ir();
    let ops: Vec<_> = k.inputs().collect();
    let [lengths, table, q, kp, vp] = ops.as_slice() else {
        return None;
    };
    let (batch, pages_per_seq) = (*table.shape.first()?, *table.shape.get(1)?);
    let (pool, page_size) = (*kp.shape.get(1)?, *kp.shape.get(2)?);
    let max_len = (pages_per_seq * page_size) as u64;
    let mut next = below(seed);
    let edges = [1, max_len, 0, page_size as u64 + 1];
    let lens: Vec<i32> = (0..batch)
        .map(|b| edges.get(b).copied().unwrap_or_else(|| next(max_len + 1)) as i32)
        .collect();
    let entries = block_table(pool, batch * pages_per_seq, &mut next);
    Some(vec![
        HostArray::from_vec(&lengths.shape, lens).ok()?,
        HostArray::from_vec(&table.shape, entries).ok()?,
        HostArray::random(&q.shape, q.dtype, seed + 2).expect("build() checked these shapes"),
        HostArray::random(&kp.shape, kp.dtype, seed + 3).expect("build() checked these shapes"),
        HostArray::random(&vp.shape, vp.dtype, seed + 4).expect("build() checked these shapes"),
    ])
}

/// Valid inputs for `ragged_paged_attention_kernel` (inputs: `kv_lens [S]`, `page_indices [S * P]`,
/// `cu_q_lens [S + 1]`, `distribution [3]`, `q`, `kv`, `kv_cache [N, ps, ..]`): the first half of
/// the sequences decode (one query token), the rest take random query lengths that fit the tokens,
/// each `kv_len` random in `q_len..=P * ps`; pages handed out from a random permutation of the pool
/// (distinct while the pool lasts), the table's unused entries pointing at pages too.
fn ragged_paged_attention_inputs(call: &PallasCall, seed: u64) -> Option<Vec<HostArray>> {
    let k = call.ir();
    let ops: Vec<_> = k.inputs().collect();
    let [kv_lens, table, cu, dist, q, kv, cache] = ops.as_slice() else {
        return None;
    };
    let seqs = *kv_lens.shape.first()?;
    let pages_per_seq = *table.shape.first()? / seqs.max(1);
    let tokens = *kv.shape.first()?;
    let (pool, page_size) = (*cache.shape.first()?, *cache.shape.get(1)?);
    let max_kv = (pages_per_seq * page_size) as u64;
    let mut next = below(seed);
    let decode = seqs / 2;
    let mut budget = tokens.saturating_sub(seqs) as u64;
    let (mut q_lens, mut lens) = (Vec::new(), Vec::new());
    for s in 0..seqs {
        let extra = if s < decode {
            0
        } else {
            let e = next(budget.min(max_kv.saturating_sub(1)) + 1);
            budget -= e;
            e
        };
        let q_len = 1 + extra;
        q_lens.push(q_len as i32);
        lens.push((q_len + next(max_kv - q_len + 1)) as i32);
    }
    let mut cu_q = vec![0i32];
    for l in &q_lens {
        cu_q.push(cu_q.last().copied().unwrap_or(0) + l);
    }
    let entries = block_table(pool, seqs * pages_per_seq, &mut next);
    let d = decode as i32;
    Some(vec![
        HostArray::from_vec(&kv_lens.shape, lens).ok()?,
        HostArray::from_vec(&table.shape, entries).ok()?,
        HostArray::from_vec(&cu.shape, cu_q).ok()?,
        HostArray::from_vec(&dist.shape, vec![d, d, seqs as i32]).ok()?,
        HostArray::random(&q.shape, q.dtype, seed + 4).expect("build() checked these shapes"),
        HostArray::random(&kv.shape, kv.dtype, seed + 5).expect("build() checked these shapes"),
        HostArray::random(&cache.shape, cache.dtype, seed + 6)
            .expect("build() checked these shapes"),
    ])
}

/// The scalar-prefetched metadata of the `grouped_matmul` example for group sizes `sizes`
/// (non-negative, summing to `m`) and `tm`-row tiles: `(offsets, group_ids, m_tiles)`. `offsets` are
/// the groups' first rows plus `m`; visit `t` is tile `m_tiles[t]` for group `group_ids[t]`: each
/// non-empty group visits the tiles its rows touch, in order (a tile straddling a boundary once per
/// group), padded to `m / tm + G - 1` visits (the most there can be) by repeating the last one.
pub fn group_metadata(sizes: &[i32], tm: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let tm = tm.max(1) as i32;
    let mut offsets = vec![0];
    for s in sizes {
        offsets.push(offsets.last().copied().unwrap_or(0) + s);
    }
    let m = offsets.last().copied().unwrap_or(0);
    let visits = (m / tm) as usize + sizes.len().max(1) - 1;
    let (mut group_ids, mut m_tiles) = (Vec::new(), Vec::new());
    for (g, w) in offsets.windows(2).enumerate() {
        if w[1] > w[0] {
            for tile in w[0] / tm..(w[1] + tm - 1) / tm {
                group_ids.push(g as i32);
                m_tiles.push(tile);
            }
        }
    }
    while group_ids.len() < visits {
        group_ids.push(group_ids.last().copied().unwrap_or(0));
        m_tiles.push(m_tiles.last().copied().unwrap_or(0));
    }
    (offsets, group_ids, m_tiles)
}

/// The expected outputs of the example kernel `name` on `inputs`, with the tolerance to check them at;
/// `None` for a kernel without a reference.
pub fn expected(
    name: &str,
    inputs: &[HostArray],
) -> Option<Result<(Vec<HostArray>, Tolerance), KernelError>> {
    let r = match name {
        "add_kernel" => add(inputs).map(|o| (o, Tolerance::EXACT)),
        "gather_kernel" => gather(inputs, 8).map(|o| (o, Tolerance::EXACT)),
        "dma_double_kernel" => scale(inputs, 2.0).map(|o| (o, Tolerance::EXACT)),
        "inplace_scale_kernel" => scale(inputs, 3.0).map(|o| (o, Tolerance::EXACT)),
        "paged_gather_kernel" => paged_gather(inputs).map(|o| (o, Tolerance::EXACT)),
        "matmul_kernel" => matmul(inputs).map(|o| (o, Tolerance::BF16)),
        "grouped_matmul_kernel" => grouped_matmul(inputs).map(|o| (o, Tolerance::BF16)),
        "paged_attention_kernel" => paged_attention(inputs).map(|o| (o, Tolerance::BF16)),
        "flash_attention_kernel" => attention(inputs, false).map(|o| (o, Tolerance::BF16)),
        "quantized_matmul_kernel" => quantized_matmul(inputs).map(|o| (o, Tolerance::BF16)),
        "quantized_matmul_w8a8_kernel" => {
            quantized_matmul_w8a8(inputs).map(|o| (o, Tolerance::BF16))
        }
        "softmax_kernel" => softmax(inputs).map(|o| (o, Tolerance::F32)),
        "rmsnorm_kernel" => rmsnorm(inputs, 1e-6).map(|o| (o, Tolerance::BF16)),
        "causal_mask_kernel" => causal_mask(inputs, 0.125).map(|o| (o, Tolerance::EXACT)),
        "fori_rowsum_kernel" => fori_rowsum(inputs).map(|o| (o, Tolerance::F32)),
        "transpose_kernel" => transpose(inputs).map(|o| (o, Tolerance::EXACT)),
        "values_kernel" => values(inputs, 16).map(|o| (o, Tolerance::EXACT)),
        "strided_kernel" => butterfly(inputs).map(|o| (o, Tolerance::EXACT)),
        "colsum_kernel" => colsum(inputs).map(|o| {
            (
                o,
                Tolerance {
                    atol: 1e-4,
                    rtol: 1e-5,
                },
            )
        }),
        "activations_kernel" => activations(inputs).map(|o| {
            (
                o,
                Tolerance {
                    atol: 1e-4,
                    rtol: 1e-4,
                },
            )
        }),
        "ops_tour_kernel" => ops_tour(inputs).map(|o| {
            (
                o,
                Tolerance {
                    atol: 1e-4,
                    rtol: 1e-4,
                },
            )
        }),
        _ => return None,
    };
    Some(r)
}

// ---------------------------------------------------------------------------------------------- helpers

/// Each device's outputs, one list per device of a one-axis mesh.
pub type DeviceOutputs = Vec<Vec<HostArray>>;

/// What each device of a one-axis mesh should compute from `inputs` (one list per device), for the
/// kernels that talk across devices, and how close: `None` for a kernel without a reference. A
/// device's list may stop short of its outputs (scratch outputs are not compared).
pub fn expected_spmd(
    name: &str,
    inputs: &[Vec<HostArray>],
) -> Option<Result<(DeviceOutputs, Tolerance), KernelError>> {
    if name.starts_with("all_gather_matmul_kernel") {
        // every device: all of x (the shards in device order) @ its columns of y
        return Some((|| {
            let mut x = Vec::new();
            for device in inputs {
                x.extend(bf16_input(device, 0)?.0);
            }
            let (_, _, k) = bf16_input(&inputs[0], 0)?;
            let rows = x.len() / k;
            let x = bf16_out([rows, k], x)?;
            let outs = inputs
                .iter()
                .map(|device| matmul(&[x.clone(), device[1].clone()]))
                .collect::<Result<_, KernelError>>()?;
            Ok((outs, Tolerance::BF16))
        })());
    }
    let exact = |r: Result<DeviceOutputs, KernelError>| Some(r.map(|o| (o, Tolerance::EXACT)));
    match name {
        // every device: the shards of all, in device order
        "ring_all_gather_kernel" => exact((|| {
            let mut all = Vec::new();
            let mut rows = 0;
            let mut cols = 0;
            for device in inputs {
                let (x, m, n) = f32_input(device, 0)?;
                all.extend_from_slice(x);
                rows += m;
                cols = n;
            }
            let out = f32_out([rows, cols], all)?;
            Ok(inputs.iter().map(|_| vec![out.clone()]).collect())
        })()),
        // device i: block i of the sum, added in ring order (device i + 1's rows first, its own last)
        "ring_reduce_scatter_kernel" => exact((|| {
            let n = inputs.len();
            let mut outs = Vec::with_capacity(n);
            for i in 0..n {
                let (_, rows, cols) = f32_input(&inputs[i], 0)?;
                let m = rows / n;
                let block = |d: usize| -> Result<Vec<f32>, KernelError> {
                    let (x, _, _) = f32_input(&inputs[d], 0)?;
                    Ok(x[i * m * cols..(i + 1) * m * cols].to_vec())
                };
                let mut acc = block((i + 1) % n)?;
                for k in 2..=n {
                    for (a, v) in acc.iter_mut().zip(block((i + k) % n)?) {
                        *a += v;
                    }
                }
                outs.push(vec![f32_out([m, cols], acc)?]);
            }
            Ok(outs)
        })()),
        _ => None,
    }
}

fn bad(msg: impl Into<String>) -> KernelError {
    KernelError::new(crate::ErrorKind::Shape, msg)
}

fn f32_input(inputs: &[HostArray], i: usize) -> Result<(&[f32], usize, usize), KernelError> {
    let a = inputs
        .get(i)
        .ok_or_else(|| bad(format!("missing input {i}")))?;
    let d = a
        .as_slice::<f32>()
        .ok_or_else(|| bad(format!("input {i} is not f32")))?;
    let [m, n] = dims2(a)?;
    Ok((d, m, n))
}

fn bf16_input(inputs: &[HostArray], i: usize) -> Result<(Vec<f64>, usize, usize), KernelError> {
    let a = inputs
        .get(i)
        .ok_or_else(|| bad(format!("missing input {i}")))?;
    let d = a
        .as_slice::<bf16>()
        .ok_or_else(|| bad(format!("input {i} is not bf16")))?;
    let [m, n] = dims2(a)?;
    Ok((d.iter().map(|x| x.to_f64()).collect(), m, n))
}

fn i8_input(inputs: &[HostArray], i: usize) -> Result<(Vec<f64>, usize, usize), KernelError> {
    let a = inputs
        .get(i)
        .ok_or_else(|| bad(format!("missing input {i}")))?;
    let d = a
        .as_slice::<i8>()
        .ok_or_else(|| bad(format!("input {i} is not i8")))?;
    let [m, n] = dims2(a)?;
    Ok((d.iter().map(|&x| x as f64).collect(), m, n))
}

fn dims2(a: &HostArray) -> Result<[usize; 2], KernelError> {
    match a.shape() {
        [m, n] => Ok([*m, *n]),
        s => Err(bad(format!("expected a 2-D array, got shape {s:?}"))),
    }
}

fn f32_out(shape: [usize; 2], v: Vec<f32>) -> Result<HostArray, KernelError> {
    HostArray::from_vec(shape, v)
}

fn bf16_out(shape: [usize; 2], v: Vec<f64>) -> Result<HostArray, KernelError> {
    HostArray::from_vec(
        shape,
        v.into_iter()
            .map(|x| bf16::from_f32(x as f32))
            .collect::<Vec<_>>(),
    )
}

// ---------------------------------------------------------------------------------------------- kernels

/// `x + y`.
pub fn add(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let (y, ..) = f32_input(inputs, 1)?;
    Ok(vec![f32_out(
        [m, n],
        x.iter().zip(y).map(|(a, b)| a + b).collect(),
    )?])
}

/// `s * x` (the `dma_double` example).
pub fn scale(inputs: &[HostArray], s: f32) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    Ok(vec![f32_out([m, n], x.iter().map(|v| v * s).collect())?])
}

/// `2 * x[idx[i]*bm..][..bm]` for each block number `idx[i]` (the `gather_prefetch` example).
pub fn gather(inputs: &[HostArray], bm: usize) -> Result<Vec<HostArray>, KernelError> {
    let idx = inputs
        .first()
        .and_then(|a| a.as_slice::<i32>())
        .ok_or_else(|| bad("input 0 is not an i32 table"))?;
    let (x, m, n) = f32_input(inputs, 1)?;
    let mut out = Vec::with_capacity(idx.len() * bm * n);
    for &b in idx {
        let b = usize::try_from(b)
            .ok()
            .filter(|b| (b + 1) * bm <= m)
            .ok_or_else(|| bad(format!("block number {b} is out of range")))?;
        out.extend(x[b * bm * n..(b + 1) * bm * n].iter().map(|v| v * 2.0));
    }
    Ok(vec![f32_out([idx.len() * bm, n], out)?])
}

/// `sum over p of pages[table[s, p]]` per sequence `s`, added in f32 in page order as the kernel
/// adds them (so exactly equal), for an i32 block table `[num_seqs, pages_per_seq]` and f32 pages
/// `[num_pages, ps, n]` (the `paged_gather` example).
pub fn paged_gather(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let t = inputs.first().ok_or_else(|| bad("missing input 0"))?;
    let table = t
        .as_slice::<i32>()
        .ok_or_else(|| bad("input 0 is not an i32 table"))?;
    let [num_seqs, pages_per_seq] = dims2(t)?;
    let p = inputs.get(1).ok_or_else(|| bad("missing input 1"))?;
    let pages = p
        .as_slice::<f32>()
        .ok_or_else(|| bad("input 1 is not f32"))?;
    let &[num_pages, ps, n] = p.shape() else {
        return Err(bad("input 1 is not [num_pages, page_size, n]"));
    };
    let page_len = ps * n;
    let mut out = vec![0.0f32; num_seqs * page_len];
    for (s, row) in table.chunks(pages_per_seq.max(1)).enumerate() {
        let acc = &mut out[s * page_len..(s + 1) * page_len];
        for &page in row {
            let page = usize::try_from(page)
                .ok()
                .filter(|&q| q < num_pages)
                .ok_or_else(|| bad(format!("page number {page} is out of range")))?;
            for (a, v) in acc
                .iter_mut()
                .zip(&pages[page * page_len..(page + 1) * page_len])
            {
                *a += v;
            }
        }
    }
    Ok(vec![f32_out([num_seqs * ps, n], out)?])
}

/// bf16 `x @ y`, accumulated exactly (f64), rounded once to bf16.
pub fn matmul(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, k) = bf16_input(inputs, 0)?;
    let (y, _, n) = bf16_input(inputs, 1)?;
    let mut o = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let a = x[i * k + p];
            for j in 0..n {
                o[i * n + j] += a * y[p * n + j];
            }
        }
    }
    Ok(vec![bf16_out([m, n], o)?])
}

/// `softmax(q kᵀ / sqrt(d)) v` for each of the `bh` heads of bf16 `q, k, v: [bh, seq, d]` (with `causal`,
/// query `r` sees keys `≤ r`), in f64 and rounded once to bf16 (the `flash_attention` example, built
/// non-causal as the JAX op's default).
pub fn attention(inputs: &[HostArray], causal: bool) -> Result<Vec<HostArray>, KernelError> {
    let read = |i: usize| -> Result<([usize; 3], Vec<f64>), KernelError> {
        let a = inputs
            .get(i)
            .ok_or_else(|| bad(format!("missing input {i}")))?;
        let data = a
            .as_slice::<bf16>()
            .ok_or_else(|| bad(format!("input {i} is not bf16")))?;
        let &[bh, seq, d] = a.shape() else {
            return Err(bad(format!(
                "expected a 3-D array, got shape {:?}",
                a.shape()
            )));
        };
        Ok(([bh, seq, d], data.iter().map(|x| x.to_f64()).collect()))
    };
    let arrays = [read(0)?, read(1)?, read(2)?];
    let [bh, seq, d] = arrays[0].0;
    let (q, k, v) = (&arrays[0].1, &arrays[1].1, &arrays[2].1);
    let scale = 1.0 / (d as f64).sqrt();
    let mut o = vec![0.0f64; bh * seq * d];
    let mut p = vec![0.0f64; seq];
    for h in 0..bh {
        let at = |a: &[f64], r: usize, c: usize| a[(h * seq + r) * d + c];
        for r in 0..seq {
            let keys = if causal { r + 1 } else { seq };
            for (c, pc) in p.iter_mut().enumerate().take(keys) {
                *pc = (0..d).map(|x| at(q, r, x) * at(k, c, x)).sum::<f64>() * scale;
            }
            let max = p[..keys].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0.0;
            for pc in &mut p[..keys] {
                *pc = (*pc - max).exp();
                sum += *pc;
            }
            for x in 0..d {
                let acc: f64 = (0..keys).map(|c| p[c] * at(v, c, x)).sum();
                o[(h * seq + r) * d + x] = acc / sum;
            }
        }
    }
    Ok(vec![HostArray::from_vec(
        [bh, seq, d],
        o.into_iter()
            .map(|x| bf16::from_f32(x as f32))
            .collect::<Vec<_>>(),
    )?])
}

/// `(x @ w) * scale` for bf16 `x: [m, k]`, int8 `w: [k, n]`, f32 `scale: [1, n]`, rounded to bf16 (the
/// `quantized_matmul` example).
pub fn quantized_matmul(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, k) = bf16_input(inputs, 0)?;
    let (w, _, n) = i8_input(inputs, 1)?;
    let (scale, ..) = f32_input(inputs, 2)?;
    let o = scaled_product(&x, &w, [m, k, n], |_, j| scale[j] as f64);
    Ok(vec![bf16_out([m, n], o)?])
}

/// `(x @ w) * x_scale * w_scale` for int8 `x: [m, k]`, f32 `x_scale: [m, 1]`, int8 `w: [k, n]`, f32
/// `w_scale: [1, n]`, rounded to bf16 (the `quantized_matmul_w8a8` example).
pub fn quantized_matmul_w8a8(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, k) = i8_input(inputs, 0)?;
    let (x_scale, ..) = f32_input(inputs, 1)?;
    let (w, _, n) = i8_input(inputs, 2)?;
    let (w_scale, ..) = f32_input(inputs, 3)?;
    let o = scaled_product(&x, &w, [m, k, n], |i, j| {
        x_scale[i] as f64 * w_scale[j] as f64
    });
    Ok(vec![bf16_out([m, n], o)?])
}

/// `x @ w` (row-major `[m, k]` and `[k, n]`) in f64, element `(i, j)` multiplied by `scale(i, j)`.
fn scaled_product(
    x: &[f64],
    w: &[f64],
    [m, k, n]: [usize; 3],
    scale: impl Fn(usize, usize) -> f64,
) -> Vec<f64> {
    let mut o = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let a = x[i * k + p];
            for j in 0..n {
                o[i * n + j] += a * w[p * n + j];
            }
        }
        for j in 0..n {
            o[i * n + j] *= scale(i, j);
        }
    }
    o
}

/// `o[r] = lhs[r] @ rhs[g]` for every row `r` of group `g` (`offsets[g] <= r < offsets[g + 1]`), one
/// expert at a time, accumulated exactly (f64) and rounded once to bf16 (the `grouped_matmul` example;
/// inputs 1 and 2, the visit tables, are not read: each row's group comes from the offsets alone).
pub fn grouped_matmul(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let offsets = inputs
        .first()
        .and_then(|a| a.as_slice::<i32>())
        .ok_or_else(|| bad("input 0 is not the i32 group offsets"))?;
    let (x, m, k) = bf16_input(inputs, 3)?;
    let r = inputs.get(4).ok_or_else(|| bad("missing input 4"))?;
    let &[groups, rk, n] = r.shape() else {
        return Err(bad("input 4 is not [groups, k, n]"));
    };
    let w = r
        .as_slice::<bf16>()
        .ok_or_else(|| bad("input 4 is not bf16"))?;
    if rk != k || offsets.len() != groups + 1 {
        return Err(bad(
            "offsets, lhs and rhs disagree on k or the number of groups",
        ));
    }
    let mut o = vec![0.0f64; m * n];
    for (g, span) in offsets.windows(2).enumerate() {
        let rows = usize::try_from(span[0])
            .ok()
            .zip(usize::try_from(span[1]).ok())
            .filter(|&(a, b)| a <= b && b <= m)
            .ok_or_else(|| bad(format!("group {g} has rows {}..{}", span[0], span[1])))?;
        let wg = &w[g * k * n..(g + 1) * k * n];
        for i in rows.0..rows.1 {
            for p in 0..k {
                let a = x[i * k + p];
                for j in 0..n {
                    o[i * n + j] += a * wg[p * n + j].to_f64();
                }
            }
        }
    }
    Ok(vec![bf16_out([m, n], o)?])
}

/// Decode attention over a paged KV cache (the `paged_attention` example): for sequence `b` and query
/// head `i` (kv head `i / G`, `G` query heads per kv head), token `t < lengths[b]` is row `t % ps` of
/// page `page_indices[b, t / ps]`; `o[b, i] = softmax_t(q[b, i] . k_t) @ v` in f64 over the bf16
/// inputs, rounded once to bf16; zeros for an empty sequence.
pub fn paged_attention(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let input = |i: usize| {
        inputs
            .get(i)
            .ok_or_else(|| bad(format!("missing input {i}")))
    };
    let lengths = input(0)?
        .as_slice::<i32>()
        .ok_or_else(|| bad("input 0 is not the i32 lengths"))?;
    let t = input(1)?;
    let table = t
        .as_slice::<i32>()
        .ok_or_else(|| bad("input 1 is not the i32 page indices"))?;
    let [_, pages_per_seq] = dims2(t)?;
    let bf16s = |i: usize| -> Result<(Vec<f64>, Vec<usize>), KernelError> {
        let a = input(i)?;
        let d = a
            .as_slice::<bf16>()
            .ok_or_else(|| bad(format!("input {i} is not bf16")))?;
        Ok((d.iter().map(|x| x.to_f64()).collect(), a.shape().to_vec()))
    };
    let (q, qs) = bf16s(2)?;
    let (k, ks) = bf16s(3)?;
    let (v, _) = bf16s(4)?;
    let (&[batch, heads, d], &[kv_heads, pool, ps, _]) = (qs.as_slice(), ks.as_slice()) else {
        return Err(bad("q is not [B, H, D] or the pages not [KVH, N, ps, D]"));
    };
    let group = heads / kv_heads.max(1);
    let mut o = vec![0.0f64; batch * heads * d];
    for b in 0..batch {
        let len = usize::try_from(lengths[b])
            .ok()
            .filter(|&n| n <= pages_per_seq * ps)
            .ok_or_else(|| bad(format!("sequence {b} has length {}", lengths[b])))?;
        for i in 0..heads {
            let h = i / group.max(1);
            // Row `t` of kv head `h` as an offset into the pages.
            let row = |t: usize| -> Result<usize, KernelError> {
                let page = table[b * pages_per_seq + t / ps];
                let page = usize::try_from(page)
                    .ok()
                    .filter(|&p| p < pool)
                    .ok_or_else(|| bad(format!("page number {page} is out of range")))?;
                Ok(((h * pool + page) * ps + t % ps) * d)
            };
            let qi = &q[(b * heads + i) * d..][..d];
            let mut scores = Vec::with_capacity(len);
            for t in 0..len {
                let r = row(t)?;
                scores.push(qi.iter().zip(&k[r..r + d]).map(|(a, b)| a * b).sum::<f64>());
            }
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = weights.iter().sum();
            let out = &mut o[(b * heads + i) * d..][..d];
            for (t, w) in weights.iter().enumerate() {
                let r = row(t)?;
                for (x, vv) in out.iter_mut().zip(&v[r..r + d]) {
                    *x += w / sum * vv;
                }
            }
        }
    }
    HostArray::from_vec(
        [batch, heads, d],
        o.into_iter()
            .map(|x| bf16::from_f32(x as f32))
            .collect::<Vec<_>>(),
    )
    .map(|a| vec![a])
}

/// Row softmax in f64.
pub fn softmax(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let mut o = vec![0.0f32; m * n];
    for r in 0..m {
        let row = &x[r * n..(r + 1) * n];
        let mx = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let e: Vec<f64> = row.iter().map(|&v| (v as f64 - mx).exp()).collect();
        let s: f64 = e.iter().sum();
        for c in 0..n {
            o[r * n + c] = (e[c] / s) as f32;
        }
    }
    Ok(vec![f32_out([m, n], o)?])
}

/// `x * rsqrt(mean(x²) + eps) * w` per row of a bf16 `x`, f32 `w: [1, n]`, rounded to bf16.
pub fn rmsnorm(inputs: &[HostArray], eps: f64) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = bf16_input(inputs, 0)?;
    let (w, ..) = f32_input(inputs, 1)?;
    let mut o = vec![0.0f64; m * n];
    for r in 0..m {
        let row = &x[r * n..(r + 1) * n];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for c in 0..n {
            o[r * n + c] = row[c] * inv * w[c] as f64;
        }
    }
    Ok(vec![bf16_out([m, n], o)?])
}

/// `x * scale` on and below the diagonal, `-inf` above.
pub fn causal_mask(inputs: &[HostArray], scale: f32) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let o = (0..m * n)
        .map(|i| {
            if i / n >= i % n {
                x[i] * scale
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    Ok(vec![f32_out([m, n], o)?])
}

/// The `values` example in `[bm, n]` row blocks (`bm` even, `n` even): per block `i`,
/// `c = (i == 0 ? 2x : x + 1) + 3i`; `o[r, j] = c[r, (j - 1 + n/2) mod n] + c[(r - i - 1 + bm/2) mod bm, j]`;
/// `idx[r, j]` = 1000 × (first argmax of row `r`) + (first argmin of column `j` in the block).
pub fn values(inputs: &[HostArray], bm: usize) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let first = |v: &mut dyn Iterator<Item = f32>, max: bool| -> i32 {
        let mut best: Option<(usize, f32)> = None;
        for (k, y) in v.enumerate() {
            best = match best {
                None => Some((k, y)),
                Some((_, b)) if b.is_nan() => best,
                Some((_, b)) if y.is_nan() || (max && y > b) || (!max && y < b) => Some((k, y)),
                keep => keep,
            };
        }
        best.map_or(0, |(k, _)| k as i32)
    };
    let mut o = vec![0.0f32; m * n];
    let mut idx = vec![0i32; m * n];
    for blk in 0..m / bm {
        let at = |r: usize, j: usize| x[(blk * bm + r) * n + j];
        let c = |r: usize, j: usize| {
            let v = if blk == 0 {
                at(r, j) * 2.0
            } else {
                at(r, j) + 1.0
            };
            v + (blk * 3) as f32
        };
        for r in 0..bm {
            let amax = first(&mut (0..n).map(|j| at(r, j)), true);
            for j in 0..n {
                let lanes = c(r, (j + n - 1 + n / 2) % n);
                let shift = (blk + 1) % bm;
                let rows = c((r + bm - shift + bm / 2) % bm, j);
                o[(blk * bm + r) * n + j] = lanes + rows;
                let amin = first(&mut (0..bm).map(|k| at(k, j)), false);
                idx[(blk * bm + r) * n + j] = amax * 1000 + amin;
            }
        }
    }
    let idx = HostArray::from_vec([m, n], idx)?;
    Ok(vec![f32_out([m, n], o)?, idx])
}

/// `out[r, c] = sum_k x[8k + r, c]` into an `[8, n]` output.
pub fn fori_rowsum(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let mut o = vec![0.0f64; 8 * n];
    for r in 0..m {
        for c in 0..n {
            o[(r % 8) * n + c] += x[r * n + c] as f64;
        }
    }
    Ok(vec![f32_out(
        [8, n],
        o.into_iter().map(|v| v as f32).collect(),
    )?])
}

/// `x.T`.
pub fn transpose(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let o = (0..n * m).map(|i| x[(i % m) * n + i / m]).collect();
    Ok(vec![f32_out([n, m], o)?])
}

/// `o[2i] = x[2i] + x[2i+1]`, `o[2i+1] = x[2i] - x[2i+1]` (the `strided` example).
pub fn butterfly(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let o = (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            let (even, odd) = (x[(r & !1) * n + c], x[(r | 1) * n + c]);
            if r % 2 == 0 {
                even + odd
            } else {
                even - odd
            }
        })
        .collect();
    Ok(vec![f32_out([m, n], o)?])
}

/// Column sums, repeated on each of 8 output rows.
pub fn colsum(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let mut s = vec![0.0f64; n];
    for r in 0..m {
        for c in 0..n {
            s[c] += x[r * n + c] as f64;
        }
    }
    let o = (0..8 * n).map(|i| s[i % n] as f32).collect();
    Ok(vec![f32_out([8, n], o)?])
}

/// The `ops_tour` example (its `build()` blocks of 64 rows): GELU, `dot_nt`, a doubling on even blocks,
/// three clamped halvings, a masked store of the lower triangle's even columns, a per-column bias of
/// 0.001 × kept count, and the per-block kept counts.
pub fn ops_tour(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    const BM: usize = 64;
    let (x, m, n) = f32_input(inputs, 0)?;
    let (w, ..) = f32_input(inputs, 1)?;
    let gelu = |v: f64| 0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044715 * v * v * v)).tanh());
    let mut o = vec![0.0f32; m * n];
    let mut counts = vec![0i32; 8 * (m / BM) * n];
    for blk in 0..m / BM {
        let mut kept = vec![0i32; n];
        for rr in 0..BM {
            let r = blk * BM + rr;
            for (c, k) in kept.iter_mut().enumerate() {
                if r >= c && c % 2 == 0 {
                    *k += 1;
                }
            }
        }
        for rr in 0..BM {
            let r = blk * BM + rr;
            for c in 0..n {
                let mut v = 0.0f64;
                for p in 0..n {
                    v += gelu(x[r * n + p] as f64) * w[c * n + p] as f64;
                }
                if blk % 2 == 0 {
                    v *= 2.0;
                }
                for _ in 0..3 {
                    v = (v * 0.5).max(-1.0);
                }
                let keep = r >= c && c % 2 == 0;
                o[r * n + c] = ((if keep { v } else { 0.0 }) + 0.001 * kept[c] as f64) as f32;
            }
        }
        for rr in 0..8 {
            for c in 0..n {
                counts[(blk * 8 + rr) * n + c] = kept[c];
            }
        }
    }
    Ok(vec![
        f32_out([m, n], o)?,
        HostArray::from_vec([8 * (m / BM), n], counts)?,
    ])
}

/// The `activations` example, step by step in f32 as the kernel computes (the transcendentals in f64,
/// rounded to f32), so rounding, floor and ceil see the kernel's own values.
pub fn activations(inputs: &[HostArray]) -> Result<Vec<HostArray>, KernelError> {
    let (x, m, n) = f32_input(inputs, 0)?;
    let (g, ..) = f32_input(inputs, 1)?;
    let codes = inputs
        .get(2)
        .and_then(|a| a.as_slice::<i32>())
        .ok_or_else(|| bad("input 2 is not i32"))?;
    let f = |v: f64| v as f32;
    let sign = |v: f32| {
        if v > 0.0 {
            1.0
        } else if v < 0.0 {
            -1.0
        } else {
            v
        }
    };
    let expm1 = |v: f32| f(f64::from(v).exp_m1());
    let o = x
        .iter()
        .zip(g)
        .map(|(&x, &g)| {
            let gelu = 0.5 * x * (1.0 + f(libm::erf(f64::from(x * 0.707_106_77))));
            let silu = g * f(1.0 / (1.0 + (-f64::from(g)).exp()));
            let capped = f(f64::from(silu * x * 0.1).tanh()) * 10.0;
            let shaped =
                (f(f64::from(x.abs()).ln_1p()) + expm1(x * 0.25) + (x * 2.5).round_ties_even()
                    - x.floor()
                    + x.ceil())
                    * sign(x);
            let y = gelu + capped + shaped.clamp(-4.0, 4.0);
            if y.is_nan() {
                0.0
            } else {
                y
            }
        })
        .collect();
    let packed = codes
        .iter()
        .map(|&c| ((c.wrapping_shl(3) >> 5) ^ (c & 255)) | (c >> 31))
        .collect::<Vec<i32>>();
    Ok(vec![
        f32_out([m, n], o)?,
        HostArray::from_vec([m, n], packed)?,
    ])
}
