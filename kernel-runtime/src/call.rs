//! What XLA receives for a built kernel, on the public API: [`PallasCall::custom_call`] (the
//! `tpu_custom_call` with its serialized body and backend_config, options adjustable) and
//! [`PallasCall::stablehlo`] (a complete StableHLO program calling it).

use crate::error::Result;
use crate::launch::PallasCall;
use crate::serialize::{CallOptions, CustomCall};

impl PallasCall {
    /// The kernel as XLA's `tpu_custom_call` (what `pallas_call` lowers to on TPU): its serialized
    /// Mosaic body, its backend_config JSON and a StableHLO program, with the default [`CallOptions`].
    ///
    /// ```
    /// use kernel_runtime::trace::{Ref, RefMut};
    /// use kernel_runtime::{dtype::F32, pallas_call, ArrayType, BlockSpec};
    ///
    /// let call = pallas_call(|x: Ref<f32>, o: RefMut<f32>| o.store(x.load() * 2.0))
    ///     .name("double")
    ///     .grid([2])
    ///     .input(ArrayType::new([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
    ///     .output(ArrayType::new([16, 128], F32), BlockSpec::new([8, 128], |[i]| (i, 0)))
    ///     .build()?;
    /// let custom_call = call.custom_call();
    /// let config = custom_call.backend_config()?;
    /// assert!(config.contains("\"custom_call_config\""));
    /// assert!(!custom_call.body()?.is_empty());
    /// # Ok::<(), kernel_runtime::KernelError>(())
    /// ```
    pub fn custom_call(&self) -> CustomCall<'_> {
        CustomCall::new(&self.kernel)
    }

    /// [`PallasCall::custom_call`] with options (input/output aliases, compiler flags, the
    /// `stable_mosaic` version, ...).
    pub fn custom_call_with(&self, options: CallOptions) -> CustomCall<'_> {
        CustomCall::with_options(&self.kernel, options)
    }

    /// A complete StableHLO module whose `@main` calls the kernel through `stablehlo.custom_call
    /// @tpu_custom_call` (what `--emit stablehlo` prints; libtpu compiles it for any TPU topology).
    ///
    /// ```
    /// use kernel_runtime::trace::{Ref, RefMut};
    /// use kernel_runtime::{dtype::F32, pallas_call, ArrayType, BlockSpec};
    ///
    /// let call = pallas_call(|x: Ref<f32>, o: RefMut<f32>| o.store(x.load().exp()))
    ///     .name("exp")
    ///     .grid([1])
    ///     .input(ArrayType::new([8, 128], F32), BlockSpec::new([8, 128], |[_]| (0, 0)))
    ///     .output(ArrayType::new([8, 128], F32), BlockSpec::new([8, 128], |[_]| (0, 0)))
    ///     .build()?;
    /// let hlo = call.stablehlo()?;
    /// assert!(hlo.contains("func.func public @main"));
    /// assert!(hlo.contains(r#"call_target_name = "tpu_custom_call""#));
    /// # Ok::<(), kernel_runtime::KernelError>(())
    /// ```
    pub fn stablehlo(&self) -> Result<String> {
        self.custom_call().stablehlo()
    }
}
