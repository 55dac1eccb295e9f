//! The ref side of a grid step: window starts (bounds-checked), loads and stores (masked, strided, into
//! a ref's block or straight into the output array), and the view writers they share with the grid.

use super::dma::Flags;
use super::*;
use crate::semantics::refs::{access_out_of_bounds, Access};
use crate::semantics::views::ViewPath;

/// A window's starts (or extents), inline up to rank 6: every load and store reads them.
type Starts = crate::semantics::dma::Dims;

impl<'k> Machine<'k> {
    /// Window starts with dynamic ones read from the op's operands, bounds-checked against the ref.
    pub(super) fn starts(&self, op: &Op, w: &Window, dyn_first: usize, r: usize) -> Result<Starts> {
        self.starts_in(op, w, dyn_first, (&self.refs[r].shape, &self.refs[r].label))
    }

    /// View `v`'s path and the starts of window `w` of a load (`write` false) or store of it:
    /// bounds-checked against the view, raced against the copies in flight over the box of the ref
    /// it reaches.
    pub(super) fn view_access_start<'v>(
        &self,
        op: &Op,
        w: &Window,
        v: &'v RefView,
        write: bool,
    ) -> Result<(std::borrow::Cow<'v, ViewPath>, Starts)> {
        let p = self.path_of_view(v);
        let (shape, _) = p.result();
        let dyn_first = if write { 2 } else { 1 };
        let starts = self.starts_in(op, w, dyn_first, (&shape, &self.refs[v.r].label))?;
        if self.dma.touches(v.r, write) {
            let extents: Starts = (0..w.sizes.len()).map(|d| w.extent(d)).collect();
            let reach = self.view_window(v, &starts, (&extents, &w.squeezed));
            self.check_dma_access(&reach, write)?;
        }
        Ok((p, starts))
    }

    /// Window starts as [`Self::starts`], checked against `shape` (a view's) and named by `label`.
    pub(super) fn starts_in(
        &self,
        op: &Op,
        w: &Window,
        dyn_first: usize,
        (shape, label): (&[usize], &str),
    ) -> Result<Starts> {
        if w.starts.len() != shape.len()
            || w.sizes.len() != shape.len()
            || w.squeezed.len() != shape.len()
            || w.strides.len() != shape.len()
        {
            return Err(internal("window rank differs from the ref rank"));
        }
        let mut next = dyn_first;
        let mut out = Starts::with_capacity(shape.len());
        for (d, s) in w.starts.iter().enumerate() {
            let start = match s {
                Start::Static(s) => *s as i64,
                Start::Dynamic => {
                    let v = op
                        .operands
                        .get(next)
                        .ok_or_else(|| internal("missing dynamic start"))?;
                    next += 1;
                    self.tensor(*v)?.scalar_i64()?
                }
            };
            let size = w.extent(d);
            if start < 0 || start as u64 + size as u64 > shape[d] as u64 {
                let access = if matches!(op.kind, OpKind::Load(_)) {
                    Access::Load
                } else {
                    Access::Store
                };
                return Err(access_out_of_bounds(access, label, (d, start, size), shape));
            }
            out.push(start as usize);
        }
        Ok(out)
    }

    pub(super) fn load(&self, op: &Op, w: &Window) -> Result<Tensor> {
        if let Some(Some(Value::View(v))) = self.env.get(op.operands[0].0 as usize) {
            return self.load_view(op, w, v);
        }
        let r = self.ref_index(op.operands[0])?;
        let starts = self.starts(op, w, 1, r)?;
        if self.dma.touches(r, false) {
            self.check_dma_access(&reach(r, &starts, w), false)?;
        }
        let st = &self.refs[r];
        // One element (an SMEM table's entry): read where it lies.
        if let (Some(t), true) = (&st.content, w.squeezed.iter().all(|&q| q)) {
            return Ok(Tensor::splat(t.literal_at(&starts)?, &[]));
        }
        let full = w.is_full(&st.shape);
        let content = self.contents(r)?;
        let window = if full {
            content
        } else {
            content.strided_window(&starts, (&w.sizes, &w.strides), &w.squeezed)
        };
        // A lent buffer is written in place later: the value is copied out now.
        Ok(match window.buf {
            Buf::Shared(_) => window.materialize()?,
            _ => window,
        })
    }

    pub(super) fn store(&mut self, op: &Op, w: &Window, masked: bool) -> Result<()> {
        if let Some(Some(Value::View(v))) = self.env.get(op.operands[0].0 as usize) {
            let v = v.clone();
            return self.store_view(op, w, masked, &v);
        }
        let r = self.ref_index(op.operands[0])?;
        if let Some(Some(Value::Sunk)) = self.env.get(op.operands[1].0 as usize) {
            // The value was computed straight into the output block.
            if let Some(old) = self.refs[r].content.take() {
                recycle(old);
            }
            self.refs[r].written_through = true;
            return Ok(());
        }
        let value = self.tensor(op.operands[1])?.clone();
        let mask = if masked {
            let m = op
                .operands
                .last()
                .ok_or_else(|| internal("masked store without a mask"))?;
            Some(self.tensor(*m)?.clone())
        } else {
            None
        };
        let starts = self.starts(op, w, 2, r)?;
        if self.dma.touches(r, true) {
            self.check_dma_access(&reach(r, &starts, w), true)?;
        }
        let window = (&starts[..], &w.sizes[..], &w.squeezed[..]);
        self.write_into(r, window, &w.strides, value, mask)
    }

    /// Ref `r`'s contents taken out as a row-major contiguous tensor from offset 0 (a copy where they
    /// are a view or were written straight into the output array; the fill value where unwritten),
    /// for a partial write; the caller puts them back.
    pub(super) fn owned_contents(&mut self, r: usize) -> Result<Tensor> {
        let (dtype, shape) = (self.refs[r].dtype, self.refs[r].shape.clone());
        Ok(match self.refs[r].content.take() {
            Some(t) if t.is_contiguous() && t.offset == 0 && t.buf.len() == t.numel() => t,
            Some(t) => t.materialize()?,
            // The block was written straight into the output array: continue from what is there
            // (the contents own the block again and are written back at the block's end).
            None if self.refs[r].written_through => {
                let t = self.contents(r)?.materialize()?;
                self.refs[r].written_through = false;
                t
            }
            None => Tensor::from_data(
                shape.clone(),
                super::super::tensor::filled(
                    fill_literal(dtype, self.poison),
                    shape.iter().product(),
                ),
            ),
        })
    }

    /// Put back ref `r`'s contents taken out by [`Self::owned_contents`]: `buf`, row-major from 0.
    pub(super) fn put_owned_contents(&mut self, r: usize, buf: Buf) {
        let st = &mut self.refs[r];
        st.content = Some(Tensor {
            dtype: st.dtype,
            strides: row_major_strides(&st.shape),
            shape: st.shape.as_slice().into(),
            offset: 0,
            buf,
        });
    }

    /// Whether ref `r`'s contents are a lent buffer ([`Buf::Shared`]), written in place.
    pub(super) fn lent(&self, r: usize) -> bool {
        matches!(
            self.refs[r].content,
            Some(Tensor {
                buf: Buf::Shared(_),
                ..
            })
        )
    }

    /// Write `value` (the window's value shape) into the window at `starts` of `sizes` (`squeezed`
    /// dimensions dropped from the value), `steps` elements apart, of ref `r`, where `mask`.
    pub(super) fn write_into(
        &mut self,
        r: usize,
        (starts, sizes, squeezed): (&[usize], &[usize], &[bool]),
        steps: &[usize],
        value: Tensor,
        mask: Option<Tensor>,
    ) -> Result<()> {
        let (dtype, shape) = (self.refs[r].dtype, self.refs[r].shape.clone());
        if !fits_window(&value, dtype, sizes, squeezed) {
            return Err(internal("stored value does not match the window"));
        }
        let full = starts.iter().all(|s| *s == 0)
            && sizes == &shape[..]
            && !squeezed.contains(&true)
            && steps.iter().all(|k| *k == 1);
        if mask.is_none() && full && !self.lent(r) {
            if let Some(old) = self.refs[r].content.replace(value) {
                recycle(old);
            }
            return Ok(());
        }
        // Partial or masked store: make the contents an owned contiguous buffer, then write the window.
        let base = self.owned_contents(r)?;
        let mut buf = base.buf;
        write_window_into(
            &mut buf,
            (dtype, &shape),
            (starts, squeezed, steps),
            &value,
            mask.as_ref(),
        )?;
        self.put_owned_contents(r, buf);
        Ok(())
    }
}

