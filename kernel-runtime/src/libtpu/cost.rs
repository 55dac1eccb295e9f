//! A static cost model of one compiled kernel, from libtpu's own output: what `tune` ranks candidates
//! by, with no TPU. See `docs/tune.md` for the model, its inputs, constants and limits.
//!
//! - **Compute**: the final VLIW schedule of the kernel's program ([`Schedule`]), one bundle per
//!   cycle, every loop weighted by its trip count from its exit test: the bundles outside the grid
//!   loop, and one iteration of the grid loop (`body`) run `iterations` times (the loop's own trip
//!   count; the grid's steps when that is known only at run time). The other programs of the module
//!   (XLA's pads, slices and fusions around the kernel) add their bundles (`around`), loops weighted.
//!   The body's regions that run only when an index equals a constant (`Schedule::loop_body_rare`:
//!   a `pl.when(k == 0)`, the variants a kernel specializes on it) are reported (`rare`) and
//!   counted every step like the rest (`docs/tune.md`, "The branch rule").
//! - **Memory**: the bytes the pipeline's DMAs move per grid step (`Schedule::dma_bytes_per_step`:
//!   every blocked operand's window), at the generation's HBM bandwidth per TensorCore, in cycles of
//!   its clock; a block that is its whole array is copied once (`dma_once`); and the operands XLA
//!   placed whole in VMEM are moved once outside the kernel (`vmem`). The pipeline skips the copy of
//!   a block whose index did not change since the previous step (libtpu predicates each of its DMAs
//!   on that): given the kernel's index maps, [`Copies`] says what share of a step's bytes moves on
//!   each step after the first; without them every block is taken to move every step (an upper
//!   bound).
//! - **Overlap**: the pipeline double-buffers, so each step after the first costs the larger of its
//!   compute and its DMA (the next step's copies run under this step's compute); the first waits for
//!   its own copies (the pipeline fills); the loop's iterations beyond the grid's steps (the
//!   pipeline's prologue and epilogue) copy nothing. Nothing overlaps the copies made once.
//!
//! - **Per step**: a fixed time every grid step costs beyond its bundles and its bytes
//!   ([`Constants::step_s`]), measured: jax's published TPU v5e timing of its blocked matmul leaves it
//!   over libtpu's schedule of the same kernel (`benches/step_overhead.py`).
//!
//! `cycles = around + vmem + dma_once + outside + dma_step + body + Σ over steps 2.. of max(body,
//! share × dma_step) + (iterations − steps) × body + steps × step` (share 1 on every step without
//! [`Copies`]; `step` is [`Constants::step_s`] in cycles).
//!
//! A grid axis whose size is a traced value (a Pallas grid sized by scalar prefetch, as megablox's
//! gmm sizes its group-tile axis) has no trip count in the dump: Mosaic writes [`RUN_TIME_BOUND`].
//! The caller gives its trip count (`trips`); without one the kernel cannot be estimated.

use super::Schedule;
use crate::Target;

/// Per-generation constants of the model (per TensorCore).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Constants {
    /// HBM bandwidth per TensorCore, bytes/s: the chip's published figure over its TensorCores.
    pub hbm_bytes_per_s: f64,
    /// Clock, Hz (one bundle per cycle).
    pub clock_hz: f64,
    /// The fixed time of one grid step beyond its bundles and its DMA bytes, seconds (the DMAs' issue
    /// to completion, the semaphore waits, the pipeline's bookkeeping between its bundles).
    pub step_s: f64,
}

/// [`Constants::step_s`] on every generation: what jax's Pallas TPU guide "Matrix Multiplication"
/// (docs.jax.dev/en/latest/pallas/tpu/matmul.html, "Performance of pipelined kernels") measured on a
/// TPU v5e for its blocked bf16 matmul with blocks of 128 (11.77 ms at 4096³, 32,768 grid steps;
/// 91.84 ms at 8192³, 262,144 steps) over what the model without it gives libtpu's schedule of the same
/// kernel for v5e: 234 and 225 ns a step (`benches/step_overhead.py` compiles it and prints the
/// figures; `python/tests/test_step_overhead.py` holds them). Measured on v5e only; taken to be the same
/// time on the other generations (in cycles it scales with their clocks).
pub const STEP_S: f64 = 230e-9;

