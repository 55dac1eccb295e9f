//! Grouped matmul for mixture-of-experts (megablox's `gmm`): `lhs` holds the tokens sorted by expert
//! (group), `rhs[g]` is expert `g`'s weight, and `o[r] = lhs[r] @ rhs[g(r)]` for the group `g(r)` owning
//! row `r`. The grouping is data: a metadata table computed outside the kernel from the group sizes
//! (`group_metadata` below, exported with the library as a host function: what
//! `tpu_kernel.examples.group_metadata` calls), three i32 arrays scalar-prefetched into SMEM:
//! - `offsets[g]`, `offsets[g + 1]`: group `g`'s rows (`offsets[0] = 0`, `offsets[G] = m`);
//! - `group_ids[t]`, `m_tiles[t]`: which group and which `tm`-row tile of `lhs`/`o` step `t` visits.
//!
//! Each group visits the row tiles it touches, in order, so a tile straddling a group boundary is
//! visited once per group (consecutively: its output block stays in VMEM between those visits), and
//! each visit stores only its group's rows (the other rows keep what the previous visit wrote). With
//! `G` groups there are at most `m / tm + G - 1` visits; the table always has that many, unused
//! trailing steps repeat the last visit (storing the same rows again). Steps run `(n tiles, visits,
//! k tiles)` with an f32 accumulator over `k`; the rhs block is refetched only when the group changes.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn grouped_matmul_kernel(
    offsets: Ref<i32, Smem>,
    group_ids: Ref<i32, Smem>,
    m_tiles: Ref<i32, Smem>,
    lhs: Ref<bf16>,
    rhs: Ref<bf16>,
    o: RefMut<bf16>,
    acc: RefMut<f32>,
) {
    let (t, k) = (program_id(1), program_id(2));
    if k == 0 {
        acc.store(zeros());
    }
    // rhs's block is [1, tk, tn], expert g's (k, j) tile, reshaped here as the Pallas twin does (a
    // squeezed block dimension would lower to a [tk, tn] memref, where Pallas keeps [1, tk, tn])
    let (tk, tn) = (lhs.shape()[1], o.shape()[1]);
    acc += dot(lhs.load(), rhs.load().reshape([tk, tn]));
    if k == num_programs(2) - 1 {
        let g = group_ids.at(t).load();
        let (start, end) = (offsets.at(g).load(), offsets.at(g + 1).load());
        let tm = o.shape()[0] as i32;
        let row = iota::<i32>(o.shape(), 0) + m_tiles.at(t).load() * tm;
        let mine = (row >= start) & (row < end);
        o.store(select(mine, acc.load(), o.load().cast::<f32>()).cast::<bf16>());
    }
}