/// Write `value` (where `mask`) into the window at `starts` (`squeezed` dimensions dropped from the
/// value, elements `steps` apart) of `buf`, a contiguous row-major `dtype` array of `shape`.
pub(super) fn write_window_into(
    buf: &mut Buf,
    (dtype, shape): (DType, &[usize]),
    (starts, squeezed, steps): (&[usize], &[bool], &[usize]),
    value: &Tensor,
    mask: Option<&Tensor>,
) -> Result<()> {
    let (off, strides) = window_layout(shape, (starts, squeezed, steps));
    with_dtype!(dtype, T => {
        let dst = buf.elems_mut::<T>()?;
        write_view(dst, off, &strides, value, mask)?;
    });
    Ok(())
}

/// Whether `value` is what a window of `sizes` (`squeezed` dimensions dropped) of a `dtype` ref holds.
pub(super) fn fits_window(
    value: &Tensor,
    dtype: DType,
    sizes: &[usize],
    squeezed: &[bool],
) -> bool {
    let kept = sizes.iter().zip(squeezed).filter(|(_, s)| !**s);
    value.dtype == dtype
        && value.shape.len() == kept.clone().count()
        && kept.zip(&value.shape).all(|((n, _), m)| n == m)
}

/// Where the window at `starts` (`squeezed` dimensions dropped, elements `steps` apart) of a
/// contiguous row-major array of `shape` lies in it: its first element's offset and one stride per
/// kept dimension.
pub(super) fn window_layout(
    shape: &[usize],
    (starts, squeezed, steps): (&[usize], &[bool], &[usize]),
) -> (usize, Vec<usize>) {
    let rs = row_major_strides(shape);
    let mut off = 0;
    let mut strides = Vec::new();
    for d in 0..shape.len() {
        off += starts[d] * rs[d];
        if !squeezed[d] {
            strides.push(rs[d] * steps[d]);
        }
    }
    (off, strides)
}

