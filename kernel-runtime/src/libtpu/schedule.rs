//! The shape of one program's final VLIW schedule, read from libtpu's dump of it
//! (`<id>-<program>-NN-final_bundles.txt`): what the cost model (`cost`) weighs.
//!
//! - **Bundles by loop depth**: the `>` marks between a bundle's address and its `{`.
//! - **Loops and their trip counts**: a loop starts at an `LB:` bundle and ends with the bundle that
//!   holds its `/* loop exit test */` (`scmp.ge.s32.totalorder %i, N`); a constant `N` is the trip
//!   count (for a Pallas grid loop, the grid's steps plus the pipeline's two extra iterations); a
//!   register `N` (a trip count known at run time) leaves it unknown, and such a loop counts once.
//! - **The grid**: `iteration_bounds` of the pipeline's DMA descriptors, and the bytes those DMAs move
//!   per grid step (each descriptor's `window_bounds` tiles × its `element_size_in_bytes`, descriptors
//!   inside a loop; all of them when there is no loop), each dimension clipped at the array's
//!   `base_bounds` (a block larger than its array copies the array). A block whose window is its
//!   whole array (`window_bounds` = `base_bounds`) never changes: the pipeline copies it once.
//! - **Operands XLA placed in VMEM** (`inlined_call_operand.vmem [shape: bf16[16,8192], ...`): moved
//!   between HBM and VMEM outside the kernel, not by its pipeline.
//! - **Regions that run when an index equals a constant**: a forward branch
//!   (`sbr.rel (%p) target = $regionN`) skips the bundles up to its target's label (`Start/End empty
//!   region N`). When it skips them unless a compare with a constant holds (`%p = scmp.ne.s32 %s, 3`,
//!   or `!%p` of an `scmp.eq`), the region runs on the steps where an index equals that constant: a
//!   Pallas `pl.when(k == 0)` that initializes an accumulator, a `pl.when(k == last)` that writes the
//!   output, one of the variants a kernel specializes on them (tpu-inference's `unfold_args`). Such
//!   bundles of the grid loop are counted apart (`loop_body_rare`).

use serde_json::{json, Value};

/// See the module documentation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    pub bundles_by_depth: Vec<u64>,
    pub iteration_bounds: Vec<u64>,
    pub dma_bytes_per_step: u64,
    pub dma_descriptors: u32,
    /// Bundles outside the grid loop, each other loop weighted by its trip count.
    pub outside_weighted: u64,
    /// One iteration of the grid loop (the depth-1 loop with the most bundles): its bundles, the
    /// loops inside it weighted by their trip counts. 0 without a loop.
    pub loop_body_weighted: u64,
    /// The grid loop's trip count, when its exit test is a constant.
    pub loop_trips: Option<u64>,
    /// The part of `loop_body_weighted` in regions that run only when an index equals a constant
    /// (see the module documentation).
    pub loop_body_rare: u64,
    /// Bytes of the operands (inputs and outputs) XLA placed in VMEM.
    pub vmem_operand_bytes: u64,
    /// Bytes of the pipeline's blocks that cover their whole array (`window_bounds` = `base_bounds`):
    /// the block never changes, and the pipeline copies it once. Not in `dma_bytes_per_step`.
    pub dma_bytes_once: u64,
    /// Bundles of the other programs of the module (XLA's ops around the kernel: pads, slices,
    /// fusions), loops weighted. Set by the caller that knows which programs are the kernel's.
    pub around_weighted: u64,
}

impl Schedule {
    pub fn to_json(&self) -> Value {
        json!({
            "bundles_by_depth": self.bundles_by_depth,
            "iteration_bounds": self.iteration_bounds,
            "dma_bytes_per_step": self.dma_bytes_per_step,
            "dma_descriptors": self.dma_descriptors,
            "outside_weighted": self.outside_weighted,
            "loop_body_weighted": self.loop_body_weighted,
            "loop_trips": self.loop_trips,
            "loop_body_rare": self.loop_body_rare,
            "vmem_operand_bytes": self.vmem_operand_bytes,
            "dma_bytes_once": self.dma_bytes_once,
            "around_weighted": self.around_weighted,
        })
    }

