//! Kernels that talk across devices (issue 26): `axis_index` / `axis_size` against the launch's mesh,
//! remote copies and signals addressed by device id, the barrier semaphore — what they trace and lower
//! to, and each mistake as an error at its Rust line whose hint, followed, builds.

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::ir::{BinaryOp, Op, OpKind, Region};
use tpu_kernel::ErrorKind;

#[path = "common/marks.rs"]
mod marks;

const HERE: marks::Marked = marks::Marked {
    file: "remote.rs",
    src: include_str!("remote.rs"),
};

fn ops(r: &Region) -> Vec<&Op> {
    let mut out = Vec::new();
    for op in &r.ops {
        out.push(op);
        for inner in &op.regions {
            out.extend(ops(inner));
        }
    }
    out
}

fn block() -> ArrayType {
    ArrayType::new([8, 128], F32)
}

#[tpu_kernel]
fn send_right_kernel(x: Ref<f32, Any>, o: RefMut<f32, Any>, send: DmaSem, recv: DmaSem) {
    let right = DeviceId::along("y", (axis_index("y") + 1) % axis_size("y"));
    let copy = async_remote_copy(x, o, send, recv, right);
    copy.start();
    copy.wait();
}

/// The signature of the test kernels that copy one HBM block to another device.
type HbmPair = (Ref<f32, Any>, RefMut<f32, Any>, DmaSem, DmaSem);

/// `kernel` over an `[8, 128]` f32 input and output in HBM and two DMA semaphores, on `mesh` (else
/// the mesh in scope).
fn hbm_pair(
    kernel: impl tpu_kernel::launch::KernelFn<HbmPair>,
    mesh: Option<Mesh>,
) -> Result<PallasCall, KernelError> {
    let b = pallas_call(kernel)
        .input_any(block())
        .output_any(block())
        .scratch(DmaSem::one())
        .scratch(DmaSem::one());
    match mesh {
        Some(m) => b.mesh(m).build(),
        None => b.build(),
    }
}

fn send_right(mesh: Option<Mesh>) -> Result<PallasCall, KernelError> {
    hbm_pair(send_right_kernel, mesh)
}

#[test]
fn a_remote_copy_along_one_axis_keeps_this_devices_other_coordinates() {
    let call = send_right(Some(Mesh::new([("x", 2), ("y", 3)]).unwrap())).unwrap();
    let body = ops(&call.ir().body.body);
    let kinds: Vec<&OpKind> = body.iter().map(|o| &o.kind).collect();
    // `axis_index("y")` is (device_id / 1) % 3; the id of the device to the right is x * 3 + y', x
    // this device's (device_id / 3) % 2.
    assert!(kinds.contains(&&OpKind::AxisIndex { stride: 1, size: 3 }));
    assert!(kinds.contains(&&OpKind::AxisIndex { stride: 3, size: 2 }));
    assert!(kinds.contains(&&OpKind::Binary(BinaryOp::Mul)));
    assert_eq!(
        kinds
            .iter()
            .filter(|k| matches!(k, OpKind::RemoteDmaStart))
            .count(),
        1
    );
    let waits: Vec<&OpKind> = kinds
        .iter()
        .copied()
        .filter(|k| matches!(k, OpKind::RemoteDmaWait { .. }))
        .collect();
    assert_eq!(
        waits,
        [
            &OpKind::RemoteDmaWait { recv: false },
            &OpKind::RemoteDmaWait { recv: true }
        ]
    );
    assert!(call.ir().communicates());
    let config = call.custom_call().backend_config().unwrap();
    assert!(config.contains("\"has_communication\":true"), "{config}");
    // a kernel that talks to no other device says nothing of communication
    let plain = pallas_call(|x: Ref<f32>, o: RefMut<f32>| o.store(x.load()))
        .input(block(), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(block(), BlockSpec::new([8, 128], |[]| (0, 0)))
        .build()
        .unwrap();
    assert!(!plain.ir().communicates());
    assert!(!plain
        .custom_call()
        .backend_config()
        .unwrap()
        .contains("has_communication"));
}

#[tpu_kernel]
fn no_mesh_kernel(x: Ref<f32, Any>, o: RefMut<f32, Any>, send: DmaSem, recv: DmaSem) {
    let me = axis_index("y"); // E:no_mesh
    async_remote_copy(x, o, send, recv, DeviceId::along("y", me)).start();
}

#[test]
fn without_a_mesh_axis_index_says_how_to_give_one_and_the_hint_builds() {
    let no_mesh = || {
        pallas_call(no_mesh_kernel)
            .input_any(block())
            .output_any(block())
            .scratch(DmaSem::one())
            .scratch(DmaSem::one())
    };
    let e = no_mesh().build().unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Grid,
        "no_mesh",
        &["axis_index(\"y\")", "jax.shard_map", ".mesh(Mesh::new("],
    );
    // the hint: a mesh with that axis
    no_mesh()
        .mesh(Mesh::new([("y", 4)]).unwrap())
        .build()
        .expect("the hint builds");
    // with a mesh in scope (an exported kernel inside shard_map), too
    Mesh::new([("y", 2)])
        .unwrap()
        .scope(|| send_right(None))
        .expect("the scoped mesh is the launch's");
}

