//! The walk against the plain path: reads against running the path forward over the whole ref
//! and cutting the window; writes against writing the window into the last stage, materialized,
//! and carrying every stage back (the window written into the stage before it, reshapes undone,
//! bitcasts undone) — on views of every step kind and random windows, strided and squeezed.
use super::super::refs::write_window_into;
use super::super::views::{bitcast_rows, forward};
use super::*;

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn random_tensor(rng: &mut Rng, shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let data = with_dtype!(dtype, T => {
        T::wrap((0..n).map(|_| T::from_literal_bits(rng.next() & ones(dtype.bit_width()))).collect())
    });
    Tensor::from_data(shape, data)
}

fn bits_of(t: &Tensor) -> Vec<u64> {
    with_dtype!(t.dtype, T => {
        t.to_vec::<T>().unwrap().into_iter().map(|x| x.literal().bits & ones(t.dtype.bit_width())).collect()
    })
}

fn window_of(sizes: &[usize], starts: &[usize], squeezed: &[bool]) -> ViewStep {
    ViewStep::Window {
        starts: starts.into(),
        sizes: sizes.into(),
        squeezed: squeezed.into(),
    }
}

/// The views tested: (ref shape, ref dtype, steps).
fn paths() -> Vec<(Vec<usize>, DType, Vec<ViewStep>)> {
    use DType::*;
    vec![
        // RPA's KV buffer: bf16 pairs as u32 words, one slot, token-major rows.
        (
            vec![2, 8, 4, 2, 16],
            BF16,
            vec![
                ViewStep::Bitcast(U32),
                window_of(
                    &[1, 8, 4, 1, 16],
                    &[1, 0, 0, 0, 0],
                    &[true, false, false, false, false],
                ),
                ViewStep::Reshape(smallvec::smallvec![32, 16]),
            ],
        ),
        // Wide words read as narrow halves, a window of them, a reshape changing the last dim.
        (
            vec![3, 4, 8],
            U32,
            vec![
                ViewStep::Bitcast(BF16),
                window_of(&[2, 6, 8], &[1, 1, 0], &[false; 3]),
                ViewStep::Reshape(smallvec::smallvec![2, 3, 16]),
            ],
        ),
        // Four i8 rows to one u32, then back to i8 through a window.
        (
            vec![2, 8, 8],
            I8,
            vec![
                ViewStep::Bitcast(U32),
                ViewStep::Bitcast(I8),
                window_of(&[1, 6, 8], &[1, 2, 0], &[true, false, false]),
            ],
        ),
        // A reshape of a strided window (the forward walk copies here), last dim changed.
        (
            vec![4, 6, 8],
            F32,
            vec![
                window_of(&[3, 4, 8], &[1, 1, 0], &[false; 3]),
                ViewStep::Reshape(smallvec::smallvec![3, 32]),
                ViewStep::Reshape(smallvec::smallvec![6, 2, 8]),
            ],
        ),
        // A window squeezing the last dimension, then a same-width bitcast.
        (
            vec![5, 6, 4],
            I32,
            vec![
                window_of(&[5, 6, 1], &[0, 0, 2], &[false, false, true]),
                ViewStep::Bitcast(F32),
            ],
        ),
        // Narrow rows through a same-width bitcast and a reshape to rank 1 and back.
        (
            vec![4, 2, 8],
            BF16,
            vec![
                ViewStep::Bitcast(F16),
                ViewStep::Reshape(smallvec::smallvec![64]),
                ViewStep::Reshape(smallvec::smallvec![8, 8]),
                ViewStep::Bitcast(U32),
            ],
        ),
    ]
}

/// A random window of a `shape` view: (starts, sizes, squeezed, steps).
#[allow(clippy::type_complexity)]
fn random_window(
    rng: &mut Rng,
    shape: &[usize],
) -> (Vec<usize>, Vec<usize>, Vec<bool>, Vec<usize>) {
    let (mut starts, mut sizes, mut squeezed, mut steps) = (vec![], vec![], vec![], vec![]);
    for &n in shape {
        let step = 1 + rng.below(3);
        let start = rng.below(n);
        let fit = (n - start).div_ceil(step);
        let size = 1 + rng.below(fit);
        let squeeze = size == 1 && rng.below(2) == 0;
        starts.push(start);
        sizes.push(size);
        squeezed.push(squeeze);
        steps.push(step);
    }
    (starts, sizes, squeezed, steps)
}

/// The reference write: every stage materialized, the window written into the last, carried back.
fn write_by_stages(
    base: &Tensor,
    steps_of_path: &[ViewStep],
    (starts, squeezed, steps): (&[usize], &[bool], &[usize]),
    value: &Tensor,
    mask: &Tensor,
) -> Tensor {
    let mut stages = vec![base.materialize().unwrap()];
    for s in steps_of_path {
        let next = forward(stages.last().unwrap(), s)
            .unwrap()
            .materialize()
            .unwrap();
        stages.push(next);
    }
    let mut cur = stages.pop().unwrap();
    let shape = cur.shape.to_vec();
    write_window_into(
        &mut cur.buf,
        (cur.dtype, &shape),
        (starts, squeezed, steps),
        value,
        Some(mask),
    )
    .unwrap();
    for (s, mut before) in steps_of_path.iter().zip(stages).rev() {
        cur = match s {
            ViewStep::Window {
                starts, squeezed, ..
            } => {
                let shape = before.shape.to_vec();
                let ones = vec![1; starts.len()];
                write_window_into(
                    &mut before.buf,
                    (before.dtype, &shape),
                    (starts, squeezed, &ones),
                    &cur,
                    None,
                )
                .unwrap();
                before
            }
            ViewStep::Bitcast(_) => bitcast_rows(&cur, before.dtype).unwrap(),
            ViewStep::Reshape(_) => cur.reshape(&before.shape).unwrap(),
        };
    }
    cur
}