/// `o[r] = lhs[r] @ rhs[g]` for the rows `r` of group `g` (`offsets[g] <= r < offsets[g + 1]`), bf16
/// `lhs [m, k]` sorted by group, bf16 `rhs [G, k, n]`, i32 metadata from [`group_metadata`]: `offsets
/// [G + 1]`, `group_ids` and `m_tiles` `[m / tm + G - 1]`; f32 accumulation, bf16 out.
/// `vmem_limit_bytes` raises the scoped VMEM limit (the generation's default otherwise) for large
/// blocks.
#[export]
pub fn grouped_matmul(
    offsets: ArrayType,
    group_ids: ArrayType,
    m_tiles: ArrayType,
    lhs: ArrayType,
    rhs: ArrayType,
    #[default((128, 128, 128))] block: (usize, usize, usize),
    #[default(None)] vmem_limit_bytes: Option<i64>,
) -> Result<PallasCall, KernelError> {
    let (tm, tk, tn) = block;
    let [m, kk] = lhs.dims()?;
    let [num_groups, rk, n] = rhs.dims()?;
    let [no] = offsets.dims()?;
    let [visits] = group_ids.dims()?;
    let [mv] = m_tiles.dims()?;
    for (name, a) in [
        ("offsets", &offsets),
        ("group_ids", &group_ids),
        ("m_tiles", &m_tiles),
    ] {
        require(
            a.dtype == I32,
            format!("{name} is {}: metadata is i32", a.dtype),
        )?;
    }
    require(
        lhs.dtype == BF16 && rhs.dtype == BF16,
        format!(
            "lhs is {}, rhs is {}: both must be bf16",
            lhs.dtype, rhs.dtype
        ),
    )?;
    require(rk == kk, format!("lhs has k = {kk}, rhs has k = {rk}"))?;
    require(
        no == num_groups + 1,
        format!("offsets has {no} entries for {num_groups} groups: it needs G + 1"),
    )?;
    let tiles_m = lhs.blocks(0, tm)?;
    require(
        visits == tiles_m + num_groups - 1 && mv == visits,
        format!(
            "group_ids and m_tiles have {visits} and {mv} entries: m / tm + G - 1 = {} each",
            tiles_m + num_groups - 1
        ),
    )?;
    pallas_call(grouped_matmul_kernel)
        .grid([rhs.blocks(2, tn)?, visits, lhs.blocks(1, tk)?])
        .scalar_prefetch(offsets)
        .scalar_prefetch(group_ids)
        .scalar_prefetch(m_tiles)
        .input(
            lhs,
            BlockSpec::with_prefetch([tm, tk], |[_, t, k], [_, _, m_tiles]| {
                (m_tiles.at(t).load(), k)
            }),
        )
        .input(
            rhs,
            BlockSpec::with_prefetch([1, tk, tn], |[j, t, k], [_, group_ids, _]| {
                (group_ids.at(t).load(), k, j)
            }),
        )
        .output(
            ArrayType::new([m, n], BF16),
            BlockSpec::with_prefetch([tm, tn], |[j, t, _], [_, _, m_tiles]| {
                (m_tiles.at(t).load(), j)
            }),
        )
        .scratch(Vmem::new([tm, tn], F32))
        .dimension_semantics([Parallel, Arbitrary, Arbitrary])
        .vmem_limit_argument(vmem_limit_bytes)?
        .build()
}

/// `(offsets, group_ids, m_tiles)`: what `grouped_matmul` takes first.
pub type Metadata = (Vec<i32>, Vec<i32>, Vec<i32>);

/// The metadata `grouped_matmul` takes first, for `m` tokens sorted by group with group sizes `sizes`
/// (`G >= 1` of them, each `>= 0`, summing to `m`) in `tm`-row tiles (`m` a multiple of `tm`):
/// `(offsets [G + 1], group_ids, m_tiles)`, the last two `[m / tm + G - 1]`
/// (`tpu_kernel::reference::group_metadata`, checked). A host function of the examples library.
#[allow(dead_code)] // the example binary does not call it; examples-lib exports it
pub fn group_metadata(sizes: Vec<i32>, m: usize, tm: usize) -> Result<Metadata, KernelError> {
    require(!sizes.is_empty(), "group_metadata needs at least one group")?;
    require(
        tm > 0 && m.is_multiple_of(tm),
        format!("m = {m} is not a multiple of the row tile tm = {tm}"),
    )?;
    require(
        m.checked_add(tm)
            .is_some_and(|end| i32::try_from(end).is_ok()),
        format!("m = {m} rows in tiles of tm = {tm} do not fit the i32 metadata"),
    )?;
    for (g, &s) in sizes.iter().enumerate() {
        require(s >= 0, format!("group {g} has a negative size {s}"))?;
    }
    let total: i64 = sizes.iter().map(|&s| i64::from(s)).sum();
    require(
        total == m as i64,
        format!("the group sizes sum to {total}, not m = {m}"),
    )?;
    Ok(tpu_kernel::reference::group_metadata(&sizes, tm))
}

/// The example's shapes: m = 512 tokens, k = n = 512, 4 experts, 128-tiles (4 row tiles + 3 boundary
/// revisits = 7 visits; grid 4 × 7 × 4).
pub fn build() -> Result<PallasCall, KernelError> {
    let (m, k, n, groups, tm) = (512, 512, 512, 4, 128);
    let visits = m / tm + groups - 1;
    grouped_matmul(
        ArrayType::new([groups + 1], I32),
        ArrayType::new([visits], I32),
        ArrayType::new([visits], I32),
        ArrayType::new([m, k], BF16),
        ArrayType::new([groups, k, n], BF16),
        (tm, 128, 128),
        None,
    )
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
