//! A ring reduce-scatter over one mesh axis (`jax.lax.psum_scatter(x, axis, scatter_dimension=0,
//! tiled=True)` written as a Pallas TPU kernel with remote DMA), run per device inside
//! `jax.shard_map`.
//!
//! Each of the `n` devices along `axis` holds an `[n * m, k]` array `x`; device `i` ends with block
//! `i` (rows `i * m ..`) of the sum of every device's `x`. In `n - 1` steps, each device sends its
//! partial sum of one block to its right neighbour and adds its own rows of the block it receives
//! from its left, so the partial that reaches device `i` at the last step is block `i` summed over
//! all `n` devices (added in ring order: `x` of device `i + 1`, then `i + 2`, …, then `i`'s own).
//!
//! Every step has a send buffer, a receive buffer and a receive semaphore of its own (VMEM scratch,
//! the same on every device): a device may run ahead of its right neighbour, and nothing it sends
//! may land where the neighbour still reads. A handshake on the barrier semaphore first makes sure
//! both neighbours are running the kernel (their scratch exists).

use tpu_kernel::dtype::Numeric;
use tpu_kernel::prelude::*;

#[tpu_kernel]
#[allow(clippy::too_many_arguments)]
fn ring_reduce_scatter_kernel<T: Numeric>(
    x: Ref<T>,
    o: RefMut<T>,
    send_buf: RefMut<T>,
    recv_buf: RefMut<T>,
    send: DmaSem,
    recv: DmaSem,
    axis: String,
) {
    let n = axis_size(axis.as_str());
    let me = axis_index(axis.as_str());
    let m = o.shape()[0];
    if n == 1 {
        o.store(x.load());
    } else {
        let right = DeviceId::along(axis.as_str(), (me + 1) % n);
        let left = DeviceId::along(axis.as_str(), (me + n - 1) % n);
        let barrier = barrier_semaphore();
        barrier.signal_on(1, left.clone());
        barrier.signal_on(1, right.clone());
        barrier.wait(2);

        // The first partial: this device's rows of the block its right neighbour adds to next.
        send_buf
            .at(0)
            .store(x.at(ds((me + n - 1) % n * m, m)).load());
        for step in 0..n - 1 {
            let sent = async_remote_copy(
                send_buf.at(step),
                recv_buf.at(step),
                send,
                recv.at(step),
                right.clone(),
            );
            sent.start();
            sent.wait_send();
            let got = async_remote_copy(
                send_buf.at(step),
                recv_buf.at(step),
                send,
                recv.at(step),
                left.clone(),
            );
            got.wait_recv();
            // The left neighbour's partial of block (me - step - 2) mod n, plus this device's rows.
            let block = (me - step + 2 * n - 2) % n;
            let partial = recv_buf.at(step).load() + x.at(ds(block * m, m)).load();
            if step + 1 < n - 1 {
                send_buf.at(step + 1).store(partial);
            } else {
                o.store(partial);
            }
        }
    }
}

/// Block `i` of the sum of every device's `x` (`[n * m, k]`, float32 or int32) on device `i` of
/// mesh axis `axis` (`[m, k]`): the kernel runs on each device of the mesh it is called in.
#[export]
pub fn ring_reduce_scatter(
    x: ArrayType,
    #[default("x".to_string())] axis: String,
) -> Result<PallasCall, KernelError> {
    let [rows, k] = x.dims()?;
    let mesh = Mesh::current().ok_or_else(|| {
        KernelError::new(
            tpu_kernel::ErrorKind::Grid,
            "ring_reduce_scatter runs on every device of a mesh: call it inside `jax.shard_map` (or `Mesh::scope`)",
        )
    })?;
    let (_, n, _) = mesh.axis(&axis).map_err(|e| e.for_argument("axis"))?;
    require(
        rows % n == 0,
        format!("x has {rows} rows, which the {n} devices along {axis:?} cannot split evenly"),
    )
    .map_err(|e| e.for_argument("x"))?;
    let m = rows / n;
    let steps = (n - 1).max(1);
    let whole = |shape: [usize; 2]| BlockSpec::new(shape, |[]| (0, 0));
    macro_rules! launch {
        ($t:ty) => {{
            let axis = axis.clone();
            pallas_call(
                move |x: Ref<$t>,
                      o: RefMut<$t>,
                      sb: RefMut<$t>,
                      rb: RefMut<$t>,
                      s: DmaSem,
                      r: DmaSem| {
                    ring_reduce_scatter_kernel::<$t>(x, o, sb, rb, s, r, axis.clone())
                },
            )
            .name("ring_reduce_scatter_kernel")
            .input(x.clone(), whole([rows, k]))
            .output(ArrayType::new([m, k], x.dtype), whole([m, k]))
            .scratch(Vmem::new([steps, m, k], x.dtype))
            .scratch(Vmem::new([steps, m, k], x.dtype))
            .scratch(DmaSem::one())
            .scratch(DmaSem::array([steps]))
            .collective_id(0)
            .build()
        }};
    }
    match x.dtype {
        F32 => launch!(f32),
        I32 => launch!(i32),
        d => Err(KernelError::new(
            tpu_kernel::ErrorKind::DType,
            format!("ring_reduce_scatter adds float32 or int32 arrays, not {d}"),
        )
        .for_argument("x")),
    }
}

pub fn build() -> Result<PallasCall, KernelError> {
    Mesh::new([("x", 4)])?.scope(|| ring_reduce_scatter(ArrayType::new([32, 128], F32), "x".into()))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