    pub fn from_json(v: &Value) -> Schedule {
        let list = |k: &str| -> Vec<u64> {
            v[k].as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default()
        };
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        Schedule {
            bundles_by_depth: list("bundles_by_depth"),
            iteration_bounds: list("iteration_bounds"),
            dma_bytes_per_step: n("dma_bytes_per_step"),
            dma_descriptors: n("dma_descriptors") as u32,
            outside_weighted: n("outside_weighted"),
            loop_body_weighted: n("loop_body_weighted"),
            loop_trips: v["loop_trips"].as_u64(),
            loop_body_rare: n("loop_body_rare"),
            vmem_operand_bytes: n("vmem_operand_bytes"),
            dma_bytes_once: n("dma_bytes_once"),
            around_weighted: n("around_weighted"),
        }
    }

    /// Every bundle of the program run once, loops weighted by their trip counts (the grid loop by
    /// its own, or once when it is known only at run time).
    pub fn weighted_total(&self) -> u64 {
        self.outside_weighted + self.loop_body_weighted * self.loop_trips.unwrap_or(1)
    }

    /// `other`'s parts added to this one's (several custom calls of one module).
    pub fn merge(&mut self, other: &Schedule) {
        if self.bundles_by_depth.len() < other.bundles_by_depth.len() {
            self.bundles_by_depth
                .resize(other.bundles_by_depth.len(), 0);
        }
        for (d, n) in other.bundles_by_depth.iter().enumerate() {
            self.bundles_by_depth[d] += n;
        }
        if self.iteration_bounds.is_empty() {
            self.iteration_bounds = other.iteration_bounds.clone();
        }
        self.dma_bytes_per_step += other.dma_bytes_per_step;
        self.dma_descriptors += other.dma_descriptors;
        self.outside_weighted += other.outside_weighted;
        self.loop_body_weighted += other.loop_body_weighted;
        self.loop_body_rare += other.loop_body_rare;
        self.loop_trips = self.loop_trips.max(other.loop_trips);
        self.vmem_operand_bytes += other.vmem_operand_bytes;
        self.dma_bytes_once += other.dma_bytes_once;
        self.around_weighted += other.around_weighted;
    }
}

/// A loop being read: its depth, its bundles (inner loops weighted) and its trip count.
struct Open {
    depth: usize,
    bundles: u64,
    /// Those of its bundles in regions that run when an index equals a constant.
    rare: u64,
    trips: Option<u64>,
    /// Its exit test was read: the loop ends at the next bundle of a lower depth.
    exited: bool,
}

/// The units a DMA window moves: per dimension its bound, clipped at the array's (a window past the
/// array's edge, as a block larger than its dimension, copies only what the array holds).
fn clipped(window: &[u64], base: Option<&[u64]>) -> u64 {
    match base {
        Some(b) if b.len() == window.len() => window.iter().zip(b).map(|(w, b)| w.min(b)).product(),
        _ => window.iter().product(),
    }
}

