//! tpu-inference's all-gather matmul (`tpu_inference.kernels.collectives.all_gather_matmul`, 0.32.0):
//! `all_gather(x, axis=0) @ y` with the gather overlapped with the matmul, per device inside
//! `jax.shard_map`, `x` sharded by rows and `y` by columns over one mesh axis of `tp` devices.
//!
//! The algorithm is tpu-inference's, step for step. The grid is `(tp + 2, n_per_device / bn, k / bk)`:
//! along its first axis the `x` shards travel a **bidirectional ring** — each device's upper half of
//! rows goes left and its lower half right, into the neighbours' HBM scratch (an extra output,
//! `[tp - 1, m_per_device, k]`, one slot per outer step, each with its own send and receive
//! semaphores) — while each step multiplies the rows that arrived one outer step before, a `[k,
//! n_per_device]` `y` block staying in VMEM. Every copy is double-buffered one grid step ahead: `x`
//! into a VMEM slot, the product's `[m_per_device, bn]` block out to the output rows its halves came
//! from. A double barrier with both neighbours (the second on a scoped semaphore) comes first, so a
//! kernel re-entered with the same collective id cannot meet a neighbour's stale signal.
//!
//! Block sizes: tpu-inference's tuned table (v6, bf16, tp 8), else `bn = n_per_device` and `bk = k`.
//! tpu-inference's own fallback is `bn = n`, the global `n`, which runs its `[.., bn]` windows past the
//! per-device arrays; ours refuses such a `bn` with an error naming it.

use tpu_kernel::dtype::{DotElement, Element};
use tpu_kernel::prelude::*;

/// The static configuration of one launch.
#[derive(Clone, Debug)]
pub struct Config {
    pub axis: String,
    pub bn: usize,
    pub bk: usize,
    pub rhs_transpose: bool,
}

/// The ring's remote copies of one outer step: direction 0 sends the upper half of the rows left,
/// direction 1 the lower half right, into the neighbour's HBM scratch slot `outer_step`.
struct Ring<T> {
    x_hbm: Ref<T, Any>,
    x_hbm_scratch: RefMut<T, Any>,
    send_sems: DmaSem,
    recv_sems: DmaSem,
    outer_step: Scalar<i32>,
    half: usize,
    left: DeviceId,
    right: DeviceId,
}

impl<T: Element> Ring<T> {
    fn new(
        (x_hbm, x_hbm_scratch): (Ref<T, Any>, RefMut<T, Any>),
        (send_sems, recv_sems): (DmaSem, DmaSem),
        outer_step: Scalar<i32>,
        half: usize,
        (left, right): (DeviceId, DeviceId),
    ) -> Self {
        Ring {
            x_hbm,
            x_hbm_scratch,
            send_sems,
            recv_sems,
            outer_step,
            half,
            left,
            right,
        }
    }
    fn rows(&self, dir: usize) -> std::ops::Range<usize> {
        if dir == 0 {
            0..self.half
        } else {
            self.half..2 * self.half
        }
    }
    fn device(&self, dir: usize) -> DeviceId {
        if dir == 0 { &self.left } else { &self.right }.clone()
    }
    /// Outer step 0: this device's own rows.
    #[track_caller]
    fn first(&self, dir: usize) -> RemoteCopy {
        async_remote_copy(
            self.x_hbm.at(self.rows(dir)),
            self.x_hbm_scratch.at((self.outer_step, self.rows(dir))),
            self.send_sems.at((dir, self.outer_step)),
            self.recv_sems.at((dir, self.outer_step)),
            self.device(dir),
        )
    }
    /// Later outer steps: the rows received one step before, passed on.
    #[track_caller]
    fn next(&self, dir: usize) -> RemoteCopy {
        async_remote_copy(
            self.x_hbm_scratch.at((self.outer_step - 1, self.rows(dir))),
            self.x_hbm_scratch.at((self.outer_step, self.rows(dir))),
            self.send_sems.at((dir, self.outer_step)),
            self.recv_sems.at((dir, self.outer_step)),
            self.device(dir),
        )
    }
}

/// tpu-inference's `local_barrier`: signal both neighbours on the barrier semaphore and wait for
/// theirs, then again on a scoped semaphore (a neighbour re-entering the kernel with the same
/// collective id signals the barrier a second time; the second barrier keeps that from releasing
/// this device early).
fn double_barrier(axis: &str, left: Scalar<i32>, right: Scalar<i32>) {
    let barrier = barrier_semaphore();
    barrier.signal_on(1, DeviceId::along(axis, left));
    barrier.signal_on(1, DeviceId::along(axis, right));
    barrier.wait(2);
    let axis = axis.to_string();
    run_scoped(
        move |second: Sem| {
            second.signal_on(1, DeviceId::along(axis.as_str(), left));
            second.signal_on(1, DeviceId::along(axis.as_str(), right));
            second.wait(2);
        },
        (),
        Sem::one(),
    );
}