/// The constants of `target`. Sources (`docs.cloud.google.com/tpu/docs/<generation>`, "key
/// specifications"): HBM bandwidth per chip v4 1,200 GB/s, v5e 819, v5p 2,765, v6e 1,640, tpu7x 7,380
/// (TensorCores per chip from the `Target` table: 2, 1, 2, 1, 2). No clock is published: it is derived
/// as the chip's bf16 peak over its MXUs' multiply-adds per cycle, `peak / (2 × TensorCores × MXUs ×
/// mxu_size²)` — v4 275 TFLOP/s → 1.05 GHz, v5e 197 → 1.50 GHz, v5p 459 → 1.75 GHz with the `Target`
/// table's 4 MXUs of 128²; v6e 918 → 1.75 GHz and tpu7x 2,307 → 2.20 GHz taking 4 MXUs of 256² per
/// TensorCore (the v6e page says 4 in one revision and 2 in another, jax's `num_mxus` says 2; with 2
/// the clocks would be twice as high). Only the DMA-to-compute ratio depends on the clock.
pub fn constants(target: Target) -> Constants {
    let (hbm_chip_gb_s, clock_ghz) = match target {
        Target::V4 => (1200.0, 1.05),
        Target::V5e => (819.0, 1.50),
        Target::V5p => (2765.0, 1.75),
        Target::V6e => (1640.0, 1.75),
        Target::Tpu7x => (7380.0, 2.20),
    };
    Constants {
        hbm_bytes_per_s: hbm_chip_gb_s * 1e9 / target.info().tensor_cores_per_chip as f64,
        clock_hz: clock_ghz * 1e9,
        step_s: STEP_S,
    }
}

/// What the pipeline copies on the grid steps after the first: `(steps, share)` pairs, `share` the
/// fraction of a step's DMA bytes ([`Schedule::dma_bytes_per_step`]) whose block index changed
/// since the previous step (blocks weighted by their bytes; the pipeline skips the others), over
/// `steps` steps. The steps sum to the grid's steps less one. Made from the kernel's index maps:
/// our kernels' by [`crate::libtpu::tune`], Mosaic's `transform_indices` by `tpu_kernel.tune`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Copies(pub Vec<(u64, f64)>);

impl Copies {
    /// From `[[steps, share], ...]`; `None` for anything else (null: not known).
    pub fn from_json(v: &serde_json::Value) -> Option<Copies> {
        let pairs = v.as_array()?;
        pairs
            .iter()
            .map(|p| Some((p.get(0)?.as_u64()?, p.get(1)?.as_f64()?)))
            .collect::<Option<Vec<_>>>()
            .map(Copies)
    }

    /// The pattern of `moved`, the bytes copied on each step after the first, of `total`, the
    /// bytes of the blocks the pipeline copies per step (not those that are their whole array,
    /// which are copied once).
    pub fn of_moved(total: u64, moved: impl IntoIterator<Item = u64>) -> Copies {
        let mut counts: std::collections::BTreeMap<u64, u64> = Default::default();
        for m in moved {
            *counts.entry(m).or_default() += 1;
        }
        let share = |moved: u64| {
            if total == 0 {
                1.0
            } else {
                moved as f64 / total as f64
            }
        };
        Copies(counts.into_iter().map(|(m, n)| (n, share(m))).collect())
    }

    fn steps(&self) -> u64 {
        self.0.iter().map(|(n, _)| n).sum()
    }
}

/// The bound the pipeline's descriptors carry for a grid axis sized at run time (`i32::MAX`).
pub const RUN_TIME_BOUND: u64 = i32::MAX as u64;

/// What the model predicts for one compiled kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Grid steps (product of the grid's bounds, run-time axes at their given trip counts; 1
    /// without a grid).
    pub steps: u64,
    /// Iterations of the grid loop (its exit test's bound: the steps plus the pipeline's extra
    /// iterations; `steps` when the bound is known only at run time); 0 without a loop.
    pub iterations: u64,
    /// Bundles outside the grid loop, loops weighted.
    pub outside: u64,
    /// Bundles of one grid loop iteration, inner loops weighted.
    pub body: u64,
    /// Of `body`, the bundles in regions that run only when an index equals a constant
    /// (`Schedule::loop_body_rare`). Counted every step like the rest: `docs/tune.md` ("The branch
    /// rule") says what counting them at their share did to the agreement with hardware-tuned tables.
    pub rare: u64,
    /// Bundles of the module's other programs (XLA's ops around the kernel), loops weighted.
    pub around: u64,
    /// DMA of one step that copies every block, in cycles.
    pub dma_step: f64,
    /// DMA of the whole grid, in cycles: `dma_step` on the first step, its share on the others.
    pub dma_grid: f64,
    /// Copying the operands XLA placed in VMEM, in cycles.
    pub vmem: f64,
    /// Copying the blocks that are their whole array (fetched once, not per step), in cycles.
    pub dma_once: f64,
    /// The grid steps' fixed cost, cycles: `steps` × [`Constants::step_s`] at the clock.
    pub step_overhead: f64,
    /// The model's total, cycles.
    pub cycles: f64,
    /// The same in seconds at the generation's clock.
    pub seconds: f64,
}