/// Parse a final-bundles dump (see [`Schedule`]).
pub(crate) fn parse_schedule(text: &str) -> Schedule {
    let mut s = Schedule::default();
    let mut depth = 0usize;
    let mut window: Option<Vec<u64>> = None;
    let mut base: Option<Vec<u64>> = None;
    let mut bounds: Option<Vec<u64>> = None;
    // (depth of the bundle that holds it, bytes, the block is the whole array)
    let mut descriptors: Vec<(usize, u64, bool)> = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    // the depth-1 loops: (bundles of one iteration, trip count, rare bundles of one iteration)
    let mut top_loops: Vec<(u64, Option<u64>, u64)> = Vec::new();
    let mut depth0 = 0u64;
    let mut regions = Regions::default();
    let close = |open: &mut Vec<Open>, top_loops: &mut Vec<(u64, Option<u64>, u64)>| {
        let l = open.pop().expect("a loop is open");
        if l.depth == 1 {
            top_loops.push((l.bundles, l.trips, l.rare));
        } else if let Some(parent) = open.last_mut() {
            parent.bundles += l.bundles * l.trips.unwrap_or(1);
            parent.rare += l.rare * l.trips.unwrap_or(1);
        }
    };
    let tuple = |rest: &str| -> Option<Vec<u64>> {
        rest.trim()
            .trim_start_matches('(')
            .split(')')
            .next()?
            .split(',')
            .filter(|t| !t.trim().is_empty())
            .map(|t| t.trim().parse().ok())
            .collect()
    };
    for line in text.lines() {
        // a label ends the regions that skip to it; the branches and compares of the line are read
        // after its bundle is counted (a branch skips the bundles after its own)
        regions.labels(line);
        let rare = regions.rare();
        let counted = bundle_depth(line);
        regions.ops(line);
        if let Some((d, starts_loop)) = counted {
            depth = d;
            if s.bundles_by_depth.len() <= d {
                s.bundles_by_depth.resize(d + 1, 0);
            }
            s.bundles_by_depth[d] += 1;
            // An empty bundle (`0x9   :  {}`) carries no depth marks even inside a loop: before
            // the loop's exit test it is a cycle of the loop it sits in.
            if d == 0 && !starts_loop && is_empty_bundle(line) {
                match open.last_mut() {
                    Some(l) if !l.exited => {
                        l.bundles += 1;
                        l.rare += u64::from(rare);
                    }
                    _ => depth0 += 1,
                }
                continue;
            }
            while open.last().is_some_and(|l| l.depth > d)
                || (starts_loop && open.last().is_some_and(|l| l.depth == d))
            {
                close(&mut open, &mut top_loops);
            }
            while open.last().map_or(0, |l| l.depth) < d {
                let depth = open.last().map_or(0, |l| l.depth) + 1;
                open.push(Open {
                    depth,
                    bundles: 0,
                    rare: 0,
                    trips: None,
                    exited: false,
                });
            }
            match open.last_mut() {
                Some(l) => {
                    l.bundles += 1;
                    l.rare += u64::from(rare);
                    if line.contains(EXIT_TEST) {
                        l.exited = true;
                        l.trips = l.trips.or(exit_test_bound(line));
                    }
                }
                None => depth0 += 1,
            }
            s.vmem_operand_bytes += vmem_operand_bytes(line);
            continue;
        }
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("base_bounds:") {
            base = tuple(rest);
        } else if let Some(rest) = t.strip_prefix("window_bounds:") {
            window = tuple(rest);
        } else if let Some(rest) = t.strip_prefix("iteration_bounds:") {
            if bounds.is_none() {
                bounds = tuple(rest);
            }
        } else if let Some(rest) = t.strip_prefix("element_size_in_bytes:") {
            let rest = rest.trim_start();
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let size: Option<u64> = rest[..digits].parse().ok();
            if let (Some(w), Some(size)) = (window.take(), size) {
                let b = base.take();
                let whole = b.as_ref() == Some(&w);
                descriptors.push((depth, clipped(&w, b.as_deref()) * size, whole));
            }
        }
    }
    while !open.is_empty() {
        close(&mut open, &mut top_loops);
    }
    // The grid loop is the depth-1 loop with the most bundles; other loops run outside it.
    let grid = (0..top_loops.len()).max_by_key(|&i| (top_loops[i].0, usize::MAX - i));
    s.outside_weighted = depth0;
    for (i, (bundles, trips, rare)) in top_loops.iter().enumerate() {
        if Some(i) == grid {
            s.loop_body_weighted = *bundles;
            s.loop_trips = *trips;
            s.loop_body_rare = *rare;
        } else {
            s.outside_weighted += bundles * trips.unwrap_or(1);
        }
    }
    s.iteration_bounds = bounds.unwrap_or_default();
    // In a loop, the descriptors inside it (those before it issue the first step's copies, which the
    // model charges as the pipeline's fill), a whole-array block copied once; without a loop, every
    // descriptor is the one step's.
    let looped = descriptors.iter().any(|(d, _, _)| *d >= 1);
    for (d, bytes, whole) in descriptors {
        if looped && d == 0 {
            continue;
        }
        if looped && whole {
            s.dma_bytes_once += bytes;
        } else {
            s.dma_bytes_per_step += bytes;
            s.dma_descriptors += 1;
        }
    }
    s
}

