//! DMA and semaphores: what they lower to (Pallas's ops), what interpret mode computes under every
//! completion timing, and each race or deadlock the hardware would hit as an error at its Rust line.

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::background_landings;
use tpu_kernel::{ErrorKind, KernelError};

#[path = "common/kernels.rs"]
mod kernels;
use kernels::{pipelined_call, scoped_call, semaphore_call, staged_copy, sync_call};

#[path = "common/marks.rs"]
mod marks;

#[path = "common/engines.rs"]
mod engines;
use engines::f32_bits;

const HERE: marks::Marked = marks::Marked {
    file: "dma.rs",
    src: include_str!("dma.rs"),
};

#[track_caller]
fn expect_err(e: KernelError, kind: ErrorKind, tag: &str, needles: &[&str]) {
    HERE.check(&e, kind, tag, needles);
}

fn f32s<const R: usize>(shape: [usize; R]) -> ArrayType {
    ArrayType::new(shape, F32)
}

fn ramp(shape: [usize; 2]) -> HostArray {
    let n = shape[0] * shape[1];
    HostArray::from_vec(
        shape,
        (0..n).map(|i| i as f32 * 0.25 - 7.0).collect::<Vec<_>>(),
    )
    .unwrap()
}

fn seeded(seed: Option<u64>) -> InterpretOptions {
    InterpretOptions {
        dma_seed: seed,
        ..InterpretOptions::default()
    }
}

// ---------------------------------------------------------------------------------------------- semantics

#[test]
fn a_double_buffered_pipeline_gives_the_same_bits_under_every_completion_timing() {
    let call = pipelined_call().expect("build");
    let x = ramp([32, 128]);
    let want: Vec<u32> = x
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|v| (v * 3.0).to_bits())
        .collect();
    for seed in [
        None,
        Some(0),
        Some(1),
        Some(2),
        Some(7),
        Some(42),
        Some(1234),
    ] {
        let out = call
            .interpret_with(std::slice::from_ref(&x), &seeded(seed))
            .expect("interpret");
        assert_eq!(f32_bits(&out[0]), want, "seed {seed:?}");
    }
    // The ops Pallas emits for `make_async_copy(..).start()` / `.wait()` on slots of a buffer.
    let text = call.mosaic_mlir().expect("lower");
    for op in [
        "tpu.enqueue_dma",
        "tpu.wait_dma",
        "tpu.memref_slice",
        "tpu.memref_squeeze",
    ] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
    assert!(
        text.contains("memref<2x!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>"),
        "{text}"
    );
}

#[test]
fn semaphores_count_signals_and_waits() {
    let call = semaphore_call().expect("build");
    let out = call.interpret(&[ramp([8, 128])]).expect("interpret");
    let x = ramp([8, 128]);
    for (g, v) in out[0]
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .zip(x.as_slice::<f32>().unwrap())
    {
        assert_eq!(*g, v + 31.0);
    }
    let text = call.mosaic_mlir().expect("lower");
    for op in [
        "tpu.sem_signal",
        "tpu.sem_wait",
        "tpu.sem_read",
        "!tpu.semaphore",
    ] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
}

#[test]
fn sync_copy_copies_and_waits() {
    let call = sync_call().expect("build");
    let x = ramp([8, 128]);
    let out = call.interpret(std::slice::from_ref(&x)).expect("interpret");
    for (g, v) in out[0]
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .zip(x.as_slice::<f32>().unwrap())
    {
        assert_eq!(*g, v - 1.0);
    }
}

/// A copy between two windows of one buffer, then writes to both windows: the destination holds
/// the source's contents from before the copy, and later writes to either window do not reach the
/// other (the interpreter copies a DMA's source once, from a view of the shared buffer).
#[tpu_kernel]
fn within_one_ref_kernel(x: Ref<f32>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    buf.at((0..8, ..)).store(x.load());
    buf.at((8..16, ..)).store(zeros());
    sync_copy(buf.at((0..8, ..)), buf.at((8..16, ..)), sem);
    buf.at((0..8, ..)).store(x.load() * 2.0);
    o.at((0..8, ..)).store(buf.at((8..16, ..)).load());
    buf.at((8..16, ..)).store(x.load() + 1.0);
    o.at((8..16, ..))
        .store(buf.at((0..8, ..)).load() + buf.at((8..16, ..)).load());
}

