// Mistake: an index map returning a grid index instead of one block index per dimension.
use tpu_kernel::prelude::*;

fn main() {
    let _spec = BlockSpec::new([8, 128], |[i]| i);
}
