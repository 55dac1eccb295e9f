// Mistake: a missing `;`. Only that line is reported: the rest of the body is still rewritten, so
// its correct comparisons on `Scalar`s raise no follow-on errors.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0);
    let y = x.load() * 2.0
    if i == 0 {
        o.store(y);
    }
    if i == num_programs(0) - 1 {
        o.store(y + 1.0);
    }
}

fn main() {}
