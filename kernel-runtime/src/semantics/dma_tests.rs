//! The DMA model's race checks: an access races exactly the copies in flight whose windows it
//! touches, however copies on several semaphores start and end around it.

use super::*;

/// Three refs of 8 words each, `a`, `b`, `c`, and two DMA semaphores, `sems`.
struct Three;

impl Refs for Three {
    fn label(&self, r: usize) -> &str {
        ["a", "b", "c", "sems"][r]
    }
    fn shape(&self, r: usize) -> &[usize] {
        if r == 3 {
            &[2]
        } else {
            &[8]
        }
    }
    fn blocked(&self, _: usize) -> bool {
        false
    }
    fn elem_bits(&self, _: usize) -> u32 {
        32
    }
}

/// Elements `lo..hi` of ref `r`.
fn win(r: usize, lo: usize, hi: usize) -> RefView {
    RefView {
        r,
        starts: smallvec::smallvec![lo],
        sizes: smallvec::smallvec![hi - lo],
        squeezed: smallvec::smallvec![false],
        via: None,
    }
}

/// Whether each access (ref, lo, hi, write) is reported as a race, in order.
fn races(m: &DmaModel, accesses: &[(usize, usize, usize, bool)]) -> Vec<bool> {
    accesses
        .iter()
        .map(|&(r, lo, hi, w)| m.check_access(&Three, &win(r, lo, hi), w).is_err())
        .collect()
}

#[test]
fn an_access_races_exactly_the_copies_in_flight_that_touch_it() {
    let loc = SourceLoc::caller();
    let (s0, s1) = ((3, 0), (3, 1));
    let mut m = DmaModel::new(None);
    // a[0..4] → b[0..4] on s0, a[4..8] → b[4..8] on s1.
    m.start(&Three, (win(0, 0, 4), win(1, 0, 4)), s0, None, loc)
        .unwrap();
    m.start(&Three, (win(0, 4, 8), win(1, 4, 8)), s1, None, loc)
        .unwrap();
    let probe = [
        (1, 0, 1, false), // reads a destination in flight
        (1, 7, 8, false), // the other copy's destination
        (0, 0, 8, false), // reads the sources: no race
        (0, 3, 4, true),  // writes a source in flight
        (0, 4, 5, true),  // the other copy's source
        (2, 0, 8, true),  // a ref no copy touches
    ];
    assert_eq!(races(&m, &probe), [true, true, false, true, true, false]);
    // The first copy waited for: only the second's windows race.
    assert_eq!(m.wait(&Three, s0, 16).unwrap().len(), 1);
    assert_eq!(races(&m, &probe), [false, true, false, false, true, false]);
    // c[0..4] → a[0..4] on s0: `a` is now a destination too.
    m.start(&Three, (win(2, 0, 4), win(0, 0, 4)), s0, None, loc)
        .unwrap();
    assert_eq!(
        races(
            &m,
            &[
                (0, 0, 1, false),
                (2, 0, 1, false),
                (2, 0, 1, true),
                (1, 0, 4, true)
            ]
        ),
        [true, false, true, false]
    );
    assert_eq!(m.wait(&Three, s1, 16).unwrap().len(), 1);
    assert_eq!(m.wait(&Three, s0, 16).unwrap().len(), 1);
    assert!(m.idle());
    let all: Vec<_> = (0..3)
        .flat_map(|r| [(r, 0, 8, false), (r, 0, 8, true)])
        .collect();
    assert_eq!(races(&m, &all), vec![false; 6]);
}

/// A wait for only part of the bytes outstanding on a semaphore completes nothing: every copy on it
/// still races.
#[test]
fn a_partial_wait_leaves_every_copy_on_its_semaphore_in_flight() {
    let loc = SourceLoc::caller();
    let s = (3, 0);
    let mut m = DmaModel::new(None);
    m.start(&Three, (win(0, 0, 4), win(1, 0, 4)), s, None, loc)
        .unwrap();
    m.start(&Three, (win(0, 4, 8), win(1, 4, 8)), s, None, loc)
        .unwrap();
    assert!(m.wait(&Three, s, 16).unwrap().is_empty());
    assert_eq!(
        races(&m, &[(1, 0, 1, false), (1, 7, 8, false)]),
        [true, true]
    );
    assert_eq!(m.wait(&Three, s, 16).unwrap().len(), 2);
    assert_eq!(
        races(&m, &[(1, 0, 8, true), (0, 0, 8, true)]),
        [false, false]
    );
}
