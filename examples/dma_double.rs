//! A hand-written DMA (the Pallas reference `dma_double`): the input stays in HBM (`input_any`), each
//! grid step copies its 128 rows into a VMEM scratch buffer by DMA, waits, and doubles them.

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn dma_double_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    let bm = buf.shape()[0];
    let i = program_id(0);
    let copy = async_copy(x_hbm.at(ds(i * bm, bm)), buf, sem);
    copy.start();
    copy.wait();
    o.store(buf.load() * 2.0);
}

/// `o = 2 * x` for an f32 array `x` of shape `[m, n]` left in HBM, copied in `bm`-row blocks by DMA.
#[export]
pub fn dma_double(x: ArrayType, #[default(128)] bm: usize) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    pallas_call(dma_double_kernel)
        .grid([x.blocks(0, bm)?])
        .input_any(x)
        .output(
            ArrayType::new([m, n], F32),
            BlockSpec::new([bm, n], |[i]| (i, 0)),
        )
        .scratch(Vmem::new([bm, n], F32))
        .scratch(DmaSem::one())
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    dma_double(ArrayType::new([512, 128], F32), 128)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