/// The elements of ref `r` a window at `starts` reaches, as the DMA model sees them: a strided
/// window's whole extent (conservative: a copy into the rows it steps over is reported too).
fn reach(r: usize, starts: &[usize], w: &Window) -> RefView {
    RefView {
        r,
        starts: crate::semantics::dma::Dims::from_slice(starts),
        sizes: (0..w.sizes.len()).map(|d| w.extent(d)).collect(),
        squeezed: Flags::from_slice(&w.squeezed),
        via: None,
    }
}

/// Copy an output block out of the output array (after a written-through store).
pub(super) fn read_dest(d: &RawDest) -> Result<Tensor> {
    let reach: usize = d
        .shape
        .iter()
        .zip(&d.strides)
        .map(|(n, s)| n.saturating_sub(1) * s)
        .sum();
    if d.shape.contains(&0) || d.off + reach >= d.len {
        return Err(internal("output block outside its array"));
    }
    with_dtype!(d.dtype, T => {
        let ptr = d.ptr as *const T;
        let mut out: Vec<T> = Vec::with_capacity(d.shape.iter().product());
        for_each_row(&d.shape, [&d.strides], [d.off], |[o], n, [s]| {
            for i in 0..n {
                // SAFETY: every offset is below `off + reach < len` (checked above); the block was
                // fully written by the sunk op, and this chunk owns it exclusively.
                out.push(unsafe { ptr.add(o + i * s).read() });
            }
        });
        Ok(Tensor::from_vec(d.shape.clone(), out))
    })
}