/// The forward branches being read and the compares they test: which bundles lie in a region that
/// runs only when an index equals a constant.
#[derive(Default)]
struct Regions {
    /// Predicate → it compares a register with a constant for equality (`scmp.eq`: `Some(true)`) or
    /// inequality (`scmp.ne`: `Some(false)`).
    compares: std::collections::HashMap<String, bool>,
    /// The labels seen so far (a branch to one of them goes back: a loop's).
    seen: std::collections::HashSet<u64>,
    /// The labels that open forward branches skip to, with whether the region they skip runs only
    /// when an index equals a constant.
    open: Vec<(u64, bool)>,
}

impl Regions {
    /// Whether a bundle read now lies in a region that runs only when an index equals a constant.
    fn rare(&self) -> bool {
        self.open.iter().any(|&(_, rare)| rare)
    }

    /// The labels a line places (`Start/End empty region 52`, `Start region 55`): the regions that
    /// skip to them end here.
    fn labels(&mut self, line: &str) {
        let Some((_, comment)) = line.split_once("/*") else {
            return;
        };
        for part in comment.split("::") {
            let part = part.trim().trim_end_matches("*/").trim();
            let n = part
                .strip_prefix("Start/End empty region ")
                .or_else(|| part.strip_prefix("Start region "))
                .and_then(|n| n.trim().parse::<u64>().ok());
            if let Some(n) = n {
                self.seen.insert(n);
                self.open.retain(|&(target, _)| target != n);
            }
        }
    }

    /// The compares and forward branches among a line's ops.
    fn ops(&mut self, line: &str) {
        let body = line.split_once('{').map_or(line, |(_, b)| b);
        for op in body.split(";;") {
            let op = op.split("/*").next().unwrap_or(op).trim();
            if let Some((lhs, rhs)) = op.split_once(" = ") {
                let equal = if rhs.starts_with("scmp.eq.") {
                    Some(true)
                } else if rhs.starts_with("scmp.ne.") {
                    Some(false)
                } else {
                    None
                };
                // against a constant: the last operand is a number
                let constant = rhs
                    .rsplit(',')
                    .next()
                    .is_some_and(|c| c.trim().trim_end_matches('}').trim().parse::<i64>().is_ok());
                if let (Some(equal), true, true) = (equal, constant, lhs.starts_with("%p")) {
                    self.compares.insert(lhs.trim().to_string(), equal);
                }
            }
            let Some(at) = op.find("sbr.rel (") else {
                continue;
            };
            let rest = &op[at + "sbr.rel (".len()..];
            let Some((pred, rest)) = rest.split_once(')') else {
                continue;
            };
            let Some(target) = rest
                .split("$region")
                .nth(1)
                .and_then(|t| t.trim().trim_end_matches('}').trim().parse::<u64>().ok())
            else {
                continue;
            };
            if self.seen.contains(&target) {
                continue; // backward: a loop's branch
            }
            let (negated, pred) = match pred.trim().strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, pred.trim()),
            };
            // the region runs when the branch is not taken: when `pred` is false (true if negated)
            let rare = self
                .compares
                .get(pred)
                .is_some_and(|&equal| equal == negated);
            self.open.push((target, rare));
        }
    }
}

