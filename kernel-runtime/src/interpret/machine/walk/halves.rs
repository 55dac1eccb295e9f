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
/// ([`half_in_place`]). None unless `base` holds plain 16-bit elements and every segment carries one
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
        let full = |lshift| Bits { rshift: 0, width: 16, lshift };
        if segs.iter().any(|s| s.bits != full(0) && s.bits != full(16)) {
            return Ok(None);
        }
        let src: &[u16] = raw_bits::<T, u16>(base.data::<T>()?);
        halves
            .iter()
            .map(|c| {
                if c.only_dot_factor {
                    if let Some(t) = half_in_place(base, src.len(), segs, kept, c.half) {
                        return Ok(t);
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

/// Half `half` of the window as a view of `base`'s own buffer (`len` elements), no copy: when `base`
/// is an interpreter-owned bf16 buffer (writes into it unshare it first, `Buf::make_mut`, so the view
/// keeps what it read) and the segments carrying the half place whole rows of `kept` (its last
/// dimension) at evenly spaced, increasing offsets. It differs from the cast's copy only in signaling
/// NaNs, which the cast quiets: the plan offers it only for what reaches nothing but `dot` factors
/// (`select`s pass a NaN on as it is), which quiet them alike.
fn half_in_place(
    base: &Tensor,
    len: usize,
    segs: &[Segment],
    kept: &[usize],
    half: WordHalf,
) -> Option<Tensor> {
    if base.dtype != DType::BF16 || !matches!(base.buf, Buf::Host(_)) {
        return None;
    }
    let cols = *kept.last()?;
    let rows = kept.iter().product::<usize>().checked_div(cols)?;
    let bits = Bits {
        rshift: 0,
        width: 16,
        lshift: half.shift(),
    };
    // The rows in order (segments of whole rows, in the order of the elements they place), each
    // `step` past the one before; one pass, nothing allocated.
    let (mut row, mut first, mut step) = (0, 0, cols);
    for s in segs.iter().filter(|s| s.bits == bits && s.len > 0) {
        if (s.stride != 1 && s.len > 1) || s.at != row * cols || s.len % cols != 0 {
            return None;
        }
        if s.off + s.len > len || row + s.len / cols > rows {
            return None;
        }
        for t in 0..s.len / cols {
            let at = s.off + t * cols;
            match row {
                0 => first = at,
                1 => step = at.checked_sub(first)?,
                _ if at != first + row * step => return None,
                _ => {}
            }
            row += 1;
        }
    }
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