/// Write `src` (optionally only where `mask`) into `dst` at `off` with `strides` (one per src dim).
pub(crate) fn write_view<T: HostElement>(
    dst: &mut [T],
    off: usize,
    strides: &[usize],
    src: &Tensor,
    mask: Option<&Tensor>,
) -> Result<()> {
    // SAFETY: `dst` is an exclusive slice; `write_view_raw` bounds-checks every row against its length.
    unsafe { write_view_raw(dst.as_mut_ptr(), dst.len(), off, strides, src, mask) }
}

/// One row of a copy: `n` elements of `src` from `os`, `ssrc` apart, written into `dst` from `od`,
/// `sdst` apart (a contiguous row with one `memcpy`, a broadcast one as a fill).
///
/// # Safety
/// `dst` must be valid for writes at `od + i * sdst` for every `i < n`, not overlap `src`, and no
/// other thread may touch those elements while this runs. (`src` is indexed with bounds checks.)
#[inline(always)]
pub(super) unsafe fn copy_row<T: Copy>(
    dst: *mut T,
    src: &[T],
    [od, os]: [usize; 2],
    n: usize,
    [sdst, ssrc]: [usize; 2],
) {
    match (sdst, ssrc) {
        // SAFETY: the caller's contract for `dst`.
        (1, 1) => unsafe {
            std::ptr::copy_nonoverlapping(src[os..os + n].as_ptr(), dst.add(od), n)
        },
        (1, 0) => {
            let v = src[os];
            for i in 0..n {
                // SAFETY: the caller's contract for `dst`.
                unsafe { dst.add(od + i).write(v) }
            }
        }
        (a, b) => {
            for i in 0..n {
                // SAFETY: the caller's contract for `dst`.
                unsafe { dst.add(od + i * a).write(src[os + i * b]) }
            }
        }
    }
}

/// Like [`write_view`] into a raw buffer of `len` elements.
///
/// # Safety
/// `dst` must be valid for writes of `len` elements of `T`, and no other thread may access the elements
/// this call writes while it runs (callers write disjoint blocks).
pub(crate) unsafe fn write_view_raw<T: HostElement>(
    dst: *mut T,
    len: usize,
    off: usize,
    strides: &[usize],
    src: &Tensor,
    mask: Option<&Tensor>,
) -> Result<()> {
    if strides.len() != src.shape.len() {
        return Err(internal("write rank"));
    }
    let sd = src.data::<T>()?;
    let mut err = None;
    let in_bounds = |o: usize, n: usize, s: usize| n == 0 || o + (n - 1) * s < len;
    match mask {
        None => for_each_row(
            &src.shape,
            [strides, &src.strides],
            [off, src.offset],
            |[od, os], n, [sdst, ssrc]| {
                if !in_bounds(od, n, sdst) {
                    err = Some(internal("write out of the destination"));
                    return;
                }
                // SAFETY: the row is in bounds (checked above); src and dst never alias (src is a
                // different buffer or an earlier copy, see `Machine::store`).
                unsafe { copy_row(dst, sd, [od, os], n, [sdst, ssrc]) }
            },
        ),
        Some(m) => {
            let md = m.data::<bool>()?;
            for_each_row(
                &src.shape,
                [strides, &src.strides, &m.strides],
                [off, src.offset, m.offset],
                |[od, os, om], n, [a, b, c]| {
                    if !in_bounds(od, n, a) {
                        err = Some(internal("write out of the destination"));
                        return;
                    }
                    for i in 0..n {
                        if md[om + i * c] {
                            // SAFETY: `od + i * a < len` (the row was checked in bounds above).
                            unsafe { dst.add(od + i * a).write(sd[os + i * b]) }
                        }
                    }
                },
            )
        }
    }
    err.map_or(Ok(()), Err)
}
