//! A static cost model of one compiled kernel, from libtpu's own output: what `tune` ranks candidates
//! by, with no TPU. See `docs/tune.md` for the model, its inputs, constants and limits.
//!
//! - **Compute**: the final VLIW schedule of the kernel's program, one bundle per cycle: the bundles
//!   outside the grid loop once, the grid loop's body (every bundle at loop depth ≥ 1) once per grid
//!   step. Loops inside the body are counted once (their trip counts are not in the dump).
//! - **Memory**: the bytes the pipeline's DMAs move per grid step (`Schedule::dma_bytes_per_step`:
//!   every blocked operand's window, as if its block changed every step — an upper bound where a
//!   block index repeats and the pipeline skips the copy), at the generation's HBM bandwidth per
//!   TensorCore, in cycles of its clock.
//! - **Overlap**: the pipeline double-buffers, so each step after the first costs the larger of its
//!   compute and its DMA (the next step's copies run under this step's compute); the first step waits
//!   for its own copies (the pipeline fills).
//!
//! `cycles = outside + dma_step + body + (steps − 1) × max(body, dma_step)`.
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
    /// Grid steps (product of the grid's bounds; 1 without a grid loop).
    pub steps: u64,
    /// Bundles outside the grid loop.
    pub outside: u64,
    /// Bundles of one grid step (the loop body).
    pub body: u64,
    /// DMA of one step, in cycles.
    pub dma_step: f64,
    /// The model's total, cycles.
    pub cycles: f64,
    /// The same in seconds at the generation's clock.
    pub seconds: f64,
}

impl Estimate {
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
    let outside = s.bundles_by_depth.first().copied().unwrap_or(0);
    let body: u64 = s.bundles_by_depth.iter().skip(1).sum();
    let (outside, body) = if body == 0 {
        // no grid loop (one step): the whole schedule runs once
        (0, outside)
    } else {
        (outside, body)
    };
    let dma_step = s.dma_bytes_per_step as f64 / (c.hbm_bytes_per_s / c.clock_hz);
    let cycles =
        outside as f64 + dma_step + body as f64 + (steps - 1) as f64 * (body as f64).max(dma_step);
    Ok(Estimate {
        steps,
        outside,
        body,
        dma_step,
        cycles,
        seconds: cycles / c.clock_hz,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_state_is_the_larger_of_compute_and_dma() {
        let s = Schedule {
            bundles_by_depth: vec![10, 100],
            iteration_bounds: vec![4, 2],
            dma_bytes_per_step: 0,
            dma_descriptors: 0,
        };
        let e = estimate(&s, Target::V5e, &[]).unwrap();
        assert_eq!((e.steps, e.outside, e.body), (8, 10, 100));
        assert_eq!(e.cycles, 10.0 + 100.0 + 7.0 * 100.0);
        // v5e: 819e9 B/s at 1.5 GHz = 546 B/cycle; 546 KB a step is 1,000 cycles, DMA-bound
        let heavy = Schedule {
            dma_bytes_per_step: 546_000,
            ..s
        };
        let e = estimate(&heavy, Target::V5e, &[]).unwrap();
        assert!(e.dma_bound());
        assert!(
            (e.cycles - (10.0 + 1000.0 + 100.0 + 7.0 * 1000.0)).abs() < 1e-6,
            "{e:?}"
        );
        assert!((e.seconds - e.cycles / 1.5e9).abs() < 1e-12);
    }

    #[test]
    fn no_grid_loop_is_one_step() {
        let s = Schedule {
            bundles_by_depth: vec![50],
            ..Schedule::default()
        };
        let e = estimate(&s, Target::V6e, &[]).unwrap();
        assert_eq!((e.steps, e.outside, e.body), (1, 0, 50));
        assert_eq!(e.cycles, 50.0);
    }

    #[test]
    fn an_axis_sized_at_run_time_takes_its_given_trip_count() {
        let s = Schedule {
            bundles_by_depth: vec![10, 100],
            iteration_bounds: vec![2, RUN_TIME_BOUND, 3],
            ..Schedule::default()
        };
        let e = estimate(&s, Target::V6e, &[5]).unwrap();
        assert_eq!(e.steps, 30);
        assert_eq!(e.cycles, 10.0 + 100.0 + 29.0 * 100.0);
        let missing = estimate(&s, Target::V6e, &[]).unwrap_err();
        assert!(missing.contains("1 axes sized at run time"), "{missing}");
        assert!(estimate(&s, Target::V6e, &[5, 5]).is_err());
        let fixed = Schedule {
            iteration_bounds: vec![2, 3],
            ..s
        };
        assert!(estimate(&fixed, Target::V6e, &[5]).is_err());
    }
}