#[tpu_kernel]
fn unknown_axis_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let n = axis_size("z"); // E:unknown_axis
    o.store(x.load() * n as f32);
}

#[test]
fn an_axis_not_in_the_mesh_lists_the_mesh() {
    let e = pallas_call(unknown_axis_kernel)
        .input(block(), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(block(), BlockSpec::new([8, 128], |[]| (0, 0)))
        .mesh(Mesh::new([("x", 2), ("y", 2)]).unwrap())
        .build()
        .unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Grid,
        "unknown_axis",
        &["no mesh axis \"z\"", "{x: 2, y: 2}"],
    );
}

#[tpu_kernel]
fn barrier_kernel(x: Ref<f32, Any>, o: RefMut<f32, Any>, local: DmaSem) {
    let barrier = barrier_semaphore(); // E:no_collective
    barrier.signal_on(
        1,
        DeviceId::along("x", (axis_index("x") + 1) % axis_size("x")),
    );
    barrier.wait(1);
    sync_copy(x, o, local);
}

#[test]
fn the_barrier_semaphore_needs_a_collective_id_and_the_hint_builds() {
    let barrier = || {
        pallas_call(barrier_kernel)
            .input_any(block())
            .output_any(block())
            .scratch(DmaSem::one())
            .mesh(Mesh::new([("x", 4)]).unwrap())
    };
    let e = barrier().build().unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Signature,
        "no_collective",
        &["barrier_semaphore()", ".collective_id(0)"],
    );
    let call = barrier().collective_id(0).build().expect("the hint builds");
    let config = call.custom_call().backend_config().unwrap();
    assert!(
        config.contains("\"has_communication\":true,\"collective_id\":0"),
        "{config}"
    );
}

#[tpu_kernel]
fn coordinates_kernel(x: Ref<f32, Any>, o: RefMut<f32, Any>, send: DmaSem, recv: DmaSem) {
    let me = axis_index("x");
    let copy = async_remote_copy(x, o, send, recv, [me]);
    copy.start(); // E:coordinates
    copy.wait();
}

#[test]
fn mesh_coordinates_are_one_per_axis() {
    let e = hbm_pair(
        coordinates_kernel,
        Some(Mesh::new([("x", 2), ("y", 2)]).unwrap()),
    )
    .unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Shape,
        "coordinates",
        &["1 mesh coordinates", "{x: 2, y: 2} has 2 axes"],
    );
}

#[tpu_kernel]
fn smem_kernel(
    x: Ref<f32, Any>,
    o: RefMut<f32, Any>,
    s: RefMut<i32, Smem>,
    send: DmaSem,
    recv: DmaSem,
) {
    let copy = async_remote_copy(s, s, send, recv, DeviceId::logical(1));
    copy.start(); // E:smem
    sync_copy(x, o, send);
}

#[test]
fn smem_is_not_sent() {
    let e = pallas_call(smem_kernel)
        .input_any(block())
        .output_any(block())
        .scratch(Smem::new([8], I32))
        .scratch(DmaSem::one())
        .scratch(DmaSem::one())
        .mesh(Mesh::new([("x", 2)]).unwrap())
        .build()
        .unwrap_err();
    HERE.check(&e, ErrorKind::Unsupported, "smem", &["SMEM"]);
}

