// Mistake: a typo (a missing `,`) inside a loop. Only that line is reported: the loop and the
// rest of its body are still rewritten (`j == 1` on a traced index raises no follow-on error).
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<f32>, o: RefMut<f32>) {
    let mut acc = x.load();
    for j in 0..4 {
        acc = maximum(acc acc * 0.5);
        if j == 1 {
            acc = acc * 2.0;
        }
    }
    o.store(acc);
}

fn main() {}