#[test]
fn reads_and_writes_agree_with_the_plain_path() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for (shape, dtype, steps_of_path) in paths() {
        let mut p = ViewPath::new(&shape, dtype);
        p.steps = steps_of_path.clone();
        let (vshape, vdtype) = p.result();
        for case in 0..40 {
            let base = if case % 8 == 7 {
                // An unwritten ref: its fill value broadcast (zero strides).
                let one = random_tensor(&mut rng, &[1], dtype);
                Tensor::splat(one.literal().unwrap(), &shape)
            } else {
                random_tensor(&mut rng, &shape, dtype)
            };
            let (starts, sizes, squeezed, steps) = random_window(&mut rng, &vshape);
            let window = (&starts[..], &sizes[..], &squeezed[..]);
            let kept = kept_sizes(&sizes, &squeezed);
            let n: usize = kept.iter().product();
            let walk = Walk::new(&p, &base.strides, base.offset);
            let segs = walk.window(window, &steps).unwrap();

            // Read.
            let got = Tensor::from_data(&kept, read(&base, &segs, vdtype, n).unwrap());
            let got = bits_of(&got);
            let mut view = base.clone();
            for s in &steps_of_path {
                view = forward(&view, s).unwrap();
            }
            let want = bits_of(&view.strided_window(&starts, (&sizes, &steps), &squeezed));
            assert_eq!(
                got, want,
                "read: {steps_of_path:?} case {case} window {window:?} steps {steps:?}"
            );

            // Masked write.
            let value = random_tensor(&mut rng, &kept, vdtype);
            let mask = Tensor::from_vec(
                &kept,
                (0..n).map(|_| rng.below(4) != 0).collect::<Vec<bool>>(),
            );
            let want = write_by_stages(
                &base,
                &steps_of_path,
                (&starts, &squeezed, &steps),
                &value,
                &mask,
            );
            // Writes go to the contents made owned and row-major (`owned_contents`).
            let mut got = base.materialize().unwrap();
            let owned = Walk::new(&p, &row_major_strides(&shape), 0);
            let segs = owned.window(window, &steps).unwrap();
            let keep: Vec<u64> = mask
                .to_vec::<bool>()
                .unwrap()
                .into_iter()
                .map(|b| if b { u64::MAX } else { 0 })
                .collect();
            write(&mut got, &segs, (&bits_of(&value), Some(&keep))).unwrap();
            assert_eq!(
                bits_of(&got),
                bits_of(&want),
                "write: {steps_of_path:?} case {case} window {window:?} steps {steps:?}"
            );
            // No mask writes what an all-true mask writes.
            let all = Tensor::from_vec(&kept, vec![true; n]);
            let want = write_by_stages(
                &base,
                &steps_of_path,
                (&starts, &squeezed, &steps),
                &value,
                &all,
            );
            let mut got = base.materialize().unwrap();
            write(&mut got, &segs, (&bits_of(&value), None)).unwrap();
            assert_eq!(
                bits_of(&got),
                bits_of(&want),
                "unmasked write: {steps_of_path:?} case {case} window {window:?} steps {steps:?}"
            );
        }
    }
}

/// The segment cache answers what the walk answers: every path × random windows over buffers at two
/// offsets and two stride layouts, asked through one cache (small, so entries are evicted and
/// asked again) in an order that repeats keys and interleaves near-identical ones.
#[test]
fn the_segment_cache_gives_the_walks_segments() {
    let mut rng = Rng(0x5E6_CAC4E);
    let cache = SegmentCache::default();
    let mut asked = Vec::new();
    for (shape, dtype, steps_of_path) in paths() {
        let mut p = ViewPath::new(&shape, dtype);
        p.steps = steps_of_path;
        let (vshape, _) = p.result();
        let strides = row_major_strides(&shape).to_vec();
        // A second layout: the same shape inside a buffer whose rows are padded.
        let mut padded = strides.clone();
        if let Some(r) = shape.len().checked_sub(2) {
            for (d, s) in padded.iter_mut().enumerate() {
                if d <= r {
                    *s += *s / shape[shape.len() - 1].max(1);
                }
            }
        }
        for _ in 0..12 {
            let w = random_window(&mut rng, &vshape);
            for layout in [&strides, &padded] {
                for offset in [0, 3] {
                    asked.push((p.clone(), layout.clone(), offset, w.clone()));
                }
            }
        }
    }
    for round in 0..3 {
        for i in 0..asked.len() {
            // Round 1 walks the list backwards, round 2 strides through it: other eviction orders.
            let k = match round {
                0 => i,
                1 => asked.len() - 1 - i,
                _ => (i * 7) % asked.len(),
            };
            let (p, strides, offset, (starts, sizes, squeezed, steps)) = &asked[k];
            let window = (&starts[..], &sizes[..], &squeezed[..]);
            let want = Walk::new(p, strides, *offset)
                .window(window, steps)
                .unwrap();
            let got = cache.window(p, (strides, *offset), window, steps).unwrap();
            assert_eq!(&got[..], &want[..], "round {round} entry {k}");
        }
    }
}