#[test]
fn interpret_mode_refuses_a_communicating_kernel_at_its_line() {
    let call = send_right(Some(Mesh::new([("y", 2)]).unwrap())).unwrap();
    let x = HostArray::from_vec([8, 128], vec![1.0f32; 8 * 128]).unwrap();
    let e = call.interpret(&[x]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
    assert!(e.message.contains("talks to other devices"), "{e}");
    assert!(e.location.is_some(), "{e}");
}

#[test]
fn a_mesh_is_named_axes_of_positive_sizes() {
    for (axes, needle) in [
        (vec![], "at least one axis"),
        (vec![("x", 2), ("x", 2)], "named twice"),
        (vec![("x", 0)], "size 0"),
        (vec![(" ", 2)], "empty name"),
    ] {
        let e = Mesh::new(axes).unwrap_err();
        assert!(e.message.contains(needle), "{e}");
    }
}

// ---------------------------------------------------------------------------------------------- SPMD runs

fn mesh4() -> Mesh {
    Mesh::new([("x", 4)]).unwrap()
}

fn device_inputs(n: usize, rows: usize) -> Vec<Vec<HostArray>> {
    (0..n)
        .map(|d| {
            let v: Vec<f32> = (0..rows * 128)
                .map(|i| (d * 10_000 + i) as f32 * 0.5 - 3.0)
                .collect();
            vec![HostArray::from_vec([rows, 128], v).unwrap()]
        })
        .collect()
}

#[path = "../examples/ring_all_gather.rs"]
mod ring;

#[test]
fn the_ring_all_gather_gathers_every_shard_on_every_device_bit_for_bit() {
    for axes in [vec![("x", 4)], vec![("x", 2), ("y", 3)]] {
        let mesh = Mesh::new(axes.clone()).unwrap();
        let n = mesh.devices();
        let call = mesh
            .clone()
            .scope(|| ring::ring_all_gather(ArrayType::new([8, 128], F32), "x".into()))
            .unwrap();
        let inputs = device_inputs(n, 8);
        let outs = call
            .interpret_spmd(call.ir().mesh.as_ref().unwrap(), &inputs)
            .unwrap();
        let (_, size, stride) = mesh.axis("x").unwrap();
        for (d, out) in outs.iter().enumerate() {
            // the shards of the devices along x that share this device's other coordinates
            let base = d % stride + (d / (stride * size)) * stride * size;
            let want: Vec<u32> = (0..size)
                .flat_map(|k| {
                    inputs[base + k * stride][0]
                        .as_slice::<f32>()
                        .unwrap()
                        .to_vec()
                })
                .map(f32::to_bits)
                .collect();
            let got: Vec<u32> = out[0]
                .as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert!(got == want, "{axes:?}: device {d} gathered other values");
        }
    }
}

#[test]
fn interpret_spmd_takes_one_list_of_inputs_per_device() {
    let call = mesh4()
        .scope(|| ring::ring_all_gather(ArrayType::new([8, 128], F32), "x".into()))
        .unwrap();
    let e = call
        .interpret_spmd(&mesh4(), &device_inputs(3, 8))
        .unwrap_err();
    assert!(
        e.message.contains("4 devices but inputs were given for 3"),
        "{e}"
    );
    let plain = send_right(None);
    assert!(plain.is_err());
}

#[tpu_kernel]
fn never_receives_kernel(x: Ref<f32, Any>, o: RefMut<f32, Any>, send: DmaSem, recv: DmaSem) {
    let right = DeviceId::along("x", (axis_index("x") + 1) % axis_size("x"));
    let copy = async_remote_copy(x, o, send, recv, right);
    copy.start(); // E:never_received_start
    copy.wait_send();
}

#[test]
fn a_receive_never_waited_for_is_a_race_naming_the_devices() {
    let call = hbm_pair(never_receives_kernel, Some(mesh4())).unwrap();
    let e = call
        .interpret_spmd(&mesh4(), &device_inputs(4, 8))
        .unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Race,
        "never_received_start",
        &["device", "still in flight when the kernel ends"],
    );
}

#[tpu_kernel]
fn overwrite_kernel(x: Ref<f32>, o: RefMut<f32>, buf: RefMut<f32>, send: DmaSem, recv: DmaSem) {
    let right = DeviceId::along("x", (axis_index("x") + 1) % axis_size("x"));
    buf.store(x.load());
    let copy = async_remote_copy(buf, o, send, recv, right);
    copy.start();
    buf.store(x.load() * 2.0); // E:overwrite
    copy.wait();
}

