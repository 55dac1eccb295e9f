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
/// `dot` factor (through `select`s at most), a view of `base`'s bf16 rows in place
/// ([`halves_in_place`]). None unless `base` holds plain 16-bit elements and every segment carries one
/// whole element into one half (anything else: the caller assembles the words).
pub(in crate::interpret::machine) fn read_halves(
    base: &Tensor,
    segs: &[Segment],
    kept: &[usize],
    n: usize,
    halves: &[HalfCast],
) -> Result<Option<Vec<Tensor>>> {
    with_dtype!(base.dtype, T => {
        if plain_width::<T>() != Some(16) {
            return Ok(None);
        }
        // Every half only a `dot` factor (a KV chunk's keys and values): all of them in place, the
        // segments walked once.
        if halves.iter().all(|c| c.only_dot_factor) {
            let wanted: Vec<WordHalf> = halves.iter().map(|c| c.half).collect();
            if let Some(views) = halves_in_place(base, segs, kept, &wanted) {
                return Ok(Some(views));
            }
        }
        if segs.iter().any(|s| s.bits != half_bits(WordHalf::Low) && s.bits != half_bits(WordHalf::High)) {
            return Ok(None);
        }
        let src: &[u16] = raw_bits::<T, u16>(base.data::<T>()?);
        halves
            .iter()
            .map(|c| {
                if c.only_dot_factor {
                    if let Some(mut t) = halves_in_place(base, segs, kept, &[c.half]) {
                        return Ok(t.remove(0));
                    }
                }
                let mut out = crate::interpret::tensor::take_vec::<bf16>(n);
                out.resize(n, bf16::from_bits(0));
                copy_half(src, segs, c.half, &mut out)?;
                Ok(Tensor::from_data(kept, HostData::BF16(out)))
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

/// Halves `wanted` of the window, each a view of `base`'s own buffer, no copy: when `base` is an
/// interpreter-owned bf16 buffer (writes into it unshare it first, `Buf::make_mut`, so a view keeps
/// what it read), every segment carries one whole element into one half, and the segments carrying
/// each wanted half place whole rows of `kept` (its last dimension) at evenly spaced, increasing
/// offsets. One pass over the segments, nothing allocated but the views. A view differs from the
/// cast's copy only in signaling NaNs, which the cast quiets: the plan offers it only for what reaches
/// nothing but `dot` factors (`select`s pass a NaN on as it is), which quiet them alike.
fn halves_in_place(
    base: &Tensor,
    segs: &[Segment],
    kept: &[usize],
    wanted: &[WordHalf],
) -> Option<Vec<Tensor>> {
    if base.dtype != DType::BF16 || !matches!(base.buf, Buf::Host(_)) || wanted.len() > 2 {
        return None;
    }
    let len = base.buf.len();
    let cols = *kept.last()?;
    let rows = kept.iter().product::<usize>().checked_div(cols)?;
    // Per half (Low, High): whether it is wanted; rows placed so far, the first row's offset, the
    // step between rows.
    let want = [WordHalf::Low, WordHalf::High].map(|h| wanted.contains(&h));
    let mut state = [(0usize, 0usize, cols); 2];
    for s in segs {
        let h = match s.bits {
            b if b == half_bits(WordHalf::Low) => 0,
            b if b == half_bits(WordHalf::High) => 1,
            _ => return None,
        };
        if s.len == 0 || !want[h] {
            continue;
        }
        let (row, first, step) = &mut state[h];
        if (s.stride != 1 && s.len > 1) || s.at != *row * cols || s.len % cols != 0 {
            return None;
        }
        if s.off + s.len > len || *row + s.len / cols > rows {
            return None;
        }
        for t in 0..s.len / cols {
            let at = s.off + t * cols;
            match *row {
                0 => *first = at,
                1 => *step = at.checked_sub(*first)?,
                _ if at != *first + *row * *step => return None,
                _ => {}
            }
            *row += 1;
        }
    }
    wanted
        .iter()
        .map(|w| {
            let (row, first, step) = state[half_index(*w)];
            if row != rows {
                return None;
            }
            // Rows `step` apart, laid out row-major over the leading dimensions; elements adjacent.
            let mut strides: Dims = row_major_strides(&kept[..kept.len() - 1])
                .iter()
                .map(|s| s * step)
                .collect();
            strides.push(1);
            Some(Tensor {
                dtype: DType::BF16,
                shape: Dims::from_slice(kept),
                strides,
                offset: first,
                buf: base.buf.clone(),
            })
        })
        .collect()
}

/// Where a half's layout is kept in [`halves_in_place`]'s state.
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
