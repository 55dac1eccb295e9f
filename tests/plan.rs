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