fn vmem_call(
    kernel: impl tpu_kernel::launch::KernelFn<(Ref<f32>, RefMut<f32>, RefMut<f32>, DmaSem, DmaSem)>,
) -> PallasCall {
    pallas_call(kernel)
        .input(block(), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(block(), BlockSpec::new([8, 128], |[]| (0, 0)))
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one())
        .scratch(DmaSem::one())
        .mesh(mesh4())
        .build()
        .unwrap()
}

#[test]
fn a_send_buffer_written_in_flight_is_a_race() {
    let e = vmem_call(overwrite_kernel)
        .interpret_spmd(&mesh4(), &device_inputs(4, 8))
        .unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Race,
        "overwrite",
        &[
            "on device 0",
            "writes scratch 0",
            "to device 1",
            "in flight",
        ],
    );
}

#[tpu_kernel]
fn early_read_kernel(x: Ref<f32>, o: RefMut<f32>, buf: RefMut<f32>, send: DmaSem, recv: DmaSem) {
    let right = DeviceId::along("x", (axis_index("x") + 1) % axis_size("x"));
    buf.store(x.load());
    let copy = async_remote_copy(buf, o, send, recv, right);
    copy.start();
    copy.wait_send();
    let early = o.load(); // E:early_read
    copy.wait_recv();
    o.store(early);
}

#[test]
fn reading_a_destination_before_its_receive_is_a_race_naming_the_sender() {
    let e = vmem_call(early_read_kernel)
        .interpret_spmd(&mesh4(), &device_inputs(4, 8))
        .unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Race,
        "early_read",
        &["reads output 0", "DMA from device 0", "in flight"],
    );
}

#[tpu_kernel]
fn leaves_barrier_kernel(x: Ref<f32, Any>, o: RefMut<f32, Any>, local: DmaSem) {
    let barrier = barrier_semaphore();
    barrier.signal_on(
        2,
        DeviceId::along("x", (axis_index("x") + 1) % axis_size("x")),
    );
    barrier.wait(1);
    sync_copy(x, o, local);
}

#[test]
fn a_barrier_left_signalled_for_the_next_call_is_an_error() {
    let call = pallas_call(leaves_barrier_kernel)
        .input_any(block())
        .output_any(block())
        .scratch(DmaSem::one())
        .mesh(mesh4())
        .collective_id(0)
        .build()
        .unwrap();
    let e = call
        .interpret_spmd(&mesh4(), &device_inputs(4, 8))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Race, "{e}");
    assert!(
        e.message
            .contains("the barrier semaphore holds 1 when the kernel ends"),
        "{e}"
    );
}

#[tpu_kernel]
fn outside_kernel(x: Ref<f32, Any>, o: RefMut<f32, Any>, send: DmaSem, recv: DmaSem) {
    let copy = async_remote_copy(x, o, send, recv, DeviceId::logical(axis_index("x") + 4));
    copy.start(); // E:outside
    copy.wait();
}

#[test]
fn a_device_id_outside_the_mesh_is_an_error_at_its_line() {
    let call = hbm_pair(outside_kernel, Some(mesh4())).unwrap();
    let e = call
        .interpret_spmd(&mesh4(), &device_inputs(4, 8))
        .unwrap_err();
    HERE.check(
        &e,
        ErrorKind::OutOfBounds,
        "outside",
        &["device id 4 is outside the mesh {x: 4}", "on device 0"],
    );
}

#[tpu_kernel]
fn waits_forever_kernel(x: Ref<f32, Any>, o: RefMut<f32, Any>, send: DmaSem, recv: DmaSem) {
    let left = DeviceId::along("x", (axis_index("x") + 3) % axis_size("x"));
    let copy = async_remote_copy(x, o, send, recv, left);
    copy.wait_recv(); // E:deadlock
    copy.start();
    copy.wait_send();
}

#[test]
fn every_device_waiting_is_a_deadlock_naming_each_wait() {
    let call = hbm_pair(waits_forever_kernel, Some(mesh4())).unwrap();
    let e = call
        .interpret_spmd(&mesh4(), &device_inputs(4, 8))
        .unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Deadlock,
        "deadlock",
        &[
            "every device of the mesh {x: 4} waits",
            "device 0 waits",
            "device 3 waits",
        ],
    );
}

