//! A paged gather (the access pattern of paged attention's KV cache): `pages` stay in HBM
//! (`input_any`), and a block table placed in SMEM before the grid runs (`scalar_prefetch`) says which
//! pages belong to which sequence. Grid step `s` walks sequence `s`'s pages, DMA-ing each into one of
//! two VMEM slots — page `p + 1` is in flight while page `p` is added — and writes their sum:
//! `o[s] = pages[table[s, 0]] + pages[table[s, 1]] + ...`, a `[page_size, 128]` block per sequence,
//! added in page order.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn paged_gather_kernel(
    table: Ref<i32, Smem>,
    pages: Ref<f32, Any>,
    o: RefMut<f32>,
    buf: RefMut<f32>,
    sems: DmaSem,
) {
    let s = program_id(0);
    let pages_per_seq = table.shape()[1];
    async_copy(pages.at(table.at((s, 0)).load()), buf.at(0), sems.at(0)).start();
    let mut acc = full(o.shape(), 0.0f32);
    for p in 0..pages_per_seq {
        let slot = p % 2;
        if p + 1 < pages_per_seq {
            let next = 1 - slot;
            let page = table.at((s, p + 1)).load();
            async_copy(pages.at(page), buf.at(next), sems.at(next)).start();
        }
        async_copy(
            pages.at(table.at((s, p)).load()),
            buf.at(slot),
            sems.at(slot),
        )
        .wait();
        acc += buf.at(slot).load();
    }
    o.store(acc);
}

/// `o[s*ps..(s+1)*ps] = sum over p of pages[table[s, p]]` for an i32 block table `table` of shape
/// `[num_seqs, pages_per_seq]` (page numbers) and f32 `pages` of shape `[num_pages, ps, n]` left in HBM.
#[export]
pub fn paged_gather(table: ArrayType, pages: ArrayType) -> Result<PallasCall, KernelError> {
    let [num_seqs, pages_per_seq] = table.dims()?;
    let [_, page_size, n] = pages.dims()?;
    require(
        table.dtype == I32,
        format!("table is {}: the block table is i32", table.dtype),
    )?;
    require(
        pages.dtype == F32,
        format!("pages are {}: this example sums f32 pages", pages.dtype),
    )?;
    require(
        pages_per_seq > 0,
        "the block table has no pages per sequence",
    )?;
    pallas_call(paged_gather_kernel)
        .grid([num_seqs])
        .scalar_prefetch(table)
        .input_any(pages)
        .output(
            ArrayType::new([num_seqs * page_size, n], F32),
            BlockSpec::new([page_size, n], |[s]| (s, 0)),
        )
        .scratch(Vmem::new([2, page_size, n], F32))
        .scratch(DmaSem::array([2]))
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    paged_gather(
        ArrayType::new([8, 8], I32),
        ArrayType::new([64, 16, 128], F32),
    )
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
