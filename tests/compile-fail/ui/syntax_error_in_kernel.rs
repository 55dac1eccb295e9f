// Mistake: a typo (a missing operand) in one statement. Only that line is reported: the rest of
// the body is still rewritten, so its correct comparisons on `Scalar`s raise no follow-on errors.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let i = program_id(0);
    let y = x.load() * ;
    if i == 0 {
        o.store(x.load());
    }
    if i == num_programs(0) - 1 {
        o.store(y + 1.0);
    }
}

fn main() {}