#[tpu_kernel]
fn one_receive_semaphore_kernel(
    x: Ref<f32, Any>,
    o: RefMut<f32, Any>,
    local: DmaSem,
    send: DmaSem,
    recv: DmaSem,
) {
    let n = axis_size("x");
    let me = axis_index("x");
    let right = DeviceId::along("x", (me + 1) % n);
    let m = x.shape()[0];
    sync_copy(x, o.at(ds(me * m, m)), local);
    for step in 0..n - 1 {
        let slot = (me - step + n) % n * m;
        let copy = async_remote_copy(o.at(ds(slot, m)), o.at(ds(slot, m)), send, recv, right);
        copy.start(); // E:one_receive_semaphore
        copy.wait();
    }
}

#[test]
fn a_ring_on_one_receive_semaphore_races_when_a_device_runs_two_steps_ahead() {
    // A device that receives two slots from its left before it first waits cannot tell which one its
    // first wait retired (a semaphore counts bytes): forwarding either is a race.
    let call = pallas_call(one_receive_semaphore_kernel)
        .input_any(ArrayType::new([8, 128], F32))
        .output_any(ArrayType::new([32, 128], F32))
        .scratch(DmaSem::one())
        .scratch(DmaSem::one())
        .scratch(DmaSem::one())
        .mesh(mesh4())
        .build()
        .unwrap();
    let e = call
        .interpret_spmd(&mesh4(), &device_inputs(4, 8))
        .unwrap_err();
    HERE.check(
        &e,
        ErrorKind::Race,
        "one_receive_semaphore",
        &["reads output 0[", "while the DMA from device", "in flight"],
    );
}

#[path = "../examples/ring_reduce_scatter.rs"]
mod reduce_scatter;

#[test]
fn the_ring_reduce_scatter_sums_each_block_on_its_device_in_ring_order() {
    for n in [1, 2, 4] {
        let mesh = Mesh::new([("x", n)]).unwrap();
        let call = mesh
            .clone()
            .scope(|| {
                reduce_scatter::ring_reduce_scatter(ArrayType::new([8 * n, 128], F32), "x".into())
            })
            .unwrap();
        let inputs = device_inputs(n, 8 * n);
        let outs = call
            .interpret_spmd(call.ir().mesh.as_ref().unwrap(), &inputs)
            .unwrap();
        let (want, tol) = tpu_kernel::reference::expected_spmd(call.name(), &inputs)
            .unwrap()
            .unwrap();
        assert_eq!(tol, tpu_kernel::reference::Tolerance::EXACT);
        assert!(outs == want, "{n} devices");
    }
}

#[path = "../examples/all_gather_matmul.rs"]
mod agmm;

#[test]
fn the_all_gather_matmul_is_all_gather_x_at_y_for_every_block_choice() {
    // (tp, m per device, k, n per device, bn, bk, rhs_transpose): one block, several n blocks,
    // several k blocks (the f32 accumulator), both, the transposed rhs, two devices, eight.
    let cases = [
        (4, 32, 256, 256, None, None, false),
        (4, 32, 256, 256, Some(128), None, false),
        (4, 32, 256, 256, None, Some(128), false),
        (4, 32, 256, 256, Some(128), Some(128), true),
        (2, 16, 128, 128, None, None, false),
        (8, 16, 128, 128, None, Some(128), false),
    ];
    for (tp, mp, k, np, bn, bk, t) in cases {
        let mesh = Mesh::new([("x", tp)]).unwrap();
        let y_shape = if t { [np, k] } else { [k, np] };
        let call = mesh
            .clone()
            .scope(|| {
                agmm::all_gather_matmul_launch(
                    ArrayType::new([mp, k], BF16),
                    ArrayType::new(y_shape, BF16),
                    "x".into(),
                    0,
                    bn,
                    bk,
                    t,
                    Target::V6e,
                )
            })
            .unwrap();
        let inputs: Vec<Vec<HostArray>> = (0..tp)
            .map(|d| tpu_kernel::reference::random_inputs(&call, d as u64))
            .collect();
        let outs = call
            .interpret_spmd(call.ir().mesh.as_ref().unwrap(), &inputs)
            .unwrap();
        // The reference multiplies by y as [k, n]: transpose a transposed rhs first.
        let plain: Vec<Vec<HostArray>> = inputs
            .iter()
            .map(|d| {
                let y = if t {
                    let v = d[1].as_slice::<bf16>().unwrap();
                    let tr: Vec<bf16> = (0..k * np).map(|i| v[(i % np) * k + i / np]).collect();
                    HostArray::from_vec([k, np], tr).unwrap()
                } else {
                    d[1].clone()
                };
                vec![d[0].clone(), y]
            })
            .collect();
        let (want, tol) = tpu_kernel::reference::expected_spmd(call.name(), &plain)
            .unwrap()
            .unwrap();
        for (d, (g, w)) in outs.iter().zip(&want).enumerate() {
            let c = tpu_kernel::reference::compare(&g[0], &w[0], tol);
            assert!(
                c.ok,
                "{tp} devices, bn {bn:?} bk {bk:?} rhs_transpose {t}: device {d} max error {}",
                c.max_abs_error
            );
        }
    }
}