impl Estimate {
    /// The estimate as the JSON API and Python see it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "cycles": self.cycles, "seconds": self.seconds, "steps": self.steps,
            "iterations": self.iterations, "body": self.body, "rare": self.rare,
            "outside": self.outside,
            "around": self.around, "dma_step": self.dma_step, "dma_grid": self.dma_grid,
            "vmem": self.vmem,
            "dma_once": self.dma_once, "step_overhead": self.step_overhead,
            "dma_bound": self.dma_bound(),
        })
    }

    /// The grid's DMA over every block moving every step (1 when the pattern is not known): what the
    /// pipeline's skipped copies leave.
    pub fn moved_share(&self) -> f64 {
        let every = self.dma_step * self.steps as f64;
        if every > 0.0 {
            self.dma_grid / every
        } else {
            1.0
        }
    }

    /// Memory-bound: a step's DMA takes longer than its compute.
    pub fn dma_bound(&self) -> bool {
        self.dma_step > self.body as f64
    }
}

/// The model's estimate of a kernel whose final schedule is `s`, on `target`. `trips` are the trip
/// counts of the grid axes sized at run time ([`RUN_TIME_BOUND`]), in axis order: exactly one per
/// such axis, or the estimate is refused with the reason. `copies` is what the pipeline copies after
/// the first step; `None` takes every block to move every step.
pub fn estimate(
    s: &Schedule,
    target: Target,
    trips: &[u64],
    copies: Option<&Copies>,
) -> Result<Estimate, String> {
    let c = constants(target);
    let run_time = s
        .iteration_bounds
        .iter()
        .filter(|&&b| b == RUN_TIME_BOUND)
        .count();
    if run_time != trips.len() {
        return Err(format!(
            "the grid {:?} has {run_time} axes sized at run time (bound {RUN_TIME_BOUND}); {} trip \
             counts were given: give one per such axis (`trips`)",
            s.iteration_bounds,
            trips.len()
        ));
    }
    let mut given = trips.iter();
    let steps: u64 = s
        .iteration_bounds
        .iter()
        .map(|&b| {
            if b == RUN_TIME_BOUND {
                *given.next().expect("counted above")
            } else {
                b
            }
        })
        .product::<u64>()
        .max(1);
    // No pipeline descriptors (XLA placed every blocked operand in VMEM): no DMA to pattern.
    let copies = copies.filter(|_| !s.iteration_bounds.is_empty());
    if let Some(p) = copies {
        if p.steps() != steps - 1 {
            return Err(format!(
                "the copy pattern covers {} steps after the first; the grid {:?} has {}",
                p.steps(),
                s.iteration_bounds,
                steps - 1
            ));
        }
    }
    let per_cycle = c.hbm_bytes_per_s / c.clock_hz;
    let dma_step = s.dma_bytes_per_step as f64 / per_cycle;
    // the steps after the first: (how many, their DMA cycles)
    let after: Vec<(u64, f64)> = match copies {
        Some(p) => {
            p.0.iter()
                .map(|&(n, share)| (n, share * dma_step))
                .collect()
        }
        None => vec![(steps - 1, dma_step)],
    };
    let dma_grid = dma_step + after.iter().map(|&(n, d)| n as f64 * d).sum::<f64>();
    let vmem = s.vmem_operand_bytes as f64 / per_cycle;
    let dma_once = s.dma_bytes_once as f64 / per_cycle;
    let (outside, body, around) = (s.outside_weighted, s.loop_body_weighted, s.around_weighted);
    let rare = s.loop_body_rare.min(body);
    let (iterations, kernel) = if body == 0 {
        // no loop: the schedule runs once, after all of its copies
        (0, outside as f64 + dma_grid)
    } else {
        let iterations = s.loop_trips.unwrap_or(steps).max(1);
        // the iterations that copy a step's blocks (the grid's steps), and the pipeline's extra ones
        let copying = steps.min(iterations);
        let b = body as f64;
        // the copying steps after the first, in grid order of the pattern's groups
        let mut left = copying - 1;
        let mut steady = 0.0;
        for &(n, d) in &after {
            let n = n.min(left);
            steady += n as f64 * b.max(d);
            left -= n;
        }
        (
            iterations,
            outside as f64 + dma_step + b + steady + (iterations - copying) as f64 * b,
        )
    };
    let step_overhead = steps as f64 * c.step_s * c.clock_hz;
    let cycles = around as f64 + vmem + dma_once + kernel + step_overhead;
    Ok(Estimate {
        steps,
        iterations,
        outside,
        body,
        rare,
        around,
        dma_step,
        dma_grid,
        vmem,
        dma_once,
        step_overhead,
        cycles,
        seconds: cycles / c.clock_hz,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn looped(outside: u64, body: u64, trips: Option<u64>, bounds: Vec<u64>) -> Schedule {
        Schedule {
            outside_weighted: outside,
            loop_body_weighted: body,
            loop_trips: trips,
            iteration_bounds: bounds,
            ..Schedule::default()
        }
    }

    impl Estimate {
        /// The model before the grid steps' fixed cost (what these tests were written against).
        fn before_steps(&self) -> f64 {
            self.cycles - self.step_overhead
        }
    }

    #[test]
    fn every_grid_step_costs_the_measured_fixed_time_at_the_generations_clock() {
        let s = looped(10, 100, Some(8), vec![4, 2]);
        for (target, clock) in [
            (Target::V5e, 1.5e9),
            (Target::V6e, 1.75e9),
            (Target::Tpu7x, 2.2e9),
        ] {
            let e = estimate(&s, target, &[], None).unwrap();
            assert!(
                (e.step_overhead - 8.0 * STEP_S * clock).abs() < 1e-6,
                "{target:?}: {e:?}"
            );
            assert!((e.cycles - (10.0 + 100.0 + 7.0 * 100.0 + e.step_overhead)).abs() < 1e-6);
        }
        // 230 ns is 345 cycles at v5e's 1.5 GHz
        let e = estimate(&looped(0, 1, None, vec![1]), Target::V5e, &[], None).unwrap();
        assert!((e.step_overhead - 345.0).abs() < 1e-6, "{e:?}");
    }

    #[test]
    fn steady_state_is_the_larger_of_compute_and_dma() {
        let s = looped(10, 100, Some(8), vec![4, 2]);
        let e = estimate(&s, Target::V5e, &[], None).unwrap();
        assert_eq!((e.steps, e.iterations, e.outside, e.body), (8, 8, 10, 100));
        assert_eq!(e.before_steps(), 10.0 + 100.0 + 7.0 * 100.0);
        // v5e: 819e9 B/s at 1.5 GHz = 546 B/cycle; 546 KB a step is 1,000 cycles, DMA-bound
        let heavy = Schedule {
            dma_bytes_per_step: 546_000,
            ..s.clone()
        };
        let e = estimate(&heavy, Target::V5e, &[], None).unwrap();
        assert!(e.dma_bound());
        assert!(
            (e.before_steps() - (10.0 + 1000.0 + 100.0 + 7.0 * 1000.0)).abs() < 1e-6,
            "{e:?}"
        );
        assert!((e.seconds - e.cycles / 1.5e9).abs() < 1e-12);
        // the loop's own trip count (steps + the pipeline's extra iterations) runs the body; only
        // the steps copy
        let e = estimate(
            &looped(10, 100, Some(10), vec![4, 2]),
            Target::V5e,
            &[],
            None,
        )
        .unwrap();
        assert_eq!(
            (e.steps, e.iterations, e.before_steps()),
            (8, 10, 10.0 + 1000.0)
        );
        let heavy = Schedule {
            loop_trips: Some(10),
            ..heavy
        };
        let e = estimate(&heavy, Target::V5e, &[], None).unwrap();
        let want = 10.0 + 1000.0 + 100.0 + 7.0 * 1000.0 + 2.0 * 100.0;
        assert!((e.before_steps() - want).abs() < 1e-6, "{e:?}");
    }

    #[test]
    fn rare_regions_are_reported_and_counted_every_step() {
        let s = Schedule {
            loop_body_rare: 60,
            ..looped(10, 100, Some(10), vec![2, 4, 1])
        };
        let e = estimate(&s, Target::V5e, &[], None).unwrap();
        assert_eq!((e.body, e.rare, e.steps), (100, 60, 8));
        assert_eq!(e.before_steps(), 10.0 + 100.0 * 10.0);
    }

    #[test]
    fn no_loop_runs_once_after_its_copies() {
        let s = Schedule {
            outside_weighted: 50,
            dma_bytes_per_step: 546 * 3,
            ..Schedule::default()
        };
        let e = estimate(&s, Target::V5e, &[], None).unwrap();
        assert_eq!((e.steps, e.iterations, e.outside, e.body), (1, 0, 50, 0));
        assert!((e.before_steps() - 53.0).abs() < 1e-9, "{e:?}");
    }

    #[test]
    fn vmem_operands_and_the_ops_around_add_unoverlapped() {
        let s = Schedule {
            vmem_operand_bytes: 546 * 20,
            around_weighted: 7,
            ..looped(10, 100, Some(8), vec![8])
        };
        let e = estimate(&s, Target::V5e, &[], None).unwrap();
        assert!((e.vmem - 20.0).abs() < 1e-9 && e.around == 7, "{e:?}");
        assert!(
            (e.before_steps() - (7.0 + 20.0 + 10.0 + 800.0)).abs() < 1e-6,
            "{e:?}"
        );
    }

    #[test]
    fn an_axis_sized_at_run_time_takes_its_given_trip_count() {
        // the grid loop's exit test is a register: its iterations are the steps
        let s = looped(10, 100, None, vec![2, RUN_TIME_BOUND, 3]);
        let e = estimate(&s, Target::V6e, &[5], None).unwrap();
        assert_eq!((e.steps, e.iterations), (30, 30));
        assert_eq!(e.before_steps(), 10.0 + 100.0 + 29.0 * 100.0);
        let missing = estimate(&s, Target::V6e, &[], None).unwrap_err();
        assert!(missing.contains("1 axes sized at run time"), "{missing}");
        assert!(estimate(&s, Target::V6e, &[5, 5], None).is_err());
        let fixed = looped(10, 100, None, vec![2, 3]);
        assert!(estimate(&fixed, Target::V6e, &[5], None).is_err());
    }

    #[test]
    fn blocks_whose_index_repeats_are_not_copied_again() {
        // a (2, 4) grid: x's block follows the row axis, w's the column axis, both 546 KB (1,000
        // cycles on v5e); the body 400 cycles
        let moved = (1..8).map(|s| 273_000 * (1 + u64::from(s % 4 == 0)));
        let copies = Copies::of_moved(546_000, moved);
        // w moves on 7 steps, x too on the step the row changes
        assert_eq!(copies, Copies(vec![(6, 0.5), (1, 1.0)]));
        let s = Schedule {
            dma_bytes_per_step: 546_000,
            ..looped(10, 400, Some(10), vec![2, 4])
        };
        let e = estimate(&s, Target::V5e, &[], Some(&copies)).unwrap();
        let want = 10.0 + 1000.0 + 400.0 + 6.0 * 500.0 + 1000.0 + 2.0 * 400.0;
        assert!((e.before_steps() - want).abs() < 1e-6, "{e:?}");
        assert!((e.dma_grid - (1000.0 + 6.0 * 500.0 + 1000.0)).abs() < 1e-6);
        assert!((e.moved_share() - 5000.0 / 8000.0).abs() < 1e-9, "{e:?}");
        // without the pattern every block moves every step: an upper bound
        let upper = estimate(&s, Target::V5e, &[], None).unwrap();
        assert!(
            (upper.before_steps() - (10.0 + 1000.0 + 400.0 + 7.0 * 1000.0 + 800.0)).abs() < 1e-6
        );
        assert!((upper.moved_share() - 1.0).abs() < 1e-12);
        // a pattern over another grid is refused, with both counts
        let short = Copies(vec![(3, 1.0)]);
        let why = estimate(&s, Target::V5e, &[], Some(&short)).unwrap_err();
        assert!(
            why.contains("covers 3 steps") && why.contains("has 7"),
            "{why}"
        );
        // with no pipeline descriptors (every operand placed in VMEM) there is nothing to pattern
        let placed = Schedule {
            iteration_bounds: vec![],
            dma_bytes_per_step: 0,
            ..s.clone()
        };
        let e = estimate(&placed, Target::V5e, &[], Some(&copies)).unwrap();
        assert_eq!((e.steps, e.dma_grid), (1, 0.0));
        let json = serde_json::json!([[6, 0.5], [1, 1.0]]);
        assert_eq!(Copies::from_json(&json), Some(copies));
        assert_eq!(Copies::from_json(&serde_json::Value::Null), None);
    }
}