#[tpu_kernel]
#[allow(clippy::too_many_arguments)]
fn all_gather_matmul_kernel<T: DotElement<Acc = f32>>(
    x_hbm: Ref<T, Any>,
    y_hbm: Ref<T, Any>,
    o_hbm: RefMut<T, Any>,
    x_hbm_scratch: RefMut<T, Any>,
    x_local_copy_sem: DmaSem,
    y_local_copy_sem: DmaSem,
    o_local_copy_sem: DmaSem,
    send_sems: DmaSem,
    recv_sems: DmaSem,
    x_vmem: RefMut<T>,
    y_vmem: RefMut<T>,
    o_vmem: RefMut<T>,
    acc_vmem: RefMut<f32>,
    cfg: Config,
) {
    let (bn, bk) = (cfg.bn, cfg.bk);
    let num_devices = num_programs(0) - 2;
    let grid_n = num_programs(1);
    let grid_k = num_programs(2);
    let outer_step = program_id(0);
    let bn_i = program_id(1);
    let bk_i = program_id(2);
    let gn_by_gk = grid_n * grid_k;
    let global_step_id = outer_step * gn_by_gk + bn_i * grid_k + bk_i;
    let mxu_total_steps = num_devices * gn_by_gk;
    let my_id = axis_index(cfg.axis.as_str());
    let left_neighbor = (my_id + num_devices - 1) % num_devices;
    let right_neighbor = (my_id + 1) % num_devices;
    let left = DeviceId::along(cfg.axis.as_str(), left_neighbor);
    let right = DeviceId::along(cfg.axis.as_str(), right_neighbor);
    let x_hbm_working_slot = outer_step - 1;
    let x_vmem_receiving_slot = outer_step % 2;
    let m_per_device = x_hbm.shape()[0];
    let half = m_per_device / 2;
    let k_slice = ds(bk_i * bk, bk);

    // The copies, described once each (started in one grid step, waited on in another).
    let first_x_local = async_copy(
        x_hbm.at((.., k_slice)),
        x_vmem.at((x_vmem_receiving_slot, .., k_slice)),
        x_local_copy_sem,
    );
    let x_left_local = async_copy(
        x_hbm_scratch.at((x_hbm_working_slot, ..half, k_slice)),
        x_vmem.at((x_vmem_receiving_slot, ..half, k_slice)),
        x_local_copy_sem,
    );
    let x_right_local = async_copy(
        x_hbm_scratch.at((x_hbm_working_slot, half.., k_slice)),
        x_vmem.at((x_vmem_receiving_slot, half.., k_slice)),
        x_local_copy_sem,
    );
    let n_slice = ds(bn_i * bn, bn);
    let y_local = if cfg.rhs_transpose {
        async_copy(
            y_hbm.at((n_slice, k_slice)),
            y_vmem.at((n_slice, k_slice)),
            y_local_copy_sem,
        )
    } else {
        async_copy(
            y_hbm.at((k_slice, n_slice)),
            y_vmem.at((k_slice, n_slice)),
            y_local_copy_sem,
        )
    };
    // The remote copies pick their semaphores (`send_sems.at((0, outer_step))`) where they start or
    // wait: only steps that copy have one.
    let ring = Ring::new(
        (x_hbm, x_hbm_scratch),
        (send_sems, recv_sems),
        outer_step,
        half,
        (left, right),
    );
    // The product block of grid step `global_step_id - grid_k - 1` goes out to the rows its halves
    // came from: the upper half from the device `offset` to the right, the lower from `offset` left.
    let o_working_slot = 1 - (global_step_id + grid_k - 1) / grid_k % 2;
    let o_n = ds((global_step_id - grid_k - 1) % gn_by_gk / grid_k * bn, bn);
    let offset = (global_step_id - 2) / gn_by_gk;
    let left_o_idx = (my_id + offset) % num_devices * 2;
    let right_o_idx = (my_id - offset + num_devices) % num_devices * 2 + 1;
    let o_left_local = async_copy(
        o_vmem.at((o_working_slot, ..half)),
        o_hbm.at((ds(left_o_idx * half, half), o_n)),
        o_local_copy_sem,
    );
    let o_right_local = async_copy(
        o_vmem.at((o_working_slot, half..)),
        o_hbm.at((ds(right_o_idx * half, half), o_n)),
        o_local_copy_sem,
    );

    if global_step_id == 0 {
        let _scope = named_scope("_start_first_remote_copy");
        if grid_k > 1 {
            acc_vmem.store(zeros());
        }
        double_barrier(cfg.axis.as_str(), left_neighbor, right_neighbor);
        ring.first(0).start();
        ring.first(1).start();
    }
    let between = outer_step > 0 && outer_step < num_devices - 1;
    if between && global_step_id % gn_by_gk == 0 {
        let _scope = named_scope("_start_subsequent_remote_copy");
        ring.next(0).start();
        ring.next(1).start();
    }
    if outer_step == 0 && bn_i == 0 {
        let _scope = named_scope("_start_first_local_x_copy");
        first_x_local.start();
    }
    let x_arriving = outer_step > 0 && outer_step < num_devices && bn_i == 0;
    if x_arriving {
        let _scope = named_scope("_start_subsequent_x_local_copy");
        x_left_local.start();
        x_right_local.start();
    }
    if outer_step == 0 {
        let _scope = named_scope("_start_y_local_copy");
        y_local.start();
    }
    let o_step = if grid_k == 1 {
        global_step_id >= 2 && global_step_id < mxu_total_steps + 2
    } else {
        global_step_id >= grid_k + 1 && global_step_id < mxu_total_steps + grid_k + 1
    };
    let o_start = if grid_k == 1 {
        o_step
    } else {
        o_step && global_step_id % grid_k == 1
    };
    if o_start {
        let _scope = named_scope("_start_o_local_copy");
        o_left_local.start();
        o_right_local.start();
    }
    if global_step_id >= 1 && global_step_id < 1 + mxu_total_steps {
        let _scope = named_scope("_mxu");
        // The product of the x rows that arrived one outer step ago.
        let working = global_step_id - 1;
        let working_bk_i = working % grid_k;
        let working_n = ds(working % gn_by_gk / grid_k * bn, bn);
        let working_k = ds(working_bk_i * bk, bk);
        let x_vmem_working_slot = working / gn_by_gk % 2;
        let o_receiving_slot = (global_step_id + grid_k - 1) / grid_k % 2;
        if grid_k == 1 {
            let lhs = x_vmem.at(x_vmem_working_slot).load();
            let product = if cfg.rhs_transpose {
                dot_nt(lhs, y_vmem.at((working_n, ..)).load())
            } else {
                dot(lhs, y_vmem.at((.., working_n)).load())
            };
            o_vmem.at(o_receiving_slot).store(product.cast::<T>());
        } else {
            let lhs = x_vmem.at((x_vmem_working_slot, .., working_k)).load();
            let product = if cfg.rhs_transpose {
                dot_nt(lhs, y_vmem.at((working_n, working_k)).load())
            } else {
                dot(lhs, y_vmem.at((working_k, working_n)).load())
            };
            acc_vmem.store(acc_vmem.load() + product);
            if working_bk_i == grid_k - 1 {
                o_vmem
                    .at(o_receiving_slot)
                    .store(acc_vmem.load().cast::<T>());
                acc_vmem.store(zeros());
            }
        }
    }
    let o_wait = if grid_k == 1 {
        o_step
    } else {
        o_step && global_step_id % grid_k == 0
    };
    if o_wait {
        let _scope = named_scope("_wait_o_local_copy");
        o_left_local.wait();
        o_right_local.wait();
    }
    if outer_step == 0 {
        let _scope = named_scope("_wait_y_local_copy");
        y_local.wait();
    }
    if outer_step == 0 && bn_i == 0 {
        let _scope = named_scope("_wait_first_x_local_copy");
        first_x_local.wait();
    }
    if x_arriving {
        let _scope = named_scope("_wait_subsequent_x_local_copy");
        x_left_local.wait();
        x_right_local.wait();
    }
    if global_step_id == gn_by_gk - 1 {
        let _scope = named_scope("_wait_first_remote_copy");
        ring.first(0).wait();
        ring.first(1).wait();
    }
    if between && global_step_id % gn_by_gk == gn_by_gk - 1 {
        let _scope = named_scope("_wait_subsequent_remote_copy");
        ring.next(0).wait();
        ring.next(1).wait();
    }
}

