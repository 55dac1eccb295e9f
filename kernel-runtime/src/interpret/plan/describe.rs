//! The plan printed (`--emit plan`) and counted (`tests/plan.rs`): one line per op not run as written.

use super::super::fused::Link;
use super::Plan;
use crate::dtype::DType;
use crate::ir::{Func, Region};
use std::fmt::Write as _;

impl Plan {
    /// The plan, one line per op that is not run as written (plus a summary), indented by region.
    pub(crate) fn describe(&self, f: &Func) -> String {
        let mut out = String::new();
        self.describe_region(&f.body, 0, &mut out);
        out
    }

    fn describe_region(&self, r: &Region, depth: usize, out: &mut String) {
        let pad = "  ".repeat(depth);
        for (i, op) in r.ops.iter().enumerate() {
            let at = format!("{pad}op {i} ({})", crate::ir::op_label(&op.kind));
            if let Some(d) = self.select_rhs.iter().position(|j| *j == Some(i)) {
                let _ = writeln!(
                    out,
                    "{at}: runs inside the dot op {d} (rows it drops read as zero)"
                );
            } else if self.skip[i] {
                let _ = writeln!(out, "{at}: folded into a fused chain");
            }
            if let Some(live) = &self.live_columns[i] {
                let _ = writeln!(
                    out,
                    "{at}: computes only the columns the select op {} reads (iota + %{} {:?} %{})",
                    live.select, live.x.0, live.cmp, live.y.0
                );
            }
            if let Some((w, half)) = self.word_half[i] {
                let _ = writeln!(
                    out,
                    "{at}: bf16 of the {half:?} half of each word of %{}",
                    w.0
                );
            }
            if let Some(halves) = &self.load_halves[i] {
                let casts: Vec<String> = halves
                    .iter()
                    .map(|c| {
                        let place = if c.only_dot_factor {
                            ", read in place"
                        } else {
                            ""
                        };
                        format!("op {} ({:?}{place})", c.op, c.half)
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "{at}: read straight into the bf16 halves of {}",
                    casts.join(", ")
                );
            }
            if let Some(ch) = &self.chain[i] {
                let links: Vec<String> = ch.links.iter().map(link_label).collect();
                let _ = write!(
                    out,
                    "{at}: fused chain from %{} [{}]",
                    ch.first.0,
                    links.join(" -> ")
                );
                if let Some((e, v, keep)) = &ch.reduce {
                    let _ = write!(
                        out,
                        ", {:?} epilogue over the last axis -> %{}{}",
                        e.kind,
                        v.0,
                        if *keep { "" } else { " (value not kept)" }
                    );
                }
                out.push('\n');
            }
            if let Some(rf) = self.sink_to[i] {
                let _ = writeln!(
                    out,
                    "{at}: result sunk into the output block of ref %{}",
                    rf.0
                );
            }
            if let Some(rf) = self.acc_in_place[i] {
                let _ = writeln!(out, "{at}: dot accumulates in place into ref %{}", rf.0);
            }
            if self.acc_owned[i] {
                let _ = writeln!(
                    out,
                    "{at}: dot accumulates into its accumulator's buffer (its last use)"
                );
            }
            if let Some(split) = &self.split[i] {
                let refs: Vec<String> = split
                    .written
                    .iter()
                    .map(|(r, d)| format!("%{} along dim {d}", r.0))
                    .collect();
                let _ = writeln!(
                    out,
                    "{at}: iterations independent (may run on several threads); writes {}",
                    refs.join(", ")
                );
            }
            for (k, (sub, region)) in self.sub[i].iter().zip(&op.regions).enumerate() {
                let mut inner = String::new();
                sub.describe_region(region, depth + 1, &mut inner);
                if !inner.is_empty() {
                    let _ = writeln!(out, "{at}: region {k}");
                    out.push_str(&inner);
                }
            }
        }
    }

    /// Counts of what fires, over the whole function: (fused chains, ops folded, reduction epilogues,
    /// sunk results, in-place dots).
    pub(crate) fn counts(&self) -> PlanCounts {
        let mut c = PlanCounts::default();
        self.count(&mut c);
        c
    }

    fn count(&self, c: &mut PlanCounts) {
        c.chains += self.chain.iter().flatten().count();
        c.folded += self.skip.iter().filter(|s| **s).count();
        c.word_halves += self.word_half.iter().flatten().count();
        c.load_halves += self.load_halves.iter().flatten().count();
        c.halves_in_place += self
            .load_halves
            .iter()
            .flatten()
            .flatten()
            .filter(|c| c.only_dot_factor)
            .count();
        c.epilogues += self
            .chain
            .iter()
            .flatten()
            .filter(|ch| ch.reduce.is_some())
            .count();
        c.sunk += self.sink_to.iter().flatten().count();
        c.in_place_dots += self.acc_in_place.iter().flatten().count();
        c.selects_in_dots += self.select_rhs.iter().flatten().count();
        c.live_column_dots += self.live_columns.iter().flatten().count();
        c.split_loops += self.split.iter().flatten().count();
        c.scalar_ops += self.scalar.iter().filter(|s| **s).count();
        for subs in &self.sub {
            for s in subs {
                s.count(c);
            }
        }
    }
}

/// What a plan makes fire, summed over the function (`interpret::plan_counts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanCounts {
    /// The grid runs in larger row bands than written (see `coalesce`).
    pub row_bands: bool,
    /// Grid axes split into chunks run in parallel.
    pub parallel_axes: usize,
    pub chains: usize,
    pub folded: usize,
    pub epilogues: usize,
    pub sunk: usize,
    pub in_place_dots: usize,
    /// `for` loops whose iterations are independent, run across threads when the grid is not.
    pub split_loops: usize,
    /// bf16 casts of a packed word's half run as one pass (their `shl`/`and` and `bitcast` folded).
    pub word_halves: usize,
    /// Loads of packed words used only by such casts, read straight into the halves (the casts run at
    /// the load).
    pub load_halves: usize,
    /// Of those casts, the ones whose results reach only `dot` factors: read as the ref's 16-bit rows
    /// in place when they lie evenly spaced (no copy).
    pub halves_in_place: usize,
    /// `select`s that only make a `dot`'s right factor, run inside the `dot`: its rows read in place
    /// where the condition holds along a whole row and the other choice is +0 (`dot::KeepRows`).
    pub selects_in_dots: usize,
    /// `dot`s computed only in the columns a `select` reads of them (`plan::LiveColumns`).
    pub live_column_dots: usize,
    /// Constants, binary ops and comparisons of rank 0 run straight from the region loop.
    pub scalar_ops: usize,
}

fn link_label(l: &Link) -> String {
    match l {
        Link::Unary(u, d) => format!("{}:{}", u.name(), dtype_label(*d)),
        Link::Binary(b, lhs, d) => format!(
            "{}{}:{}",
            b.name(),
            if *lhs { "" } else { "(rev)" },
            dtype_label(*d)
        ),
        Link::Cast(d) => format!("cast:{}", dtype_label(*d)),
    }
}

fn dtype_label(d: DType) -> String {
    d.to_string()
}
