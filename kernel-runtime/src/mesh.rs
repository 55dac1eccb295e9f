//! The device mesh a kernel runs over (`jax.sharding.Mesh` as `jax.shard_map` sees it): named axes
//! with sizes, devices numbered row-major over them — the numbering of `tpu.device_id` and of the
//! logical device ids Pallas computes from mesh coordinates (`device_id=(x, y)`: `x * size_y + y`).
//!
//! A launch knows its mesh from `.mesh(..)` on the builder, else from [`Mesh::scope`] (an exported
//! kernel's request inside `jax.shard_map`); `axis_index`, `axis_size` and remote device ids in the
//! body are traced against it.

use crate::error::{kerr, Result};
use std::cell::RefCell;

/// Named mesh axes with their sizes, major to minor (`Mesh::new([("x", 2), ("y", 4)])`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
}

thread_local! {
    static SCOPED: RefCell<Option<Mesh>> = const { RefCell::new(None) };
}

impl Mesh {
    /// A mesh of the named axes with their sizes, major to minor. An error for no axis, an empty
    /// or repeated name, or a size of 0.
    pub fn new<S: AsRef<str>>(axes: impl IntoIterator<Item = (S, usize)>) -> Result<Mesh> {
        let axes: Vec<(String, usize)> = axes
            .into_iter()
            .map(|(n, s)| (n.as_ref().to_string(), s))
            .collect();
        if axes.is_empty() {
            return Err(kerr!(
                Grid,
                "a mesh needs at least one axis, e.g. `Mesh::new([(\"x\", 4)])`"
            ));
        }
        for (i, (name, size)) in axes.iter().enumerate() {
            if name.trim().is_empty() {
                return Err(kerr!(Grid, "mesh axis {i} has an empty name"));
            }
            if axes[..i].iter().any(|(n, _)| n == name) {
                return Err(kerr!(Grid, "mesh axis {name:?} is named twice"));
            }
            if *size == 0 {
                return Err(kerr!(Grid, "mesh axis {name:?} has size 0"));
            }
        }
        let devices = axes.iter().try_fold(1usize, |n, (_, s)| {
            n.checked_mul(*s).filter(|n| *n <= i32::MAX as usize)
        });
        if devices.is_none() {
            return Err(kerr!(
                Grid,
                "a mesh of {axes:?} has more devices than an i32 numbers"
            ));
        }
        Ok(Mesh { axes })
    }

    /// The axes with their sizes, major to minor.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// How many devices the mesh holds.
    pub fn devices(&self) -> usize {
        self.axes.iter().map(|(_, s)| s).product()
    }

    /// Axis `name`: its position, size and stride in the row-major device numbering; an error
    /// listing the mesh's axes otherwise.
    pub fn axis(&self, name: &str) -> Result<(usize, usize, usize)> {
        let pos = self
            .axes
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| {
                kerr!(
                    Grid,
                    "no mesh axis {name:?}: the mesh is {}",
                    self.describe()
                )
            })?;
        Ok((pos, self.axes[pos].1, self.strides()[pos]))
    }

    /// The row-major stride of each axis.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.axes.len()];
        for i in (0..self.axes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.axes[i + 1].1;
        }
        strides
    }

    /// Device `id`'s coordinates, one per axis.
    pub fn coords(&self, id: usize) -> Vec<usize> {
        self.strides()
            .iter()
            .zip(&self.axes)
            .map(|(st, (_, s))| (id / st) % s)
            .collect()
    }

    /// `{x: 2, y: 4}`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self.axes.iter().map(|(n, s)| format!("{n}: {s}")).collect();
        format!("{{{}}}", parts.join(", "))
    }

    /// The mesh in scope ([`Mesh::scope`]), if any.
    pub fn current() -> Option<Mesh> {
        SCOPED.with(|s| s.borrow().clone())
    }

    /// Run `f` with `self` as the mesh of every launch it builds without `.mesh(..)`: how an exported
    /// kernel called inside `jax.shard_map` learns the mesh (as Pallas reads the axis environment).
    pub fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        struct Restore(Option<Mesh>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let m = self.0.take();
                SCOPED.with(|s| *s.borrow_mut() = m);
            }
        }
        let _restore = Restore(SCOPED.with(|s| s.borrow_mut().replace(self)));
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_numbered_row_major() {
        let m = Mesh::new([("x", 2), ("y", 3)]).unwrap();
        assert_eq!(m.devices(), 6);
        assert_eq!(m.strides(), vec![3, 1]);
        assert_eq!(m.axis("y").unwrap(), (1, 3, 1));
        assert_eq!(m.coords(5), vec![1, 2]);
        assert!(m.axis("z").unwrap_err().message.contains("{x: 2, y: 3}"));
        assert!(Mesh::new([("x", 2), ("x", 2)]).is_err());
        assert!(Mesh::new([("x", 0)]).is_err());
        assert!(Mesh::new(Vec::<(&str, usize)>::new()).is_err());
    }
}