/// tpu-inference's tuned `(bn, bk)` for `(generation, m, n, k, dtype, tp)` (its
/// `all_gather_matmul_tuned_block_sizes.TUNED_BLOCK_SIZES`, 0.32.0: v6, bf16, tp 8).
pub fn tuned_block_sizes(
    generation: u32,
    (m, n, k): (usize, usize, usize),
    dtype: DType,
    tp: usize,
) -> Option<(usize, usize)> {
    /// `(generation, m, n, k, tp)` → `(bn, bk)`.
    type Entry = ((u32, usize, usize, usize, usize), (usize, usize));
    const TABLE: [Entry; 6] = [
        ((6, 1024, 51200, 5120, 8), (6400, 2560)),
        ((6, 1024, 57344, 8192, 8), (7168, 8192)),
        ((6, 2048, 51200, 5120, 8), (1280, 5120)),
        ((6, 2048, 57344, 8192, 8), (1024, 8192)),
        ((6, 4096, 51200, 5120, 8), (3200, 5120)),
        ((6, 8192, 51200, 5120, 8), (1280, 5120)),
    ];
    if dtype != BF16 {
        return None;
    }
    TABLE
        .iter()
        .find(|(key, _)| *key == (generation, m, n, k, tp))
        .map(|(_, v)| *v)
}

