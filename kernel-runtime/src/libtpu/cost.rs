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
//!   every blocked operand's window, as if its block changed every step — an upper bound where a
//!   block index repeats and the pipeline skips the copy), at the generation's HBM bandwidth per
//!   TensorCore, in cycles of its clock; a block that is its whole array is copied once (`dma_once`);
//!   and the operands XLA placed whole in VMEM are moved once outside the kernel (`vmem`).
//! - **Overlap**: the pipeline double-buffers, so each step after the first costs the larger of its
//!   compute and its DMA (the next step's copies run under this step's compute); the first waits for
//!   its own copies (the pipeline fills); the loop's iterations beyond the grid's steps (the
//!   pipeline's prologue and epilogue) copy nothing. Nothing overlaps the copies made once.
//!
//! `cycles = around + vmem + dma_once + outside + dma_step + body + (steps − 1) × max(body,
//! dma_step) + (iterations − steps) × body`.
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
}

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
    /// DMA of one step, in cycles.
    pub dma_step: f64,
    /// Copying the operands XLA placed in VMEM, in cycles.
    pub vmem: f64,
    /// Copying the blocks that are their whole array (fetched once, not per step), in cycles.
    pub dma_once: f64,
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
            "around": self.around, "dma_step": self.dma_step, "vmem": self.vmem,
            "dma_once": self.dma_once, "dma_bound": self.dma_bound(),
        })
    }

    /// Memory-bound: a step's DMA takes longer than its compute.
    pub fn dma_bound(&self) -> bool {
        self.dma_step > self.body as f64
    }
}

/// The model's estimate of a kernel whose final schedule is `s`, on `target`. `trips` are the trip
/// counts of the grid axes sized at run time ([`RUN_TIME_BOUND`]), in axis order: exactly one per
/// such axis, or the estimate is refused with the reason.
pub fn estimate(s: &Schedule, target: Target, trips: &[u64]) -> Result<Estimate, String> {
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
    let per_cycle = c.hbm_bytes_per_s / c.clock_hz;
    let dma_step = s.dma_bytes_per_step as f64 / per_cycle;
    let vmem = s.vmem_operand_bytes as f64 / per_cycle;
    let dma_once = s.dma_bytes_once as f64 / per_cycle;
    let (outside, body, around) = (s.outside_weighted, s.loop_body_weighted, s.around_weighted);
    let rare = s.loop_body_rare.min(body);
    let (iterations, kernel) = if body == 0 {
        // no loop: the schedule runs once, after all of its copies
        (0, outside as f64 + dma_step * steps as f64)
    } else {
        let iterations = s.loop_trips.unwrap_or(steps).max(1);
        // the iterations that copy a step's blocks (the grid's steps), and the pipeline's extra ones
        let copying = steps.min(iterations);
        let b = body as f64;
        (
            iterations,
            outside as f64
                + dma_step
                + b
                + (copying - 1) as f64 * b.max(dma_step)
                + (iterations - copying) as f64 * b,
        )
    };
    let cycles = around as f64 + vmem + dma_once + kernel;
    Ok(Estimate {
        steps,
        iterations,
        outside,
        body,
        rare,
        around,
        dma_step,
        vmem,
        dma_once,
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

    #[test]
    fn steady_state_is_the_larger_of_compute_and_dma() {
        let s = looped(10, 100, Some(8), vec![4, 2]);
        let e = estimate(&s, Target::V5e, &[]).unwrap();
        assert_eq!((e.steps, e.iterations, e.outside, e.body), (8, 8, 10, 100));
        assert_eq!(e.cycles, 10.0 + 100.0 + 7.0 * 100.0);
        // v5e: 819e9 B/s at 1.5 GHz = 546 B/cycle; 546 KB a step is 1,000 cycles, DMA-bound
        let heavy = Schedule {
            dma_bytes_per_step: 546_000,
            ..s.clone()
        };
        let e = estimate(&heavy, Target::V5e, &[]).unwrap();
        assert!(e.dma_bound());
        assert!(
            (e.cycles - (10.0 + 1000.0 + 100.0 + 7.0 * 1000.0)).abs() < 1e-6,
            "{e:?}"
        );
        assert!((e.seconds - e.cycles / 1.5e9).abs() < 1e-12);
        // the loop's own trip count (steps + the pipeline's extra iterations) runs the body; only
        // the steps copy
        let e = estimate(&looped(10, 100, Some(10), vec![4, 2]), Target::V5e, &[]).unwrap();
        assert_eq!((e.steps, e.iterations, e.cycles), (8, 10, 10.0 + 1000.0));
        let heavy = Schedule {
            loop_trips: Some(10),
            ..heavy
        };
        let e = estimate(&heavy, Target::V5e, &[]).unwrap();
        let want = 10.0 + 1000.0 + 100.0 + 7.0 * 1000.0 + 2.0 * 100.0;
        assert!((e.cycles - want).abs() < 1e-6, "{e:?}");
    }

    #[test]
    fn rare_regions_are_reported_and_counted_every_step() {
        let s = Schedule {
            loop_body_rare: 60,
            ..looped(10, 100, Some(10), vec![2, 4, 1])
        };
        let e = estimate(&s, Target::V5e, &[]).unwrap();
        assert_eq!((e.body, e.rare, e.steps), (100, 60, 8));
        assert_eq!(e.cycles, 10.0 + 100.0 * 10.0);
    }

    #[test]
    fn no_loop_runs_once_after_its_copies() {
        let s = Schedule {
            outside_weighted: 50,
            dma_bytes_per_step: 546 * 3,
            ..Schedule::default()
        };
        let e = estimate(&s, Target::V5e, &[]).unwrap();
        assert_eq!((e.steps, e.iterations, e.outside, e.body), (1, 0, 50, 0));
        assert!((e.cycles - 53.0).abs() < 1e-9, "{e:?}");
    }

    #[test]
    fn vmem_operands_and_the_ops_around_add_unoverlapped() {
        let s = Schedule {
            vmem_operand_bytes: 546 * 20,
            around_weighted: 7,
            ..looped(10, 100, Some(8), vec![8])
        };
        let e = estimate(&s, Target::V5e, &[]).unwrap();
        assert!((e.vmem - 20.0).abs() < 1e-9 && e.around == 7, "{e:?}");
        assert!(
            (e.cycles - (7.0 + 20.0 + 10.0 + 800.0)).abs() < 1e-6,
            "{e:?}"
        );
    }

    #[test]
    fn an_axis_sized_at_run_time_takes_its_given_trip_count() {
        // the grid loop's exit test is a register: its iterations are the steps
        let s = looped(10, 100, None, vec![2, RUN_TIME_BOUND, 3]);
        let e = estimate(&s, Target::V6e, &[5]).unwrap();
        assert_eq!((e.steps, e.iterations), (30, 30));
        assert_eq!(e.cycles, 10.0 + 100.0 + 29.0 * 100.0);
        let missing = estimate(&s, Target::V6e, &[]).unwrap_err();
        assert!(missing.contains("1 axes sized at run time"), "{missing}");
        assert!(estimate(&s, Target::V6e, &[5, 5]).is_err());
        let fixed = looped(10, 100, None, vec![2, 3]);
        assert!(estimate(&fixed, Target::V6e, &[5]).is_err());
    }
}
