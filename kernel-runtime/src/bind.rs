//! Binding a kernel's compile-time parameters (Pallas's `functools.partial(kernel, eps=eps)`):
//! `pallas_call(rmsnorm_kernel.bind(eps))` for `fn rmsnorm_kernel(x: Ref<bf16>, w: Ref<f32>,
//! o: RefMut<bf16>, eps: f32)`. The values fix the kernel fn's *trailing* parameters — one value bare,
//! several as a tuple (`k.bind((eps, n))`) — and the result is a [`KernelFn`] over the leading refs
//! that keeps the Rust fn's name (the module's, the custom call's `kernel_name`).
//!
//! Which parameters are bound follows from the types alone: `Bind`'s first type parameter names the
//! kernel parameters and the whole signature, so for a given fn and value exactly one impl applies
//! (the leading parameters must be [`KernelParam`]s, the value's shape must match the trailing ones).

use crate::dtype::DType;
use crate::ir::MemSpace;
use crate::launch::{default_name, KernelFn};
use crate::trace::{KernelParam, ParamKind, Val};
use std::marker::PhantomData;

/// A kernel fn with its trailing compile-time parameters fixed: what [`Bind::bind`] returns, a
/// [`KernelFn`] over the remaining (ref) parameters. `Sig` records the split (kernel parameters, whole
/// signature) so that the impls for different splits never overlap.
pub struct BoundKernel<F, V, Sig> {
    f: F,
    values: V,
    _sig: PhantomData<fn() -> Sig>,
}

impl<F: Clone, V: Clone, Sig> Clone for BoundKernel<F, V, Sig> {
    fn clone(&self) -> Self {
        BoundKernel {
            f: self.f.clone(),
            values: self.values.clone(),
            _sig: PhantomData,
        }
    }
}

/// `kernel.bind(values)`: fix a kernel fn's trailing compile-time parameters.
#[diagnostic::on_unimplemented(
    message = "`.bind({V})` does not fit the parameters of `{Self}`",
    label = "`.bind(..)` fixes a kernel fn's trailing parameters",
    note = "declare compile-time parameters after the refs (`fn k(x: Ref<f32>, o: RefMut<f32>, eps: f32)`) and pass their values in order: one bare (`k.bind(eps)`), several as a tuple (`k.bind((eps, n))`)"
)]
pub trait Bind<Sig, V>: Sized {
    /// The kernel with its trailing parameters fixed to `values` (cloned at each trace).
    fn bind(self, values: V) -> BoundKernel<Self, V, Sig>;
}

macro_rules! bind {
    ([$($k:ident),+], [$($p:ident),+], $values:ty) => {
        impl<Func, $($k: KernelParam,)+ $($p,)+> Bind<(($($k,)+), ($($k,)+ $($p,)+)), $values> for Func
        where
            Func: Fn($($k,)+ $($p,)+),
        {
            fn bind(self, values: $values) -> BoundKernel<Self, $values, (($($k,)+), ($($k,)+ $($p,)+))> {
                BoundKernel { f: self, values, _sig: PhantomData }
            }
        }

        // Not listed among "other types implementing KernelFn" when a plain fn is not a kernel.
        #[diagnostic::do_not_recommend]
        impl<Func, $($k: KernelParam,)+ $($p: Clone,)+> KernelFn<($($k,)+)>
            for BoundKernel<Func, $values, (($($k,)+), ($($k,)+ $($p,)+))>
        where
            Func: Fn($($k,)+ $($p,)+),
        {
            fn params(&self) -> Vec<(ParamKind, DType, MemSpace)> {
                vec![$(($k::KIND, $k::DTYPE, $k::SPACE)),+]
            }
            #[allow(non_snake_case)]
            fn call(&self, args: &[Val]) {
                let mut it = args.iter().copied();
                $(let $k = $k::from_val(it.next().unwrap_or(Val::POISON));)+
                let bind!(@pattern $($p),+) = self.values.clone();
                (self.f)($($k,)+ $($p,)+)
            }
            fn kernel_name(&self) -> Option<String> {
                Some(default_name::<Func>())
            }
        }
    };
    (@pattern $p:ident) => { $p };
    (@pattern $($p:ident),+) => { ($($p,)+) };
    // One line per number of kernel parameters: one to four bound values.
    ($($k:ident),+) => {
        bind!([$($k),+], [P1], P1);
        bind!([$($k),+], [P1, P2], (P1, P2));
        bind!([$($k),+], [P1, P2, P3], (P1, P2, P3));
        bind!([$($k),+], [P1, P2, P3, P4], (P1, P2, P3, P4));
    };
}
bind!(A);
bind!(A, B);
bind!(A, B, C);
bind!(A, B, C, D);
bind!(A, B, C, D, E);
bind!(A, B, C, D, E, F);
bind!(A, B, C, D, E, F, G);
bind!(A, B, C, D, E, F, G, H);
bind!(A, B, C, D, E, F, G, H, I);
bind!(A, B, C, D, E, F, G, H, I, J);
bind!(A, B, C, D, E, F, G, H, I, J, K);
bind!(A, B, C, D, E, F, G, H, I, J, K, L);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U, V);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U, V, W);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U, V, W, X);
bind!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U, V, W, X, Y);