#[test]
fn the_all_gather_matmul_refuses_what_tpu_inference_refuses_naming_the_argument() {
    let mesh = Mesh::new([("x", 4)]).unwrap();
    let launch = |x: [usize; 2], y: [usize; 2], bn: Option<usize>| {
        mesh.clone().scope(|| {
            agmm::all_gather_matmul_launch(
                ArrayType::new(x, BF16),
                ArrayType::new(y, BF16),
                "x".into(),
                0,
                bn,
                None,
                false,
                Target::V6e,
            )
        })
    };
    for (x, y, bn, arg, needle) in [
        (
            [32, 200],
            [200, 256],
            None,
            "x",
            "k (200) must be divisible by 128",
        ),
        (
            [32, 256],
            [128, 256],
            None,
            "y",
            "contracting dimension mismatch",
        ),
        (
            [12, 256],
            [256, 256],
            None,
            "x",
            "must be divisible by tp_size * 2 * 8 = 64",
        ),
        (
            [32, 256],
            [256, 256],
            Some(1024),
            "bn",
            "bn (1024) must divide the 256 columns",
        ),
    ] {
        let e = launch(x, y, bn).unwrap_err();
        assert_eq!(e.argument.as_deref(), Some(arg), "{e}");
        assert!(e.message.contains(needle), "{e}");
    }
    // tpu-inference's tuned table: v6, bf16, tp 8, its (m, n, k) keys.
    assert_eq!(
        agmm::tuned_block_sizes(6, (2048, 51200, 5120), BF16, 8),
        Some((1280, 5120))
    );
    assert_eq!(
        agmm::tuned_block_sizes(5, (2048, 51200, 5120), BF16, 8),
        None
    );
}

#[test]
fn interpret_spmd_runs_on_the_mesh_the_kernel_was_built_for_and_a_plain_kernel_on_any() {
    let ring = mesh4()
        .scope(|| ring::ring_all_gather(ArrayType::new([8, 128], F32), "x".into()))
        .unwrap();
    let other = Mesh::new([("x", 2), ("y", 2)]).unwrap();
    let e = ring
        .interpret_spmd(&other, &device_inputs(4, 8))
        .unwrap_err();
    assert!(
        e.message
            .contains("built for the mesh {x: 4} and is run on the mesh {x: 2, y: 2}"),
        "{e}"
    );
    // A kernel that talks to no other device runs on each device alone.
    let double = pallas_call(|x: Ref<f32>, o: RefMut<f32>| o.store(x.load() * 2.0))
        .input(block(), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(block(), BlockSpec::new([8, 128], |[]| (0, 0)))
        .build()
        .unwrap();
    let inputs = device_inputs(4, 8);
    let outs = double.interpret_spmd(&other, &inputs).unwrap();
    for (d, out) in outs.iter().enumerate() {
        assert_eq!(out, &double.interpret(&inputs[d]).unwrap(), "device {d}");
    }
}

#[test]
fn mosaic_on_cpu_runs_one_device_and_refuses_a_kernel_that_talks_across_devices() {
    let call = send_right(Some(Mesh::new([("y", 4)]).unwrap())).unwrap();
    let Err(e) = tpu_kernel::runtime::mosaic_cpu::compile(call.ir()) else {
        panic!("Mosaic-on-CPU compiled a kernel that talks across devices");
    };
    assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
    assert!(
        e.message.contains("Mosaic-on-CPU runs one device") && e.message.contains("interpret_spmd"),
        "{e}"
    );
}
