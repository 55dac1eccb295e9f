//! The segments a window of a view walks to, kept for the windows a run reads again
//! ([`SegmentCache`]), each with what [`read_halves`](super::read_halves) found of them.

use super::halves::HalvesMemo;
use super::{Segment, Walk};
use crate::error::Result;
use crate::semantics::views::ViewPath;

/// A window's segments as the [`SegmentCache`] keeps them, with what [`read_halves`] last found of
/// where their word halves' rows lie (a loop reading the same window again gets the same answer).
pub(in crate::interpret::machine) struct Segments {
    pub(super) list: Box<[Segment]>,
    pub(super) halves: std::sync::Mutex<Option<HalvesMemo>>,
}

impl From<Vec<Segment>> for Segments {
    fn from(list: Vec<Segment>) -> Segments {
        Segments {
            list: list.into(),
            halves: Default::default(),
        }
    }
}

impl std::ops::Deref for Segments {
    type Target = [Segment];
    fn deref(&self) -> &[Segment] {
        &self.list
    }
}

/// The segments of the view windows a run read or wrote lately, so that a loop reading the same
/// window of the same view again (each sequence's key rows of a KV buffer slot) walks the path once.
/// An entry is keyed by everything [`Walk::window`]'s answer depends on: the path, the ref buffer's
/// strides and offset, and the window; a hit gives the same segments the walk would.
/// One cache serves a machine and the machines it forks for a split loop's iterations (`split.rs`),
/// which read the same windows: it is shared between threads, locked only to look up and to insert.
#[derive(Default)]
pub(in crate::interpret) struct SegmentCache {
    entries: std::sync::Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    kept: Vec<(SegmentKey, std::sync::Arc<Segments>)>,
    next: usize,
}

struct SegmentKey {
    path: ViewPath,
    base: (Vec<usize>, usize),
    window: (Vec<usize>, Vec<usize>, Vec<bool>),
    steps: Vec<usize>,
}

/// Entries kept (a kernel's hot loop touches a few views; each entry holds one window's segments).
const CACHED_WINDOWS: usize = 32;

impl SegmentCache {
    /// The segments of `window` (`steps` apart) of view `p` over a buffer at `offset` with
    /// `strides`: from the cache, else walked (and kept).
    pub(in crate::interpret::machine) fn window(
        &self,
        p: &ViewPath,
        (strides, offset): (&[usize], usize),
        window: (&[usize], &[usize], &[bool]),
        steps: &[usize],
    ) -> Result<std::sync::Arc<Segments>> {
        let hit = |k: &SegmentKey| {
            k.base.1 == offset
                && k.base.0 == strides
                && k.window.0 == window.0
                && k.window.1 == window.1
                && k.window.2 == window.2
                && k.steps == steps
                && k.path == *p
        };
        let lock = || self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, segs)) = lock().kept.iter().find(|(k, _)| hit(k)) {
            return Ok(segs.clone());
        }
        let segs = std::sync::Arc::new(Segments::from(
            Walk::new(p, strides, offset).window(window, steps)?,
        ));
        let key = SegmentKey {
            path: p.clone(),
            base: (strides.to_vec(), offset),
            window: (window.0.to_vec(), window.1.to_vec(), window.2.to_vec()),
            steps: steps.to_vec(),
        };
        let mut e = lock();
        if e.kept.len() < CACHED_WINDOWS {
            e.kept.push((key, segs.clone()));
        } else {
            let at = e.next % CACHED_WINDOWS;
            e.kept[at] = (key, segs.clone());
            e.next = at + 1;
        }
        Ok(segs)
    }
}
