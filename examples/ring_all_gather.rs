//! A ring all-gather over one mesh axis (`jax.lax.all_gather(x, axis, tiled=True)` written as a
//! Pallas TPU kernel with remote DMA), run per device inside `jax.shard_map`.
//!
//! Each of the `n` devices along `axis` holds a shard `x` of `m` rows and builds the gathered `[n * m,
//! ..]` array in its output, which stays in HBM (`output_any`). It copies its own shard into its slot,
//! then, in `n - 1` steps, sends the slot it got last to its right neighbour's same slot and waits
//! for the one coming from its left. Before the first send, a handshake on the barrier semaphore
//! makes sure both neighbours are running the kernel (nothing lands in a buffer XLA may still be
//! using for something else).
//!
//! Each slot lands on a receive semaphore of its own: a device may run ahead of its right neighbour
//! by more than one step, and a semaphore counts bytes, not copies — with one receive semaphore, the
//! neighbour's first wait could be ended by the second slot landing while it forwards the first
//! (`interpret_spmd` reports that race).

use tpu_kernel::dtype::Element;
use tpu_kernel::prelude::*;

#[tpu_kernel]
fn ring_all_gather_kernel<T: Element>(
    x: Ref<T, Any>,
    o: RefMut<T, Any>,
    local: DmaSem,
    send: DmaSem,
    recv: DmaSem,
    axis: String,
) {
    let n = axis_size(axis.as_str());
    let me = axis_index(axis.as_str());
    let right = DeviceId::along(axis.as_str(), (me + 1) % n);
    let left = DeviceId::along(axis.as_str(), (me + n - 1) % n);
    let m = x.shape()[0];
    sync_copy(x, o.at(ds(me * m, m)), local);

    let barrier = barrier_semaphore();
    barrier.signal_on(1, left.clone());
    barrier.signal_on(1, right.clone());
    barrier.wait(2);

    for step in 0..n - 1 {
        // The slot received last (this device's own at the first step) goes on to the right, on the
        // slot's receive semaphore there; the one from the left comes on its own.
        let out = (me - step + n) % n;
        let sent = async_remote_copy(
            o.at(ds(out * m, m)),
            o.at(ds(out * m, m)),
            send,
            recv.at(out),
            right.clone(),
        );
        sent.start();
        sent.wait_send();
        let inn = (me - step - 1 + n) % n;
        let got = async_remote_copy(
            o.at(ds(inn * m, m)),
            o.at(ds(inn * m, m)),
            send,
            recv.at(inn),
            left.clone(),
        );
        got.wait_recv();
    }
}

/// The shard `x` (`[m, k]`, any dtype) of every device along mesh axis `axis`, stacked in device order
/// (`[n * m, k]`): the kernel runs on each device of the mesh it is called in.
#[export]
pub fn ring_all_gather(
    x: ArrayType,
    #[default("x".to_string())] axis: String,
) -> Result<PallasCall, KernelError> {
    let [m, k] = x.dims()?;
    let mesh = Mesh::current().ok_or_else(|| {
        KernelError::new(
            tpu_kernel::ErrorKind::Grid,
            "ring_all_gather runs on every device of a mesh: call it inside `jax.shard_map` (or `Mesh::scope`)",
        )
    })?;
    let (_, n, _) = mesh
        .axis(axis.as_str())
        .map_err(|e| e.for_argument("axis"))?;
    macro_rules! launch {
        ($t:ty) => {{
            let axis = axis.clone();
            pallas_call(
                move |x: Ref<$t, Any>, o: RefMut<$t, Any>, l: DmaSem, s: DmaSem, r: DmaSem| {
                    ring_all_gather_kernel::<$t>(x, o, l, s, r, axis.clone())
                },
            )
            .name("ring_all_gather_kernel")
            .input_any(x.clone())
            .output_any(ArrayType::new([n * m, k], x.dtype))
            .scratch(DmaSem::one())
            .scratch(DmaSem::one())
            .scratch(DmaSem::array([n]))
            .collective_id(0)
            .build()
        }};
    }
    match x.dtype {
        F32 => launch!(f32),
        BF16 => launch!(bf16),
        I32 => launch!(i32),
        d => Err(KernelError::new(
            tpu_kernel::ErrorKind::DType,
            format!("ring_all_gather takes float32, bfloat16 or int32 shards, not {d}"),
        )
        .for_argument("x")),
    }
}

pub fn build() -> Result<PallasCall, KernelError> {
    Mesh::new([("x", 4)])?.scope(|| ring_all_gather(ArrayType::new([8, 128], F32), "x".into()))
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
