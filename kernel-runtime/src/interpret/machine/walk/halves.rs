//! A window of 32-bit words over 16-bit rows read as the two bf16 arrays the word-half casts make of
//! it (the plan's `load_halves`): each half copied from the elements that fill it, never assembled
//! into words.

use super::*;
use crate::interpret::plan::WordHalf;
use half::bf16;

/// The window's 32-bit words, as `segs` assemble them from a 16-bit `base`, split into the bf16
/// `halves` the word-half casts make of them (`cast<bf16>(bitcast<f32>(w << 16))` for the low half,
/// `… (w & 0xFFFF0000)` for the high): each half copied from the elements that fill it, then rounded
/// as the cast rounds. None unless `base` holds plain 16-bit elements and every segment carries one
/// whole element into one half (anything else: the caller assembles the words).
pub(in crate::interpret::machine) fn read_halves(
    base: &Tensor,
    segs: &[Segment],
    n: usize,
    halves: &[WordHalf],
) -> Result<Option<Vec<HostData>>> {
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
            .map(|&h| {
                let mut out = crate::interpret::tensor::take_vec::<bf16>(n);
                out.resize(n, bf16::from_bits(0));
                copy_half(src, segs, h, &mut out)?;
                Ok(HostData::BF16(out))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
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