/// The kernel name tpu-inference gives the launch (its `get_kernel_name`).
pub fn kernel_name(bn: usize, bk: usize, rhs_transpose: bool) -> String {
    let t = if rhs_transpose { "True" } else { "False" };
    format!("all_gather_matmul_kernel_bn_{bn}_bk_{bk}_rhs_transpose_{t}")
}

fn arg_error(arg: &str, message: String) -> KernelError {
    KernelError::new(tpu_kernel::ErrorKind::Shape, message).for_argument(arg)
}

/// One device's launch of `all_gather(x, axis=0) @ y` over mesh axis `axis` (`x`: this device's
/// `[m / tp, k]` rows; `y`: its `[k, n / tp]` columns, `[n / tp, k]` with `rhs_transpose`); returns
/// its `[m, n / tp]` columns of the product and the gathered rows' HBM scratch. tpu-inference's
/// checks (`validate_inputs`) with the argument named; `bn`/`bk` default to its tuned table for the
/// target, else `n / tp` and `k`.
#[export]
#[allow(clippy::too_many_arguments)]
pub fn all_gather_matmul_launch(
    x: ArrayType,
    y: ArrayType,
    #[default("x".to_string())] axis: String,
    #[default(0)] collective_id: u32,
    #[default(None)] bn: Option<usize>,
    #[default(None)] bk: Option<usize>,
    #[default(false)] rhs_transpose: bool,
    target: Target,
) -> Result<PallasCall, KernelError> {
    let mesh = Mesh::current().ok_or_else(|| {
        KernelError::new(
            tpu_kernel::ErrorKind::Grid,
            "all_gather_matmul runs on every device of a mesh: call it inside `jax.shard_map` (tpu_kernel.examples.all_gather_matmul applies one)",
        )
    })?;
    let (_, tp, _) = mesh.axis(&axis).map_err(|e| e.for_argument("axis"))?;
    let [m_per_device, k] = x.dims().map_err(|e| e.for_argument("x"))?;
    let [y0, y1] = y.dims().map_err(|e| e.for_argument("y"))?;
    let (k_y, n_per_device) = if rhs_transpose { (y1, y0) } else { (y0, y1) };
    if x.dtype != y.dtype {
        return Err(arg_error(
            "y",
            format!("Input dtypes must match, got {} and {}", x.dtype, y.dtype),
        ));
    }
    if ![BF16, F32].contains(&x.dtype) {
        return Err(arg_error(
            "x",
            format!(
                "all_gather_matmul takes bfloat16 or float32, not {}",
                x.dtype
            ),
        ));
    }
    if k != k_y {
        return Err(arg_error("y", format!("Incompatible shapes for matmul: contracting dimension mismatch: x is [{m_per_device}, {k}] per device, y [{y0}, {y1}]")));
    }
    let (m, n) = (m_per_device * tp, n_per_device * tp);
    if k % 128 != 0 {
        return Err(arg_error("x", format!("k ({k}) must be divisible by 128")));
    }
    if n % 128 != 0 {
        return Err(arg_error("y", format!("n ({n}) must be divisible by 128")));
    }
    if m_per_device % 2 != 0 || (m_per_device / 2) % 8 != 0 {
        return Err(arg_error(
            "x",
            format!("m ({m}) must be divisible by tp_size * 2 * 8 = {}", tp * 16),
        ));
    }
    if tp < 2 {
        return Err(arg_error(
            "axis",
            format!("the ring over {axis:?} needs at least 2 devices, the mesh has {tp}"),
        ));
    }
    let tuned = tuned_block_sizes(target.info().generation, (m, n, k), x.dtype, tp);
    let bn = bn.or(tuned.map(|t| t.0)).unwrap_or(n_per_device);
    let bk = bk.or(tuned.map(|t| t.1)).unwrap_or(k);
    if bn == 0 || n_per_device % bn != 0 {
        return Err(arg_error(
            "bn",
            format!("bn ({bn}) must divide the {n_per_device} columns of y on each device"),
        ));
    }
    if bk == 0 || k % bk != 0 {
        return Err(arg_error("bk", format!("bk ({bk}) must divide k ({k})")));
    }
    let (grid_n, grid_k) = (n_per_device / bn, k / bk);
    let acc_shape = if grid_k == 1 {
        [8, 128]
    } else {
        [m_per_device, bn]
    };
    let y_vmem = if rhs_transpose {
        [n_per_device, k]
    } else {
        [k, n_per_device]
    };
    let bytes = |elems: usize, d: DType| (elems * d.bit_width() as usize / 8) as u64;
    // tpu-inference's estimate (its `get_vmem_estimate_bytes`, `2 * m * bn` output rows included), plus 8 MiB.
    let vmem = bytes(2 * m_per_device * k, x.dtype)
        + bytes(n_per_device * k, y.dtype)
        + bytes(2 * m * bn, x.dtype)
        + bytes(acc_shape[0] * acc_shape[1], F32)
        + 8 * 1024 * 1024;
    let cost = CostEstimate {
        flops: (2 * m * k * n_per_device) as u64,
        transcendentals: 0,
        bytes_accessed: bytes(m * k + k * n_per_device + m * n_per_device, x.dtype),
    };
    let cfg = Config {
        axis,
        bn,
        bk,
        rhs_transpose,
    };
    macro_rules! launch {
        ($t:ty) => {{
            let cfg = cfg.clone();
            pallas_call(
                move |x: Ref<$t, Any>,
                      y: Ref<$t, Any>,
                      o: RefMut<$t, Any>,
                      xs: RefMut<$t, Any>,
                      xl: DmaSem,
                      yl: DmaSem,
                      ol: DmaSem,
                      ss: DmaSem,
                      rs: DmaSem,
                      xv: RefMut<$t>,
                      yv: RefMut<$t>,
                      ov: RefMut<$t>,
                      acc: RefMut<f32>| {
                    all_gather_matmul_kernel::<$t>(
                        x,
                        y,
                        o,
                        xs,
                        xl,
                        yl,
                        ol,
                        ss,
                        rs,
                        xv,
                        yv,
                        ov,
                        acc,
                        cfg.clone(),
                    )
                },
            )
            .name(kernel_name(bn, bk, rhs_transpose))
            .grid([tp + 2, grid_n, grid_k])
            .input_any(x.clone())
            .input_any(y.clone())
            .output_any(ArrayType::new([m, n_per_device], x.dtype))
            .output_any(ArrayType::new([tp - 1, m_per_device, k], x.dtype))
            .any_in_hbm()
            .scratch(DmaSem::one())
            .scratch(DmaSem::one())
            .scratch(DmaSem::one())
            .scratch(DmaSem::array([2, tp - 1]))
            .scratch(DmaSem::array([2, tp - 1]))
            .scratch(Vmem::new([2, m_per_device, k], x.dtype))
            .scratch(Vmem::new(y_vmem, y.dtype))
            .scratch(Vmem::new([2, m_per_device, bn], x.dtype))
            .scratch(Vmem::new(acc_shape, F32))
            .collective_id(collective_id)
            .vmem_limit_bytes(vmem)
            .cost_estimate(cost)
            .target(target)
            .build()
        }};
    }
    match x.dtype {
        BF16 => launch!(bf16),
        _ => launch!(f32),
    }
}

pub fn build() -> Result<PallasCall, KernelError> {
    Mesh::new([("x", 4)])?.scope(|| {
        all_gather_matmul_launch(
            ArrayType::new([128, 512], BF16),
            ArrayType::new([512, 256], BF16),
            "x".into(),
            0,
            None,
            None,
            false,
            Target::current(),
        )
    })
}

#[allow(dead_code)]
fn main() -> std::process::ExitCode {
    tpu_kernel::example::main(build)
}
