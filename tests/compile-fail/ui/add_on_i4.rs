// Mistake: arithmetic on int4, a storage dtype (libtpu: "Only vector<i16> and vector<i32> are
// supported, but got 'i4'"); the note says to cast first.
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn k(x: Ref<i4>, o: RefMut<i4>) {
    o.store(x.load() + x.load());
}

fn main() {}
