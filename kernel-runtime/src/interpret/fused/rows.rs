//! The rows of a fused chain's operands.

/// [`Rows`](crate::interpret::tensor::Rows) for a run-time number of operands.
pub(super) struct RowsN {
    outer: Vec<(usize, Vec<usize>)>,
    idx: Vec<usize>,
    off: Vec<usize>,
    cur: Vec<usize>,
    done: bool,
    /// The length and per-operand strides of the innermost (merged) axis.
    pub(super) inner: usize,
    pub(super) inner_strides: Vec<usize>,
}

impl RowsN {
    pub(super) fn new(shape: &[usize], strides: &[&[usize]], offsets: &[usize]) -> Self {
        let k = strides.len();
        let mut merged: Vec<(usize, Vec<usize>)> = Vec::new();
        for d in (0..shape.len()).rev() {
            if shape[d] == 1 {
                continue;
            }
            let s: Vec<usize> = strides.iter().map(|st| st[d]).collect();
            if let Some((mn, ms)) = merged.last_mut() {
                if (0..k).all(|j| s[j] == ms[j] * *mn) {
                    *mn *= shape[d];
                    continue;
                }
            }
            merged.push((shape[d], s));
        }
        merged.reverse();
        let (inner, inner_strides) = merged.pop().unwrap_or((1, vec![0; k]));
        RowsN {
            idx: vec![0; merged.len()],
            outer: merged,
            off: offsets.to_vec(),
            cur: offsets.to_vec(),
            done: shape.contains(&0),
            inner,
            inner_strides,
        }
    }

    /// The next row's start offsets (one per operand).
    pub(super) fn next_row(&mut self) -> Option<&[usize]> {
        if self.done {
            return None;
        }
        self.cur.copy_from_slice(&self.off);
        let mut d = self.outer.len();
        loop {
            if d == 0 {
                self.done = true;
                break;
            }
            d -= 1;
            let n = self.outer[d].0;
            self.idx[d] += 1;
            if self.idx[d] < n {
                for (o, s) in self.off.iter_mut().zip(&self.outer[d].1) {
                    *o += s;
                }
                break;
            }
            for (o, s) in self.off.iter_mut().zip(&self.outer[d].1) {
                *o -= s * (n - 1);
            }
            self.idx[d] = 0;
        }
        Some(&self.cur)
    }

    /// The one outer axis's length and per-operand strides, when the rows have exactly one.
    pub(super) fn single_outer(&self) -> Option<(usize, &[usize])> {
        match &self.outer[..] {
            [(n, s)] if !self.done => Some((*n, s)),
            _ => None,
        }
    }

    /// Leave no rows (a caller that did them all another way).
    pub(super) fn skip_all(&mut self) {
        self.done = true;
    }
}