/// A bundle line (`  0x1f LB: >> { ... }`, `     0   :  { ... }`) → its loop depth (the `>` marks
/// between the address and the bundle's `{`), and whether it starts a loop body (`LB:`).
fn bundle_depth(line: &str) -> Option<(usize, bool)> {
    let t = line.trim_start();
    let addr = t.split_whitespace().next()?;
    let hex = addr
        .strip_prefix("0x")
        .map(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if !(hex == Some(true) || addr.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let rest = &t[addr.len()..];
    let brace = rest.find('{')?;
    let head = &rest[..brace];
    // the tag (`LB:`), the `:` and the depth marks only
    if !head
        .chars()
        .all(|c| c.is_ascii_uppercase() || c == ':' || c == '>' || c.is_whitespace())
        || !head.contains(':')
    {
        return None;
    }
    Some((
        head.chars().filter(|&c| c == '>').count(),
        head.contains("LB:"),
    ))
}

const EXIT_TEST: &str = "/* loop exit test */";

/// A bundle with nothing in it: `{}`, perhaps followed by a comment.
fn is_empty_bundle(line: &str) -> bool {
    line.split_once('{')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('}'))
}

/// The constant bound of a bundle's loop exit test (`%p = scmp.ge.s32.totalorder %s, 66 /* loop exit
/// test */`); `None` when the bundle has none or the bound is a register.
fn exit_test_bound(line: &str) -> Option<u64> {
    let at = line.find(EXIT_TEST)?;
    let op = line[..at].rsplit(";;").next()?;
    let bound = op.rsplit(',').next()?.trim();
    bound.parse().ok()
}

/// Bytes of the operands a bundle names as placed in VMEM by XLA
/// (`inlined_call_operand.vmem [shape: bf16[16,8192], index: 0, kind: input, ...]`).
fn vmem_operand_bytes(line: &str) -> u64 {
    line.match_indices("inlined_call_operand.vmem [shape: ")
        .filter_map(|(at, m)| {
            let rest = &line[at + m.len()..];
            let (dtype, dims) = rest.split_once('[')?;
            let dims = dims.split(']').next()?;
            let elements: u64 = dims
                .split(',')
                .filter(|d| !d.trim().is_empty())
                .map(|d| d.trim().parse::<u64>().ok())
                .product::<Option<u64>>()?;
            let bits: u64 = match dtype.trim() {
                "pred" | "s8" | "u8" => 8,
                t if t.starts_with("f8") => 8,
                "s4" | "u4" => 4,
                "bf16" | "f16" | "s16" | "u16" => 16,
                "f32" | "s32" | "u32" => 32,
                "f64" | "s64" | "u64" => 64,
                _ => return None,
            };
            Some(elements * bits / 8)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_give_depths_grid_and_dma_bytes() {
        let text = "= control target key end\n\
             \n     0   :  { %s0 = smov 0 }\n\
             \x20  0x1   :  { %1 = dma.hbm_to_vmem %a /* window:\n\
             window_bounds: (16, 1)\n\
             iteration_bounds: (4, 4, 4)\n\
             element_size_in_bytes: 2048\n\
             second_minor_factor: 1 */ }\n\
             \x20 0x2 LB: > { %2 = dma.hbm_to_vmem %b /* window:\n\
             window_bounds: (16, 1)\n\
             iteration_bounds: (4, 4, 4)\n\
             element_size_in_bytes: 2048 */ }\n\
             \x20 0x3   : > { %3 = dma.vmem_to_hbm %c /* window:\n\
             window_bounds: (32, 2)\n\
             element_size_in_bytes: 4096 */ }\n\
             \x20 0x4 LB: >> { %4 = vadd }\n\
             \x20 0x5   : >> {}\n\
             \x20 0x6 PF: > { %p = scmp.ge.s32.totalorder %s9, 4 /* loop exit test */ }\n\
             \x20 0x7   :  {} /* End region 3 */\n";
        let s = parse_schedule(text);
        assert_eq!(s.bundles_by_depth, [3, 3, 2]);
        assert_eq!(s.iteration_bounds, [4, 4, 4]);
        assert_eq!(s.dma_bytes_per_step, 16 * 2048 + 64 * 4096);
        assert_eq!(s.dma_descriptors, 2);
        // the inner loop has no exit test and counts once
        assert_eq!((s.outside_weighted, s.loop_body_weighted), (3, 5));
        assert_eq!(s.loop_trips, Some(4));
    }

    /// Loops as libtpu writes them: nested, one after another, bounds constant or in a register.
    #[test]
    fn loops_are_weighted_by_their_exit_tests() {
        let text = "\
     0   :  { %s0 = inlined_call_operand.vmem [shape: bf16[16,8192], index: 0, kind: input, shape index: {}]  ;;  %s1 = inlined_call_operand.hbm [shape: s8[128,8192], index: 1, kind: input, shape index: {}]  ;;  %s2 = inlined_call_operand.vmem [shape: f32[1,128], index: 2, kind: input, shape index: {}] }
   0x1 LB: > { %s26 = sadd.s32 1, %s3 }
   0x2   : > { %v1 = vld [vmem:[%s0]] }
   0x2a   :  {} /* End region 22 */
   0x3 LB: >> { %v2 = vadd.f32 %v1, %v1 }
   0x4   : >> { %p9 = scmp.ge.s32.totalorder %s4, 8 /* loop exit test */ }
   0x5   : > { %p11 = scmp.ge.s32.totalorder %s14, 66 /* loop exit test */  ;;  %s3 = smov.u32 %s2 }
   0x6   :  { %s7 = smov 0 }
   0x7 LB: > { %v3 = vmul.f32 %v2, %v2 }
   0x8   : > { %p12 = scmp.ge.s32.totalorder %s15, %s16 /* loop exit test */ }
   0x9   :  {}
";
        let s = parse_schedule(text);
        assert_eq!(s.bundles_by_depth, [4, 5, 2]);
        // the grid loop: 4 bundles of its own (one empty, unmarked) + the inner loop's 2 × 8, run 66
        // times
        assert_eq!(s.loop_body_weighted, 4 + 2 * 8);
        assert_eq!(s.loop_trips, Some(66));
        // outside: 3 bundles, and the second loop once (its bound is a register)
        assert_eq!(s.outside_weighted, 3 + 2);
        assert_eq!(s.weighted_total(), 5 + 20 * 66);
        assert_eq!(s.vmem_operand_bytes, 16 * 8192 * 2 + 128 * 4);
        assert_eq!(Schedule::from_json(&s.to_json()), s);
    }

    /// Branches as libtpu writes them for tpu-inference's quantized matmul at 4 steps of its
    /// reduction axis (`%s18`): `if k == 0 { if k == 3 {A} else {B} } else { if k == 3 {C} else {D} }`.
    /// A, B and C run when `k` equals a constant; D when it does not; the pipeline's guard (a `pnand`)
    /// and the loop's back branch are neither.
    #[test]
    fn regions_that_run_when_an_index_equals_a_constant_are_counted_apart() {
        let text = "\
   0x1 LB: > { %p9 = pnand %p1, %p2  ;;  %p7747_p2 = scmp.ne.s32.totalorder %s18, 0 }
   0x2   : > { %p7748_p4 = scmp.ne.s32.totalorder (!%p7747_p2), %s18, 3  ;;  %p324_p11 = scmp.eq.s32.totalorder %s18, 3 }
   0x3   : > { %p323_p8 = scmp.eq.s32.totalorder %s18, 0  ;;  %8 = sbr.rel (%p9) target = $region36 }
   0x4   : > { %327 = sbr.rel (%p7747_p2) target = $region52 }
   0x5   :  {}
   0x6   : > { %330 = sbr.rel (%p7748_p4) target = $region56 } /* Start region 55 */
   0x7   : > { %v1 = vadd.f32 %v0, %v0 }
   0x8   : > { %v2 = vadd.f32 %v1, %v1 } /* End region 55 */
   0x9 PF: > { %2326 = sbr.rel (%p324_p11) target = $region60 } /* Start/End empty region 56 :: Start region 58 */
   0xa   : > { %v3 = vadd.f32 %v0, %v0 }
   0xb   : > { %v4 = vadd.f32 %v3, %v3 } /* End region 58 */
   0xc PF: > { %3904 = sbr.rel (%p323_p8) target = $region64 } /* Start/End empty region 60 :: Start/End empty region 52 */
   0xd   : > { %3907 = sbr.rel (!%p324_p11) target = $region68 } /* Start region 67 */
   0xe   : > { %v5 = vmul.f32 %v0, %v0 } /* End region 67 */
   0xf PF: > { %5967 = sbr.rel (%p324_p11) target = $region72 } /* Start/End empty region 68 */
  0x10   : > { %v6 = vmul.f32 %v0, %v0 }
  0x11   : > { %v7 = vmul.f32 %v0, %v0 }
  0x12 PF: > { %s1 = sadd.s32 1, %s1 } /* Start/End empty region 72 :: Start/End empty region 64 */
  0x13 PF: > { %s22 = sadd.s32 1, %s20 } /* Start/End empty region 36 :: Start region 118 */
  0x14   : > { %p19_p10 = scmp.ge.s32.totalorder %s22, 6 /* loop exit test */ }
  0x15   : > { %9 = sbr.rel (!%p19_p10) target = $region118 }
";
        let s = parse_schedule(text);
        assert_eq!(s.loop_body_weighted, 21);
        assert_eq!(s.loop_trips, Some(6));
        // k == 0: 0x5..=0xb (the delay slot, A and B); k == 3 (k != 0): 0xe
        assert_eq!(s.loop_body_rare, 7 + 1);
        assert_eq!(Schedule::from_json(&s.to_json()), s);
        // a compare with a register is not an index against a constant
        let s = parse_schedule(
            "   0x1 LB: > { %p1 = scmp.ne.s32.totalorder %s1, %s2 }
   0x2   : > { %2 = sbr.rel (%p1) target = $region9 }
   0x3   : > { %v1 = vadd.f32 %v0, %v0 }
   0x4 PF: > { %p = scmp.ge.s32.totalorder %s1, 6 /* loop exit test */ } /* Start/End empty region 9 */
",
        );
        assert_eq!((s.loop_body_weighted, s.loop_body_rare), (4, 0));
    }

    #[test]
    fn a_block_that_is_its_whole_array_is_copied_once() {
        let text = "\
   0x1 LB: > { %1 = dma.hbm_to_vmem %a /*
base_bounds: (4, 64)
dynamic_base_bounds: (4, 64)
window_bounds: (4, 1)
iteration_bounds: (1, 1, 64)
element_size_in_bytes: 4096 */ }
   0x2   : > { %2 = dma.hbm_to_vmem %b /*
base_bounds: (2, 70)
dynamic_base_bounds: (2, 70)
window_bounds: (2, 70)
iteration_bounds: (1, 1, 64)
element_size_in_bytes: 2048 */ }
   0x3   : > { %p = scmp.ge.s32.totalorder %s1, 66 /* loop exit test */ }
";
        let s = parse_schedule(text);
        assert_eq!(s.dma_bytes_per_step, 4 * 4096);
        assert_eq!(s.dma_descriptors, 1);
        assert_eq!(s.dma_bytes_once, 140 * 2048);
        assert_eq!(Schedule::from_json(&s.to_json()), s);
    }

    #[test]
    fn a_window_past_its_arrays_edge_moves_what_the_array_holds() {
        // gmm's tk = 640 over k = 320: a (5, 1) window of 128-row tiles over a (3, 4) array.
        let text = "\
   0x1 LB: > { %1 = dma.hbm_to_vmem %a /*
base_bounds: (3, 4)
dynamic_base_bounds: (3, 4)
window_bounds: (5, 1)
iteration_bounds: (4)
element_size_in_bytes: 1024 */ }
   0x2   : > { %p = scmp.ge.s32.totalorder %s1, 6 /* loop exit test */ }
";
        let s = parse_schedule(text);
        assert_eq!(s.dma_bytes_per_step, 3 * 1024);
        assert_eq!(clipped(&[5, 1], None), 5);
        assert_eq!(clipped(&[5, 1], Some(&[3])), 5, "ranks differ: not clipped");
    }

    #[test]
    fn exit_tests_and_operands_are_read_from_one_bundle() {
        assert_eq!(
            exit_test_bound("{ %p = scmp.ge.s32.totalorder %s1, 130 /* loop exit test */ }"),
            Some(130)
        );
        assert_eq!(
            exit_test_bound("{ %p = scmp.ge.s32.totalorder %s1, 130 }"),
            None
        );
        assert_eq!(
            vmem_operand_bytes("inlined_call_operand.vmem [shape: f8e4m3fn[4,128], index"),
            512
        );
        assert_eq!(
            vmem_operand_bytes("inlined_call_operand.hbm [shape: f32[4,128], index"),
            0
        );
        assert_eq!(
            vmem_operand_bytes("inlined_call_operand.vmem [shape: c64[4], index"),
            0
        );
    }
}
