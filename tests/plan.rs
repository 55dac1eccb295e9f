//! The interpreter's execution plan (`--emit plan`): each fast path is observable, so a silently
//! disabled one fails here instead of only running slower.

mod common;

use tpu_kernel::runtime::interpret::{plan_counts, plan_text, InterpretOptions, PlanCounts};

fn counts(name: &str, opts: &InterpretOptions) -> PlanCounts {
    let (_, build) = common::EXAMPLES
        .iter()
        .find(|(n, _)| *n == name)
        .expect("example");
    let call = build().expect("builds");
    plan_counts(call.ir(), opts).expect("plan")
}

#[test]
fn the_examples_fast_paths_fire() {
    let on = InterpretOptions::default();
    let softmax = counts("softmax", &on);
    assert!(softmax.row_bands, "softmax runs in row bands: {softmax:?}");
    assert_eq!(softmax.parallel_axes, 1, "{softmax:?}");
    assert!(
        softmax.chains >= 1 && softmax.epilogues >= 1,
        "x - max -> exp fused with its sum: {softmax:?}"
    );
    assert!(
        softmax.sunk >= 1,
        "the division writes straight into the output block: {softmax:?}"
    );

    let rmsnorm = counts("rmsnorm", &on);
    assert!(rmsnorm.epilogues >= 1 && rmsnorm.folded >= 3, "{rmsnorm:?}");

    let matmul = counts("matmul", &on);
    assert_eq!(
        matmul.in_place_dots, 1,
        "the dot accumulates into its scratch: {matmul:?}"
    );
    assert_eq!(matmul.parallel_axes, 2, "{matmul:?}");

    let add = counts("add", &on);
    assert!(add.row_bands && add.sunk == 1, "{add:?}");

    // Ragged paged attention's bf16 keys and values, unpacked from their packed words in one pass
    // each (per case body: decode, mixed).
    let rpa = counts("ragged_paged_attention", &on);
    assert!(
        rpa.word_halves >= 2 && rpa.word_halves.is_multiple_of(2),
        "{rpa:?}"
    );
    // ... and the words loaded for them never assembled: each case body's load of a KV chunk's packed
    // words reads the two halves straight from the bf16 rows.
    assert!(
        rpa.load_halves >= 1 && rpa.load_halves * 2 == rpa.word_halves,
        "{rpa:?}"
    );
    // ... and both halves reach only the `dot`s (the values through the mask's `select`): read in
    // place from the landed rows, not copied.
    assert_eq!(rpa.halves_in_place, rpa.word_halves, "{rpa:?}");
    // ... and the values' mask (`select(v_pos < kv_end, v, 0)`) runs inside `p v`: one per case body.
    assert_eq!(rpa.selects_in_dots, rpa.load_halves, "{rpa:?}");
    // ... and `q kᵀ` computes only the keys before the kv length (`select(k_pos < kv_end, s, mask)`
    // reads no others): one per case body.
    assert_eq!(rpa.live_column_dots, rpa.load_halves, "{rpa:?}");

    // The production kernels: each accumulator (f32 for the bf16 dots, i32 for i8 x i8) is updated in
    // place, and the output-stationary grids run in parallel chunks — grouped_matmul's too, whose
    // output blocks come from scalar-prefetched tables but whose parallel axis is itself the block's
    // column index.
    for (name, axes) in [
        ("quantized_matmul", 2),
        ("quantized_matmul_w8a8", 2),
        ("grouped_matmul", 1),
    ] {
        let c = counts(name, &on);
        assert_eq!(
            c.in_place_dots, 1,
            "{name}: the dot accumulates into its scratch: {c:?}"
        );
        assert_eq!(c.parallel_axes, axes, "{name}: {c:?}");
    }
}

#[test]
fn without_fusion_or_threads_nothing_fires() {
    let off = InterpretOptions {
        fuse: false,
        parallel: false,
        ..InterpretOptions::default()
    };
    for (name, _) in common::EXAMPLES {
        let c = counts(name, &off);
        assert_eq!(
            (
                c.row_bands,
                c.parallel_axes,
                c.chains,
                c.folded,
                c.epilogues,
                c.sunk
            ),
            (false, 0, 0, 0, 0, 0),
            "{name}: {c:?}"
        );
    }
}

