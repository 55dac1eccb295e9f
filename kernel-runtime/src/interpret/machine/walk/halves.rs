//! A window of 32-bit words over 16-bit rows read as the two bf16 arrays the word-half casts make of
//! it (the plan's `load_halves`): each half copied from the elements that fill it, never assembled
//! into words.

use super::*;
use crate::interpret::plan::{HalfCast, WordHalf};
use crate::interpret::tensor::{row_major_strides, Dims};
use half::bf16;

/// The window's 32-bit words, as `segs` assemble them from a 16-bit `base`, split into the bf16
/// `halves` the word-half casts make of them (`cast<bf16>(bitcast<f32>(w << 16))` for the low half,
/// `… (w & 0xFFFF0000)` for the high), each of shape `kept` (`n` elements): each half copied from the
/// elements that fill it, then rounded as the cast rounds — or, for a cast whose result is only a
/// `dot` factor (through `select`s at most), a view of `base`'s bf16 rows in place where its rows lie
/// evenly spaced ([`half_layouts`]). None unless `base` holds plain 16-bit elements and every segment
/// carries one whole element into one half (anything else: the caller assembles the words).
pub(in crate::interpret::machine) fn read_halves(
    base: &Tensor,
    segs: &Segments,
    kept: &[usize],
    n: usize,
    halves: &[HalfCast],
) -> Result<Option<Vec<Tensor>>> {
    with_dtype!(base.dtype, T => {
        if plain_width::<T>() != Some(16) {
            return Ok(None);
        }
        // A view keeps what it read only in an interpreter-owned buffer (writes into it unshare it
        // first, `Buf::make_mut`).
        let viewable = base.dtype == DType::BF16 && matches!(base.buf, Buf::Host(_));
        let mut want = [false; 2];
        for c in halves.iter().filter(|c| c.only_dot_factor && viewable) {
            want[half_index(c.half)] = true;
        }
        let Some(layouts) = segs.half_layouts(base.buf.len(), kept, want) else {
            return Ok(None);
        };
        let src: &[u16] = raw_bits::<T, u16>(base.data::<T>()?);
        halves
            .iter()
            .map(|c| match layouts[half_index(c.half)] {
                Some(rows) if c.only_dot_factor && viewable => Ok(view_rows(base, kept, rows)),
                _ => {
                    let mut out = crate::interpret::tensor::take_vec::<bf16>(n);
                    out.resize(n, bf16::from_bits(0));
                    copy_half(src, segs, c.half, &mut out)?;
                    Ok(Tensor::from_data(kept, HostData::BF16(out)))
                }
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    })
}

/// The bits of a segment that carries one whole 16-bit element into half `half` of a word.
fn half_bits(half: WordHalf) -> Bits {
    Bits {
        rshift: 0,
        width: 16,
        lshift: half.shift(),
    }
}

/// Where a half's rows lie in the base buffer: the first row's offset and the step between rows.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RowLayout {
    first: usize,
    step: usize,
}

/// [`half_layouts`]' answer for one `(len, kept, want)`, kept with the segments it read.
pub(super) struct HalvesMemo {
    len: usize,
    kept: Dims,
    want: [bool; 2],
    layouts: Option<[Option<RowLayout>; 2]>,
}

impl Segments {
    /// [`half_layouts`] of these segments, remembered for the last `(len, kept, want)` asked (the
    /// segments never change: the same question gets the same answer).
    fn half_layouts(
        &self,
        len: usize,
        kept: &[usize],
        want: [bool; 2],
    ) -> Option<[Option<RowLayout>; 2]> {
        let mut memo = self.halves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = memo.as_ref() {
            if m.len == len && m.want == want && m.kept[..] == *kept {
                return m.layouts;
            }
        }
        let layouts = half_layouts(len, self, kept, want);
        *memo = Some(HalvesMemo {
            len,
            kept: Dims::from_slice(kept),
            want,
            layouts,
        });
        layouts
    }
}

/// One pass over the segments: None unless every one carries one whole element into one half of a
/// word; else, per half (Low, High) that is `want`ed, where its rows lie when the segments carrying it
/// place whole rows of `kept` (its last dimension) at evenly spaced, increasing offsets inside a
/// buffer of `len` elements (None for a half that is not wanted or whose rows lie otherwise).
fn half_layouts(
    len: usize,
    segs: &[Segment],
    kept: &[usize],
    want: [bool; 2],
) -> Option<[Option<RowLayout>; 2]> {
    let cols = kept.last().copied().unwrap_or(0);
    let rows = kept.iter().product::<usize>().checked_div(cols);
    // Per half: whether its rows still fit a layout, and the rows placed so far.
    let mut fits = want.map(|w| w && rows.is_some());
    let mut placed = [Placed {
        rows: 0,
        layout: RowLayout {
            first: 0,
            step: cols,
        },
    }; 2];
    for s in segs {
        let h = match s.bits {
            b if b == half_bits(WordHalf::Low) => 0,
            b if b == half_bits(WordHalf::High) => 1,
            _ => return None,
        };
        if s.len > 0 && fits[h] {
            fits[h] = placed[h].place(s, cols, len, rows.unwrap_or(0));
        }
    }
    let done = |h: usize| fits[h] && Some(placed[h].rows) == rows;
    Some([0, 1].map(|h| done(h).then_some(placed[h].layout)))
}

/// One half's rows as [`half_layouts`] places them: how many so far, and their layout.
#[derive(Clone, Copy)]
struct Placed {
    rows: usize,
    layout: RowLayout,
}

impl Placed {
    /// Places segment `s`'s rows of `cols` (nonzero) elements after those placed so far: false
    /// unless they are whole adjacent rows next in order, within `len` elements and `rows` rows,
    /// and every row lies one step after the last.
    fn place(&mut self, s: &Segment, cols: usize, len: usize, rows: usize) -> bool {
        let whole_rows = (s.stride == 1 || s.len == 1)
            && s.at == self.rows * cols
            && s.len.is_multiple_of(cols)
            && s.off + s.len <= len
            && self.rows + s.len / cols <= rows;
        if !whole_rows {
            return false;
        }
        for t in 0..s.len / cols {
            let at = s.off + t * cols;
            match self.rows {
                0 => self.layout.first = at,
                1 => match at.checked_sub(self.layout.first) {
                    Some(step) => self.layout.step = step,
                    None => return false,
                },
                r => {
                    if at != self.layout.first + r * self.layout.step {
                        return false;
                    }
                }
            }
            self.rows += 1;
        }
        true
    }
}

/// A view of `base`'s own buffer (no copy) with rows of `kept` (its last dimension) where `rows`
/// says, laid out row-major over the leading dimensions, elements adjacent. A view differs from the
/// word-half cast's copy only in signaling NaNs, which the cast quiets: the plan offers it only for
/// what reaches nothing but `dot` factors (`select`s pass a NaN on as it is), which quiet them alike.
fn view_rows(base: &Tensor, kept: &[usize], rows: RowLayout) -> Tensor {
    let mut strides: Dims = row_major_strides(&kept[..kept.len() - 1])
        .iter()
        .map(|s| s * rows.step)
        .collect();
    strides.push(1);
    Tensor {
        dtype: DType::BF16,
        shape: Dims::from_slice(kept),
        strides,
        offset: rows.first,
        buf: base.buf.clone(),
    }
}

/// Where a half's layout is kept in [`half_layouts`]' answer.
fn half_index(half: WordHalf) -> usize {
    match half {
        WordHalf::Low => 0,
        WordHalf::High => 1,
    }
}

crate::interpret::simd::multiversion! {
/// The elements of `src` the segments carrying half `half` of each word place, into `out`, each as
/// the word-half cast gives it (`WordHalf::to_bf16` of a word with the element in that half).
fn copy_half[](src: &[u16], segs: &[Segment], half: WordHalf, out: &mut [bf16]) -> Result<()> {
    let sh = half.shift();
    let bits = Bits { rshift: 0, width: 16, lshift: sh };
    let cast = |x: u16| half.to_bf16(u32::from(x) << sh);
    for s in segs.iter().filter(|s| s.bits == bits && s.len > 0) {
        if s.off + s.stride * (s.len - 1) >= src.len() || s.at + s.len > out.len() {
            return Err(internal("view read outside its ref"));
        }
        let dst = &mut out[s.at..s.at + s.len];
        match s.stride {
            0 => dst.fill(cast(src[s.off])),
            1 => dst
                .iter_mut()
                .zip(&src[s.off..s.off + s.len])
                .for_each(|(o, &x)| *o = cast(x)),
            step => dst
                .iter_mut()
                .zip(src[s.off..].iter().step_by(step))
                .for_each(|(o, &x)| *o = cast(x)),
        }
    }
    Ok(())
}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpret::plan::{HalfCast, WordHalf};

    const ROWS: usize = 4;
    const COLS: usize = 8;

    /// One segment a row: row `r` of half `half` from buffer offset `off`.
    fn row_seg(half: WordHalf, r: usize, off: usize) -> Segment {
        Segment {
            at: r * COLS,
            len: COLS,
            off,
            stride: 1,
            bits: half_bits(half),
        }
    }

    fn cast(half: WordHalf, only_dot_factor: bool) -> HalfCast {
        HalfCast {
            op: 0,
            half,
            only_dot_factor,
        }
    }

    /// Each half's rows where `offs` puts them (ordinary numbers, so a view and the cast's copy agree
    /// bit for bit): the answer is each half's rows, and a view of the base's buffer exactly for a
    /// half that reaches only `dot` factors and whose rows lie evenly spaced.
    #[test]
    fn each_half_is_a_view_exactly_when_its_rows_lie_evenly_spaced() {
        let n = 256;
        let data: Vec<bf16> = (0..n).map(|i| bf16::from_f32(i as f32 - 100.0)).collect();
        let base = Tensor::from_data(&[n][..], HostData::BF16(data.clone()));
        let even = |first: usize, step: usize| -> Vec<usize> {
            (0..ROWS).map(|r| first + r * step).collect()
        };
        let uneven = vec![0, 40, 64, 96];
        // (low rows, high rows, low only a dot factor, high only a dot factor)
        let cases = [
            (even(0, 32), even(16, 32), true, true),
            (even(8, 8), uneven.clone(), true, true),
            (uneven.clone(), even(100, 48), true, true),
            (uneven.clone(), uneven.clone(), true, true),
            (even(0, 32), even(16, 32), false, true),
            (even(0, 32), even(16, 32), true, false),
            (even(200, 0), even(64, 16), true, true),
        ];
        for (lo, hi, lo_dot, hi_dot) in cases {
            // The segments interleaved as a word window walks them: row by row, low half then high.
            let segs: Vec<Segment> = (0..ROWS)
                .flat_map(|r| {
                    [
                        row_seg(WordHalf::Low, r, lo[r]),
                        row_seg(WordHalf::High, r, hi[r]),
                    ]
                })
                .collect();
            let halves = [cast(WordHalf::Low, lo_dot), cast(WordHalf::High, hi_dot)];
            let got = read_halves(&base, &segs.into(), &[ROWS, COLS], ROWS * COLS, &halves)
                .unwrap()
                .expect("whole elements into halves");
            for ((t, rows), dot) in got.iter().zip([&lo, &hi]).zip([lo_dot, hi_dot]) {
                let want: Vec<u16> = rows
                    .iter()
                    .flat_map(|&o| data[o..o + COLS].iter().map(|x| x.to_bits()))
                    .collect();
                let bits: Vec<u16> = t
                    .to_vec::<bf16>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect();
                assert_eq!(bits, want, "{rows:?}");
                let evenly =
                    rows.windows(3).all(|w| w[1] - w[0] == w[2] - w[1]) && rows[1] >= rows[0];
                assert_eq!(
                    Buf::same(&t.buf, &base.buf),
                    dot && evenly,
                    "{rows:?} dot {dot}"
                );
            }
        }
    }

    /// A segment carrying anything but one whole element into one half: not halves at all (the
    /// caller assembles the words), whichever half it carries.
    #[test]
    fn a_segment_of_other_bits_is_not_read_as_halves() {
        let base = Tensor::from_data(&[64][..], HostData::BF16(vec![bf16::ONE; 64]));
        let mut segs: Vec<Segment> = (0..ROWS)
            .map(|r| row_seg(WordHalf::Low, r, r * COLS))
            .collect();
        segs[2].bits = Bits {
            rshift: 8,
            width: 8,
            lshift: 0,
        };
        let halves = [cast(WordHalf::Low, true), cast(WordHalf::High, true)];
        let got = read_halves(&base, &segs.into(), &[ROWS, COLS], ROWS * COLS, &halves).unwrap();
        assert!(got.is_none());
    }

    /// A window's segments remember their last layouts: every question, asked in any order and
    /// again, gets the answer a fresh pass gives (a stale answer for another buffer length, shape or
    /// wanted half would fail here).
    #[test]
    fn remembered_layouts_answer_as_a_fresh_pass_does() {
        let segs: Vec<Segment> = (0..ROWS)
            .flat_map(|r| {
                [
                    row_seg(WordHalf::Low, r, 32 * r),
                    row_seg(WordHalf::High, r, 32 * r + 16),
                ]
            })
            .collect();
        let kept = [ROWS, COLS];
        let questions = [
            (128, &kept[..], [true, true]),
            (128, &kept[..], [true, true]),
            (128, &kept[..], [false, true]),
            (100, &kept[..], [false, true]),
            (100, &[2, 16][..], [true, false]),
            (128, &kept[..], [true, true]),
        ];
        let remembered = Segments::from(segs.clone());
        for (len, kept, want) in questions {
            let fresh = half_layouts(len, &segs, kept, want);
            assert_eq!(
                remembered.half_layouts(len, kept, want),
                fresh,
                "{len} {kept:?} {want:?}"
            );
        }
        // The questions differ in their answers (else the test could not see a stale one).
        assert_ne!(
            half_layouts(128, &segs, &kept, [true, true]),
            half_layouts(100, &segs, &kept, [false, true])
        );
    }
}
