"""Profiles: `jax.profiler.trace` of a step of the torch model (tpu_kernel.torch layers, CPU) writes an
XProf trace; read back with `jax.profiler.ProfileData`, each of our kernels is a named event (the Rust
kernel's name, as XLA names the instruction after it) with a duration."""
import glob
import re

import jax
import torch
import torchax
from jax.profiler import ProfileData

import tpu_kernel.examples as ex
from test_torch_model import KernelMLP, TOKENS, DIM

ENV = torchax.default_env()


def hlo_op_events(xplane_path):
    """{instruction base name: [durations in ns]} of the trace's events that are HLO instructions
    (an `hlo_op` stat naming the event; XLA names instructions `<name>.<n>`)."""
    out = {}
    for plane in ProfileData.from_file(xplane_path).planes:
        for line in plane.lines:
            for ev in line.events:
                m = re.fullmatch(r"([\w-]+)\.\d+", ev.name)
                if m and dict(ev.stats).get("hlo_op") == ev.name:
                    out.setdefault(m.group(1), []).append(ev.duration_ns)
    return out


def test_a_model_step_traced_names_every_kernel_with_its_duration(tmp_path):
    torch.manual_seed(0)
    with ENV:
        model = KernelMLP().to("jax")
        x = ENV.to_xla(torch.randn(*TOKENS, DIM).to(torch.bfloat16))
        step = torchax.interop.jax_jit(lambda a: model(a))
        jax.block_until_ready(step(x).jax())  # compile outside the trace
        with jax.profiler.trace(str(tmp_path)):
            jax.block_until_ready(step(x).jax())
    (xplane,) = glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True)
    events = hlo_op_events(xplane)
    expected = {ex.rmsnorm.build(jax.ShapeDtypeStruct((256, DIM), jax.numpy.bfloat16),
                                 jax.ShapeDtypeStruct((1, DIM), jax.numpy.float32))["kernel_name"],
                ex.matmul.build(jax.ShapeDtypeStruct((256, DIM), jax.numpy.bfloat16),
                                jax.ShapeDtypeStruct((DIM, 512), jax.numpy.bfloat16))["kernel_name"]}
    assert expected == {"rmsnorm_kernel", "matmul_kernel"}  # the Rust `#[tpu_kernel]` fn names
    assert expected <= set(events), f"HLO op events in the trace: {sorted(events)}"
    assert "tpu_kernel" not in events  # the primitive's name no longer stands for every kernel
    assert len(events["matmul_kernel"]) == 2 and len(events["rmsnorm_kernel"]) == 1  # up and down projections
    assert all(d > 0 for ds in events.values() for d in ds)