#[test]
fn a_copy_within_one_buffer_copies_what_the_source_held() {
    let call = pallas_call(within_one_ref_kernel)
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(f32s([16, 128]), BlockSpec::new([16, 128], |[]| (0, 0)))
        .scratch(Vmem::new([16, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("build");
    let x = ramp([8, 128]);
    let xs = x.as_slice::<f32>().unwrap();
    for seed in [None, Some(1), Some(2)] {
        let out = call
            .interpret_with(std::slice::from_ref(&x), &seeded(seed))
            .expect("interpret");
        let got = out[0].as_slice::<f32>().unwrap();
        let (copied, sums) = got.split_at(8 * 128);
        assert_eq!(copied, xs, "rows 8..16 after the copy, seed {seed:?}");
        for (s, v) in sums.iter().zip(xs) {
            assert_eq!(*s, v * 2.0 + (v + 1.0), "seed {seed:?}");
        }
    }
}

/// The gathers' source: 16 slabs of 8 × 128 distinct values.
fn slabs() -> HostArray {
    HostArray::from_vec(
        [16, 8, 128],
        (0..16 * 8 * 128)
            .map(|i| i as f32 * 0.5 - 100.0)
            .collect::<Vec<_>>(),
    )
    .unwrap()
}

/// The bits of `x`'s slabs in `order`, one after another (what a gather of them holds).
fn slab_bits(x: &HostArray, order: impl IntoIterator<Item = usize>) -> Vec<u32> {
    let (xs, slab) = (x.as_slice::<f32>().unwrap(), 8 * 128);
    order
        .into_iter()
        .flat_map(|from| &xs[from * slab..][..slab])
        .map(|v| v.to_bits())
        .collect()
}

/// The bits a gather kernel's `call` leaves in its output from `x`, run `parallel` or not, with
/// copies landing at seeded points or at their waits.
fn gathered(call: &PallasCall, x: &HostArray, parallel: bool, seed: Option<u64>) -> Vec<u32> {
    let opts = InterpretOptions {
        parallel,
        ..seeded(seed)
    };
    let out = call
        .interpret_with(std::slice::from_ref(x), &opts)
        .expect("interpret");
    f32_bits(&out[0])
}

/// A gather: 16 copies, each one 8-row slab of `x` into its own slot of `buf` (slab `5 i mod 16`
/// into slot `i`, the slot's index squeezed), all counted on one semaphore and retired by one wait
/// for the whole buffer (64 KiB): a paged kernel's wait for a KV block's pages.
#[tpu_kernel]
fn gather_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    for i in unroll(0..16) {
        async_copy(x_hbm.at(((i * 5) % 16, .., ..)), buf.at((i, .., ..)), sem).start();
    }
    async_copy(buf, buf, sem).wait();
    o.store(buf.load());
}

/// The copies one wait completes land across threads when the interpreter runs loops across them
/// (disjoint windows of one buffer, 64 KiB in all): the bits of landing them one by one, in order,
/// and under every completion timing.
#[test]
fn one_waits_copies_land_as_they_would_in_order() {
    let call = pallas_call(gather_kernel)
        .input_any(f32s([16, 8, 128]))
        .output(
            f32s([16, 8, 128]),
            BlockSpec::new([16, 8, 128], |[]| (0, 0, 0)),
        )
        .scratch(Vmem::new([16, 8, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("build");
    let x = slabs();
    let want = slab_bits(&x, (0..16).map(|i| i * 5 % 16));
    for parallel in [true, false] {
        for seed in [None, Some(3)] {
            let got = gathered(&call, &x, parallel, seed);
            assert_eq!(got, want, "parallel {parallel}, seed {seed:?}");
        }
    }
}

/// Three rounds of a gather into a buffer the kernel wrote first, each round's slab order its own,
/// with index arithmetic between the starts: from the second round on the buffer is the machine's
/// own, so each copy lands in the background from its start (`machine/landing.rs`).
#[tpu_kernel]
fn regather_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    buf.store(zeros());
    for round in 0..3 {
        for i in 0..16 {
            let from = (i * 5 + round * 3) % 16;
            async_copy(x_hbm.at((from, .., ..)), buf.at((i, .., ..)), sem).start();
        }
        async_copy(buf, buf, sem).wait();
        o.at(round).store(buf.load());
    }
}

/// Copies landing in the background give the bits of landing them at their waits, in order, and
/// of every seeded timing — and they do land in the background where the interpreter runs loops
/// across threads (32 copies: the second and third rounds).
#[test]
fn copies_landing_in_the_background_give_the_bits_of_their_waits() {
    let call = pallas_call(regather_kernel)
        .input_any(f32s([16, 8, 128]))
        .output(
            f32s([3, 16, 8, 128]),
            BlockSpec::new([3, 16, 8, 128], |[]| (0, 0, 0, 0)),
        )
        .scratch(Vmem::new([16, 8, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("build");
    let x = slabs();
    let order = (0..3).flat_map(|round| (0..16).map(move |i| (i * 5 + round * 3) % 16));
    let want = slab_bits(&x, order);
    for parallel in [true, false] {
        for seed in [None, Some(3), Some(11)] {
            let before = background_landings();
            let got = gathered(&call, &x, parallel, seed);
            assert_eq!(got, want, "parallel {parallel}, seed {seed:?}");
            if parallel && seed.is_none() {
                assert_eq!(
                    background_landings() - before,
                    32,
                    "copies landed in the background"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------- races

#[tpu_kernel]
fn early_read_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    let c = async_copy(x_hbm, buf, sem);
    c.start();
    o.store(buf.load()); // E:early_read
    c.wait();
}

fn one_step(
    kernel: fn(Ref<f32, Any>, RefMut<f32>, RefMut<f32>, DmaSem),
) -> Result<PallasCall, KernelError> {
    pallas_call(kernel)
        .input_any(f32s([8, 128]))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one())
        .build()
}

#[test]
fn reading_a_dma_destination_before_its_wait_is_a_race_under_every_timing() {
    // Whether the copy's data has landed by the read (seeded runs move it at random points) does not
    // matter: nothing the program did shows it complete, so the read is a race on every run.
    let call = one_step(early_read_kernel).expect("build");
    for seed in std::iter::once(None).chain((0..16).map(Some)) {
        let e = call.interpret_with(&[ramp([8, 128])], &seeded(seed));
        expect_err(
            e.unwrap_err(),
            ErrorKind::Race,
            "early_read",
            &["reads scratch 0", "in flight", "have taken every byte"],
        );
    }
}

/// The early read again, of a buffer the kernel has written (in part, by a first copy): the
/// buffer is the machine's own, the second copy lands in the background from its start, and the
/// read is still the race.
#[tpu_kernel]
fn early_read_landing_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    buf.store(zeros());
    let half = async_copy(x_hbm.at((0..4, ..)), buf.at((0..4, ..)), sem);
    half.start();
    half.wait();
    let c = async_copy(x_hbm, buf, sem);
    c.start();
    o.store(buf.load()); // E:early_read_landing
    c.wait();
}

#[test]
fn reading_a_destination_landing_in_the_background_is_the_same_race() {
    let call = one_step(early_read_landing_kernel).expect("build");
    for seed in std::iter::once(None).chain((0..8).map(Some)) {
        let before = background_landings();
        let e = call.interpret_with(&[ramp([8, 128])], &seeded(seed));
        if seed.is_none() {
            assert_eq!(
                background_landings() - before,
                1,
                "the second copy landed in the background"
            );
        }
        expect_err(
            e.unwrap_err(),
            ErrorKind::Race,
            "early_read_landing",
            &["reads scratch 0", "in flight", "have taken every byte"],
        );
    }
}

#[tpu_kernel]
fn src_write_kernel(x: Ref<f32>, o: RefMut<f32>, a: RefMut<f32>, b: RefMut<f32>, sem: DmaSem) {
    a.store(x.load());
    let c = async_copy(a, b, sem);
    c.start();
    a.store(0.0); // E:src_write
    c.wait();
    o.store(b.load());
}

#[test]
fn writing_a_dma_source_in_flight_is_a_race() {
    let call = pallas_call(src_write_kernel)
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .scratch(Vmem::new([8, 128], F32))
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("build");
    let e = call.interpret(&[ramp([8, 128])]).unwrap_err();
    expect_err(
        e,
        ErrorKind::Race,
        "src_write",
        &["writes scratch 0", "DMA from scratch 0"],
    );
}

#[tpu_kernel]
fn unstarted_wait_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    async_copy(x_hbm, buf, sem).wait(); // E:unstarted_wait
    o.store(buf.load());
}

#[test]
fn waiting_for_a_copy_never_started_is_a_deadlock() {
    let call = one_step(unstarted_wait_kernel).expect("build");
    let e = call.interpret(&[ramp([8, 128])]).unwrap_err();
    expect_err(
        e,
        ErrorKind::Deadlock,
        "unstarted_wait",
        &["scratch 1", "never return"],
    );
}

#[tpu_kernel]
fn unsignalled_kernel(x: Ref<f32>, o: RefMut<f32>, s: Sem) {
    s.signal(1);
    s.wait(2); // E:unsignalled
    o.store(x.load());
}

#[test]
fn waiting_for_more_than_was_signalled_is_a_deadlock() {
    let call = pallas_call(unsignalled_kernel)
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .scratch(Sem::one())
        .build()
        .expect("build");
    let e = call.interpret(&[ramp([8, 128])]).unwrap_err();
    expect_err(
        e,
        ErrorKind::Deadlock,
        "unsignalled",
        &["waits for 2", "holds 1"],
    );
}

#[tpu_kernel]
fn never_waited_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    async_copy(x_hbm, buf, sem).start(); // E:never_waited
    o.store(0.0);
}

#[test]
fn a_copy_in_flight_at_kernel_end_is_an_error_at_its_start() {
    let call = one_step(never_waited_kernel).expect("build");
    let e = call.interpret(&[ramp([8, 128])]).unwrap_err();
    expect_err(
        e,
        ErrorKind::Race,
        "never_waited",
        &["still in flight when the kernel ends"],
    );
}

#[test]
fn a_semaphore_left_signalled_at_kernel_end_is_an_error() {
    let call = semaphore_call().expect("build");
    // Balanced: fine (see above). One extra signal per run is not:
    let unbalanced = pallas_call(|x: Ref<f32>, o: RefMut<f32>, s: Sem| {
        s.signal(2);
        s.wait(1);
        o.store(x.load());
    })
    .name("unbalanced")
    .input(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
    .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
    .scratch(Sem::one())
    .build()
    .expect("build");
    assert!(call.interpret(&[ramp([8, 128])]).is_ok());
    let e = unbalanced.interpret(&[ramp([8, 128])]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Race, "{e}");
    assert!(
        e.message.contains("scratch 0 holds 1 when the kernel ends"),
        "{e}"
    );
}

#[tpu_kernel]
fn into_block_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    buf.store(0.0);
    async_copy(x_hbm.at(ds(program_id(0) * 8, 8)), o, sem).start(); // E:into_block
    async_copy(x_hbm.at(ds(program_id(0) * 8, 8)), o, sem).wait();
    async_copy(x_hbm.at(ds(program_id(0) * 8, 8)), o, sem).start();
}

#[test]
fn a_copy_into_a_pipelined_block_must_finish_within_its_step() {
    let call = pallas_call(into_block_kernel)
        .grid([2])
        .input_any(f32s([16, 128]))
        .output(f32s([16, 128]), BlockSpec::new([8, 128], |[i]| (i, 0)))
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("build");
    let e = call.interpret(&[ramp([16, 128])]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Race, "{e}");
    assert!(e.message.contains("end of the grid step"), "{e}");
}

// ---------------------------------------------------------------------------------------------- mistakes

#[tpu_kernel]
fn shape_mismatch_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem) {
    async_copy(x_hbm.at(ds(0, 4)), buf, sem).start(); // E:copy_shape
    o.store(0.0);
}

#[test]
fn a_copy_between_windows_of_different_shapes_is_an_error() {
    let e = one_step(shape_mismatch_kernel).unwrap_err();
    expect_err(e, ErrorKind::Shape, "copy_shape", &["[4, 128]", "[8, 128]"]);
}

#[tpu_kernel]
fn whole_array_sem_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sems: DmaSem) {
    async_copy(x_hbm, buf, sems).start(); // E:sem_array
    o.store(0.0);
}

#[test]
fn an_array_of_semaphores_must_be_indexed() {
    let e = pallas_call(whole_array_sem_kernel)
        .input_any(f32s([8, 128]))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .scratch(Vmem::new([8, 128], F32))
        .scratch(DmaSem::array([2]))
        .build()
        .unwrap_err();
    expect_err(
        e,
        ErrorKind::Shape,
        "sem_array",
        &["pick one with `.at(i)`"],
    );
}

// ---------------------------------------------------------------------------------------------- scopes

#[test]
fn run_scoped_allocates_for_its_body_only() {
    let call = scoped_call().expect("build");
    let x = ramp([16, 128]);
    for seed in [None, Some(5)] {
        let out = call
            .interpret_with(std::slice::from_ref(&x), &seeded(seed))
            .expect("interpret");
        for (g, v) in out[0]
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .zip(x.as_slice::<f32>().unwrap())
        {
            assert_eq!(g.to_bits(), (v + 1.0).to_bits());
        }
    }
    // Pallas's form: a tpu.region holding the allocations, ended by tpu.yield.
    let text = call.mosaic_mlir().expect("lower");
    for op in ["tpu.region", "memref.alloca", "tpu.sem_alloc", "tpu.yield"] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
}

#[tpu_kernel]
fn wrong_scope_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let scratch = (Vmem::new([8, 128], BF16), DmaSem::one());
    run_scoped(staged_copy, (x, o), scratch); // E:scope_types
}

#[test]
fn a_scope_whose_body_takes_other_types_is_an_error() {
    let e = pallas_call(wrong_scope_kernel)
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .build()
        .unwrap_err();
    expect_err(
        e,
        ErrorKind::Signature,
        "scope_types",
        &[
            "parameter 2 of the scope's body is `RefMut<f32>`",
            "declare it `RefMut<bf16>`",
        ],
    );
}

#[kernel_fn]
fn leaky_body(x: Ref<f32>, buf: RefMut<f32>, sem: DmaSem) {
    async_copy(x, buf, sem).start(); // E:leaky
}

#[tpu_kernel]
fn leaky_scope_kernel(x: Ref<f32>, o: RefMut<f32>) {
    run_scoped(leaky_body, (x,), (Vmem::new([8, 128], F32), DmaSem::one()));
    o.store(x.load());
}

#[test]
fn a_copy_left_in_flight_at_the_end_of_its_scope_is_an_error_at_its_start() {
    let call = pallas_call(leaky_scope_kernel)
        .input(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .output(f32s([8, 128]), BlockSpec::new([8, 128], |[]| (0, 0)))
        .build()
        .expect("build");
    let e = call.interpret(&[ramp([8, 128])]).unwrap_err();
    expect_err(
        e,
        ErrorKind::Race,
        "leaky",
        &["when its run_scoped scope ends"],
    );
}

// ---------------------------------------------------------------------------------------------- pipelines

#[test]
fn a_nested_pipeline_streams_blocks_through_double_buffers() {
    for rows in [8, 16, 24, 64] {
        let call = kernels::pipeline_call(rows).expect("build");
        let n = rows * 256;
        let x = HostArray::from_vec(
            [rows, 256],
            (0..n).map(|i| i as f32 * 0.5).collect::<Vec<_>>(),
        )
        .unwrap();
        let y = HostArray::from_vec(
            [rows, 256],
            (0..n).map(|i| 3.0 - i as f32).collect::<Vec<_>>(),
        )
        .unwrap();
        let want: Vec<u32> = x
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .zip(y.as_slice::<f32>().unwrap())
            .map(|(a, b)| (a * 2.0 + b).to_bits())
            .collect();
        for seed in [None, Some(1), Some(9), Some(77)] {
            let out = call
                .interpret_with(&[x.clone(), y.clone()], &seeded(seed))
                .unwrap_or_else(|e| panic!("{rows} rows, seed {seed:?}: {e}"));
            let got: Vec<u32> = out[0]
                .as_slice::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(got, want, "{rows} rows, seed {seed:?}");
        }
    }
    let text = kernels::pipeline_call(32)
        .unwrap()
        .mosaic_mlir()
        .expect("lower");
    for op in [
        "tpu.region",
        "scf.for",
        "tpu.enqueue_dma",
        "tpu.wait_dma",
        "memref<2x8x256xf32, #tpu.memory_space<vmem>>",
    ] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
}
