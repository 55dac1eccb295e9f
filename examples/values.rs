//! The values real kernels build (issue 21 item 5), one kernel using each, 64×256 f32 in 16-row
//! blocks: `select` on a traced scalar condition (`jnp.where(pl.program_id(0) == 0, a, b)`), `full`
//! of a traced scalar, `concatenate` on lanes and on sublanes, `roll` by a static and a traced shift
//! (`pltpu.roll`), and `argmax`/`argmin` (`jnp.argmax`).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn values_kernel(x: Ref<f32>, o: RefMut<f32>, idx: RefMut<i32>) {
    let a = x.load(); // [16, 256]
    let i = program_id(0);
    let b = select(i == 0, a * 2.0, a + 1.0);
    let c = b + full([16, 256], i * 3).cast::<f32>();
    let lanes = concatenate((c.slice((.., 128..)), c.slice((.., ..128))), 1);
    let rows = concatenate((c.slice((8.., ..)), c.slice((..8, ..))), 0);
    o.store(roll(lanes, 1, 1) + roll(rows, i + 1, 0));
    let first_max = (a.argmax(1).reshape([16, 1]) * 1000).broadcast_to([16, 256]);
    let first_min = a.argmin(0).reshape([1, 256]).broadcast_to([16, 256]);
    idx.store(first_max + first_min);
}

/// For an f32 `[m, n]` array in `[bm, n]` row blocks (block `i`, `c = (i == 0 ? 2x : x + 1) + 3i`):
/// `o` = `c` with its lane halves swapped rolled by one lane, plus `c` with its sublane halves swapped
/// rolled by `i + 1` rows; `idx[r, j]` = 1000 × (first argmax of row `r`) + first argmin of column
/// `j` in the block.
#[export]
pub fn values(x: ArrayType, #[default(16)] bm: usize) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let spec = || BlockSpec::new([bm, n], |[i]| (i, 0));
    pallas_call(values_kernel)
        .grid([x.blocks(0, bm)?])
        .input(x, spec())
        .output(ArrayType::new([m, n], F32), spec())
        .output(ArrayType::new([m, n], I32), spec())
        .dimension_semantics([Parallel])
        .build()
}

pub fn build() -> Result<PallasCall, KernelError> {
    values(ArrayType::new([64, 256], F32), 16)
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