#[test]
fn the_plan_text_names_what_fires() {
    let (_, build) = common::EXAMPLES
        .iter()
        .find(|(n, _)| *n == "softmax")
        .expect("softmax");
    let text =
        plan_text(build().expect("builds").ir(), &InterpretOptions::default()).expect("plan");
    for needle in [
        "row bands",
        "parallel chunks",
        "fused chain",
        "Sum epilogue",
        "sunk into the output block",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
}

mod scatter {
    use tpu_kernel::prelude::*;

    #[tpu_kernel]
    pub fn scatter_kernel(_to: Ref<i32, Smem>, x: Ref<f32>, o: RefMut<f32>) {
        o.store(x.load());
    }
}

/// An output block chosen by scalar-prefetched data on a parallel axis (a scatter, `o[to[i]] = x[i]`):
/// two chunks may write one block, so the grid runs in order; with the parallel axis as one of the
/// block's indices (`grouped_matmul`, above) it is split.
#[test]
fn a_data_chosen_output_block_splits_only_along_its_own_indices() {
    use tpu_kernel::prelude::*;
    let a = || ArrayType::new([32, 256], F32);
    let parallel_axes = |semantics| {
        let call = pallas_call(scatter::scatter_kernel)
            .grid([4, 2])
            .scalar_prefetch(ArrayType::new([4], I32))
            .input(a(), BlockSpec::new([8, 128], |[i, j]| (i, j)))
            .output(
                a(),
                BlockSpec::with_prefetch([8, 128], |[i, j], [to]| (to.at(i).load(), j)),
            )
            .dimension_semantics(semantics)
            .build()
            .expect("builds");
        plan_counts(call.ir(), &InterpretOptions::default())
            .expect("plan")
            .parallel_axes
    };
    assert_eq!(
        parallel_axes([Parallel, Arbitrary]),
        0,
        "rows chosen by the table"
    );
    assert_eq!(
        parallel_axes([Arbitrary, Parallel]),
        1,
        "columns by the parallel axis"
    );
}

mod heads {
    use tpu_kernel::prelude::*;

    /// `acc[h] = 2 x[h]` for each head, then the output from `acc`: independent iterations.
    #[tpu_kernel]
    pub fn per_head_kernel(x: Ref<f32>, o: RefMut<f32>, acc: RefMut<f32>) {
        for h in 0..4i32 {
            acc.at(h).store(x.at(h).load() * 2.0);
        }
        o.store(acc.load());
    }

    /// The same with each head's row also read by the next head: iteration `h` reads what `h - 1`
    /// wrote, so the order matters.
    #[tpu_kernel]
    pub fn chained_kernel(x: Ref<f32>, o: RefMut<f32>, acc: RefMut<f32>) {
        acc.at(0).store(x.at(0).load());
        for h in 1..4i32 {
            acc.at(h).store(acc.at(h - 1).load() + x.at(h).load());
        }
        o.store(acc.load());
    }

    /// Every head reads row 0 of the ref the loop writes (which head 0 writes).
    #[tpu_kernel]
    pub fn shared_row_kernel(x: Ref<f32>, o: RefMut<f32>, acc: RefMut<f32>) {
        for h in 0..4i32 {
            acc.at(h).store(acc.at(0).load() + x.at(h).load());
        }
        o.store(acc.load());
    }

    /// A running sum carried from head to head.
    #[tpu_kernel]
    pub fn carried_kernel(x: Ref<f32>, o: RefMut<f32>, acc: RefMut<f32>) {
        let mut total = full([8, 128], 0.0f32);
        for h in 0..4i32 {
            total += x.at(h).load();
            acc.at(h).store(total);
        }
        o.store(acc.load());
    }

    /// One head too many: head 4 stores past the end of `acc`'s 4 rows (independent iterations,
    /// one of which fails).
    #[tpu_kernel]
    pub fn out_of_bounds_kernel(x: Ref<f32>, o: RefMut<f32>, acc: RefMut<f32>) {
        for h in 0..5i32 {
            acc.at(h).store(x.at(0).load());
        }
        o.store(acc.load());
    }

    /// `per_head` with a copy of `y` in flight across the loop (a prefetch under the compute).
    #[tpu_kernel]
    pub fn prefetch_kernel(
        x: Ref<f32>,
        y_hbm: Ref<f32, Any>,
        o: RefMut<f32>,
        acc: RefMut<f32>,
        buf: RefMut<f32>,
        sem: DmaSem,
    ) {
        let c = async_copy(y_hbm, buf, sem);
        c.start();
        for h in 0..4i32 {
            acc.at(h).store(x.at(h).load() * 2.0);
        }
        c.wait();
        o.store(acc.load() + buf.load());
    }

    /// The same loop reading the copy's destination before its wait: a race, in head 0 first.
    #[tpu_kernel]
    pub fn prefetch_race_kernel(
        x: Ref<f32>,
        y_hbm: Ref<f32, Any>,
        o: RefMut<f32>,
        acc: RefMut<f32>,
        buf: RefMut<f32>,
        sem: DmaSem,
    ) {
        let c = async_copy(y_hbm, buf, sem);
        c.start();
        for h in 0..4i32 {
            acc.at(h).store(x.at(h).load() + buf.at(h).load());
        }
        c.wait();
        o.store(acc.load());
    }
}

fn prefetch_call<Args, K: tpu_kernel::launch::KernelFn<Args>>(kernel: K) -> tpu_kernel::PallasCall {
    use tpu_kernel::prelude::*;
    let a = || ArrayType::new([4, 8, 128], F32);
    pallas_call(kernel)
        .grid([1])
        .input(a(), BlockSpec::new([4, 8, 128], |[_]| (0, 0, 0)))
        .input_any(a())
        .output(a(), BlockSpec::new([4, 8, 128], |[_]| (0, 0, 0)))
        .scratch(Vmem::new([4, 8, 128], F32))
        .scratch(Vmem::new([4, 8, 128], F32))
        .scratch(DmaSem::one())
        .build()
        .expect("builds")
}

fn heads_call<Args, K: tpu_kernel::launch::KernelFn<Args>>(kernel: K) -> tpu_kernel::PallasCall {
    use tpu_kernel::prelude::*;
    let a = || ArrayType::new([4, 8, 128], F32);
    pallas_call(kernel)
        .grid([1])
        .input(a(), BlockSpec::new([4, 8, 128], |[_]| (0, 0, 0)))
        .output(a(), BlockSpec::new([4, 8, 128], |[_]| (0, 0, 0)))
        .scratch(Vmem::new([4, 8, 128], F32))
        .build()
        .expect("builds")
}

/// A `for` loop runs its iterations across threads only when they are independent: every ref it
/// writes is read and written only at the induction variable's own index, it carries no value, and
/// (here) it is the loop over heads of `per_head`; a chain through the written ref, a read of
/// another head's row or a carried value keeps a loop in order. With `parallel: false`, or without
/// fusion (the plain path), no loop is split.
#[test]
fn a_loop_splits_only_when_its_iterations_are_independent() {
    let on = InterpretOptions::default();
    let split =
        |call: tpu_kernel::PallasCall| plan_counts(call.ir(), &on).expect("plan").split_loops;
    assert_eq!(split(heads_call(heads::per_head_kernel)), 1);
    assert_eq!(split(heads_call(heads::chained_kernel)), 0, "h reads h - 1");
    assert_eq!(
        split(heads_call(heads::shared_row_kernel)),
        0,
        "every h reads row 0"
    );
    assert_eq!(
        split(heads_call(heads::carried_kernel)),
        0,
        "a carried value"
    );
    for off in [
        InterpretOptions {
            parallel: false,
            ..InterpretOptions::default()
        },
        InterpretOptions {
            fuse: false,
            ..InterpretOptions::default()
        },
    ] {
        let c = plan_counts(heads_call(heads::per_head_kernel).ir(), &off).expect("plan");
        assert_eq!(c.split_loops, 0, "{off:?}");
    }
    let text = plan_text(heads_call(heads::per_head_kernel).ir(), &on).expect("plan");
    assert!(
        text.contains("iterations independent") && text.contains("along dim 0"),
        "{text}"
    );
    // The ragged paged attention's loops over kv heads (the decode's and the mixed case's).
    assert_eq!(counts("ragged_paged_attention", &on).split_loops, 2);
}

/// A split loop gives the bits of the loop run in order, and the same error (the first failing
/// iteration's, at its source line) when an iteration fails.
#[test]
fn a_split_loop_gives_the_sequential_bits_and_errors() {
    let seq = InterpretOptions {
        parallel: false,
        ..InterpretOptions::default()
    };
    let call = heads_call(heads::per_head_kernel);
    let inputs = tpu_kernel::reference::random_inputs(&call, 5);
    let par = call.interpret(&inputs).expect("split");
    let ord = call.interpret_with(&inputs, &seq).expect("in order");
    assert_eq!(par, ord);
    let x = inputs[0].as_slice::<f32>().expect("f32");
    let o = par[0].as_slice::<f32>().expect("f32");
    assert!(x
        .iter()
        .zip(o)
        .all(|(a, b)| (2.0 * a).to_bits() == b.to_bits()));

    let call = heads_call(heads::out_of_bounds_kernel);
    let on = InterpretOptions::default();
    assert_eq!(plan_counts(call.ir(), &on).expect("plan").split_loops, 1);
    let inputs = tpu_kernel::reference::random_inputs(&call, 6);
    let par = call
        .interpret(&inputs)
        .expect_err("out of bounds")
        .to_string();
    let ord = call
        .interpret_with(&inputs, &seq)
        .expect_err("out of bounds")
        .to_string();
    assert_eq!(par, ord);
    assert!(
        par.contains("plan.rs") && par.contains("out-of-bounds store into scratch 0"),
        "{par}"
    );
}

/// A copy in flight across a split loop (a prefetch of the next block under this one's compute)
/// does not keep the loop in order: copies land only at their waits, and a split body holds none.
/// Each iteration still sees the copies in flight, so reading one's destination is the race the
/// ordered run reports, with the same message; and a seeded run (copies landing between any two
/// ops) gives the same bits.
#[test]
fn a_split_loop_runs_beside_a_copy_in_flight_and_reports_its_races() {
    let seq = InterpretOptions {
        parallel: false,
        ..InterpretOptions::default()
    };
    let on = InterpretOptions::default();
    let call = prefetch_call(heads::prefetch_kernel);
    assert_eq!(plan_counts(call.ir(), &on).expect("plan").split_loops, 1);
    let inputs = tpu_kernel::reference::random_inputs(&call, 7);
    let par = call.interpret(&inputs).expect("split");
    assert_eq!(par, call.interpret_with(&inputs, &seq).expect("in order"));
    for seed in 0..4 {
        let seeded = InterpretOptions {
            dma_seed: Some(seed),
            ..InterpretOptions::default()
        };
        assert_eq!(par, call.interpret_with(&inputs, &seeded).expect("seeded"));
    }
    let (x, y) = (inputs[0].as_slice::<f32>(), inputs[1].as_slice::<f32>());
    let o = par[0].as_slice::<f32>().expect("f32");
    assert!(x
        .expect("f32")
        .iter()
        .zip(y.expect("f32"))
        .zip(o)
        .all(|((a, b), c)| (2.0 * a + b).to_bits() == c.to_bits()));

    let call = prefetch_call(heads::prefetch_race_kernel);
    assert_eq!(plan_counts(call.ir(), &on).expect("plan").split_loops, 1);
    let inputs = tpu_kernel::reference::random_inputs(&call, 8);
    let par = call.interpret(&inputs).expect_err("race").to_string();
    let ord = call
        .interpret_with(&inputs, &seq)
        .expect_err("race")
        .to_string();
    assert_eq!(par, ord);
    assert!(
        par.contains("plan.rs") && par.contains("reads scratch 1") && par.contains("in flight"),
        "{par}"
    );
}
