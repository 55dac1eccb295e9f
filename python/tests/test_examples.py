"""Every example kernel through the real toolchain (issue 3, items 2a-2d):

a. our Mosaic text parses and verifies under jaxlib's registered tpu dialect, unregistered dialects off;
b. our serialized body, deserialized by jaxlib's `mosaic-serde{serialize=false}`, is our module; and it
   is exactly what jaxlib's own serializer writes for our text;
c. our StableHLO program (our backend_config inside), built for each generation (`--target`), compiles
   with libtpu for v5e, v6e and tpu7x;
d. the final LLO op count of ours is <= that of the Pallas version of the same kernel traced for the
   same generation;
e. so is the number of VLIW bundles libtpu schedules for our tpu_custom_call program (the closer proxy
   for time: fewer ops that pack into existing bundles gain nothing), and the bundle counter reads the
   figures recorded for the reference Pallas kernels.
"""
import os
import json

import pytest

import pallas_kernels
import tpu_toolchain as tc
from conftest import GENERATIONS, compiled

# Tests against a Pallas twin compiled for one device: the SPMD examples' twins are sharded programs,
# compared in test_ring_collectives.py.
SINGLE_DEVICE = ("test_pallas_emits_one_custom_call_for_every_generation", "test_llo_not_above_pallas",
                 "test_bundles_not_above_pallas")

SERIALIZED_VERSION = 15  # kernel_runtime::serialize::DEFAULT_VERSION


def our_custom_call(example):
    calls = tc.tpu_custom_calls(example.stablehlo)
    assert len(calls) == 1, f"expected one tpu_custom_call, found {len(calls)}"
    return calls[0]


# -- a
def test_mosaic_verifies_strictly(example):
    tc.verify_mosaic(example.mosaic)


# -- b
def test_body_deserializes_to_our_module(example):
    """Normalization: both sides are parsed by jaxlib and printed by its printer without locations
    (SSA names, attribute order and default-valued attributes are then canonical); nothing else."""
    body = tc.b64_body(our_custom_call(example)["config"])
    assert tc.deserialize_body(body) == tc.canonical_mosaic(example.mosaic)


def test_body_equals_jaxlib_serializer(example):
    """Our serializer (Rust) writes what jaxlib's mosaic-serde writes for the same module: same op
    names, same attributes (inherent defaults included), same version attribute."""
    body = tc.b64_body(our_custom_call(example)["config"])
    assert tc.body_generic(body) == tc.jaxlib_serialize(example.mosaic, SERIALIZED_VERSION)


def test_body_keeps_rust_locations(example):
    """The body carries each op's Rust `file:line:col`, so libtpu's diagnostics point at kernel lines."""
    body = tc.b64_body(our_custom_call(example)["config"])
    text = tc.deserialize_body(body, with_locations=True)
    assert f'"examples/{example.name}.rs":' in text


def test_stablehlo_custom_call(example):
    call = our_custom_call(example)
    attrs, cfg = call["attrs"], call["config"]
    assert attrs["api_version"] == "1 : i32"
    module_name = tc.canonical_mosaic(example.mosaic).split("module @", 1)[1].split(" ", 1)[0]
    assert attrs["kernel_name"] == f'"{module_name}"'
    cc = cfg["custom_call_config"]
    assert cc["serialization_format"] == 1 and cc["needs_layout_passes"] is True
    assert len(attrs["operand_layouts"].split("dense<")) - 1 == len(call["operand_types"])
    assert len(attrs["result_layouts"].split("dense<")) - 1 == len(call["result_types"])
    # `--emit config` is exactly the config inside `--emit stablehlo`.
    assert json.loads(example.config) == cfg


# -- per generation: what differs in the custom call
DEFAULT_SCOPED_VMEM = {"v5e": 16 << 20, "v6e": 32 << 20, "tpu7x": 32 << 20}  # kernel_runtime::target


def _config_parts(config: dict):
    """A backend_config as (custom_call_config without body and debug locations, the rest)."""
    cc = {k: v for k, v in config["custom_call_config"].items() if k not in ("body", "debug_locations")}
    return cc, {k: v for k, v in config.items() if k != "custom_call_config"}


def test_pallas_emits_one_custom_call_for_every_generation(example):
    """The evidence that a generation needs nothing else in the module or the backend_config: Pallas,
    tracing the twin for v5e, v6e and tpu7x (inside each topology's abstract mesh), writes the same
    Mosaic module and the same backend_config (its scoped VMEM limit is left to libtpu's per-generation
    default, which ours writes out: see the next test)."""
    fn, args = _pallas_twin(example.name)
    seen = {}
    for g in GENERATIONS:
        call = tc.tpu_custom_calls(tc.lower_jax_for_tpu(fn, args, g))[0]
        cc, rest = _config_parts(call["config"])
        if example.name in HAS_VMEM_LIMIT:  # the TensorCore's VMEM, which differs per generation
            rest = {k: v for k, v in rest.items() if k != "scoped_memory_configs"}
        seen[g] = (tc.deserialize_body(tc.b64_body(call["config"])), (cc, rest), call["attrs"])
        assert "scoped_memory_configs" not in call["config"] or example.name in HAS_VMEM_LIMIT
    for g in GENERATIONS[1:]:
        assert seen[g] == seen[GENERATIONS[0]], f"Pallas's {example.name} differs on {g}"


# examples whose launch sets vmem_limit_bytes: ragged paged attention takes tpu-inference's default,
# the TensorCore's whole VMEM (its twin too)
HAS_VMEM_LIMIT = {"ragged_paged_attention"}
VMEM_CAPACITY = {"v5e": 128 << 20, "v6e": 128 << 20, "tpu7x": 64 << 20}
# examples whose launch sets a vmem_limit_bytes of its own, the same on every generation: the
# all-gather matmul takes tpu-inference's estimate of its buffers plus 8 MiB
OWN_VMEM_LIMIT = {"all_gather_matmul"}


def test_ours_differ_per_generation_in_the_scoped_vmem_limit_only(example):
    """Built for each generation, our kernel keeps its body and custom_call_config, and carries the
    generation's default scoped VMEM limit (libtpu's own, which Pallas leaves implicit)."""
    calls = {g: tc.tpu_custom_calls(example.stablehlo_for(g))[0] for g in GENERATIONS}
    base = calls[GENERATIONS[0]]
    for g, call in calls.items():
        assert call["config"]["custom_call_config"] == base["config"]["custom_call_config"], g
        assert call["attrs"] == base["attrs"], g
        [scoped] = call["config"]["scoped_memory_configs"]
        if example.name in OWN_VMEM_LIMIT:
            assert scoped == base["config"]["scoped_memory_configs"][0], (g, scoped)
            assert scoped["size"] not in DEFAULT_SCOPED_VMEM.values(), scoped
            continue
        size = VMEM_CAPACITY[g] if example.name in HAS_VMEM_LIMIT else DEFAULT_SCOPED_VMEM[g]
        assert scoped == {"memory_space": 1, "offset": 0, "size": size}, (g, scoped)


# -- c
def test_compiles_for_tpu(example, generation):
    r = compiled("ours", example.name, generation, lambda: tc.compile_stablehlo(example.stablehlo_for(generation), generation))
    assert r.ok, f"libtpu rejected {example.name} for {generation}:\n{r.error}"
    assert r.n_custom_calls == 1
    assert r.llo_total, f"no post-finalize-llo dump for {example.name} ({generation})"


# -- d
def test_llo_not_above_pallas(example, generation):
    if example.name not in pallas_kernels.KERNELS:
        pytest.fail(f"no Pallas version of `{example.name}`: add it to python/tests/pallas_kernels.py", pytrace=False)
    fn, args = pallas_kernels.KERNELS[example.name]
    # Same kernel, same shapes: the Pallas custom call has our operand and result types.
    pallas_call = tc.tpu_custom_calls(tc.lower_jax_for_tpu(fn, args, generation))
    assert len(pallas_call) == 1
    ours_call = tc.tpu_custom_calls(example.stablehlo_for(generation))[0]
    assert (ours_call["operand_types"], ours_call["result_types"]) == \
        (pallas_call[0]["operand_types"], pallas_call[0]["result_types"]), "the Pallas twin has other shapes"

    ours = compiled("ours", example.name, generation, lambda: tc.compile_stablehlo(example.stablehlo_for(generation), generation))
    pallas = compiled("pallas", example.name, generation, lambda: tc.compile_jax(fn, args, generation))
    assert ours.ok, ours.error
    assert pallas.ok, pallas.error
    print(f"{example.name} {generation}: ours {ours.llo_total} LLO ops, Pallas {pallas.llo_total}")
    assert ours.llo_total <= pallas.llo_total, (
        f"{example.name} on {generation}: ours {ours.llo_total} LLO ops > Pallas {pallas.llo_total}\n"
        f"ours:   {ours.llo_counts}\npallas: {pallas.llo_counts}")


# -- e
def _pallas_twin(name):
    if name not in pallas_kernels.KERNELS:
        pytest.fail(f"no Pallas version of `{name}`: add it to python/tests/pallas_kernels.py", pytrace=False)
    return pallas_kernels.KERNELS[name]


def test_bundles_not_above_pallas(example, generation):
    """Total scheduled bundles of the tpu_custom_call program (its final VLIW schedule; a loop body
    counts once): ours <= the Pallas twin's (same operand and result types, checked by the LLO test)."""
    fn, args = _pallas_twin(example.name)
    ours = compiled("ours", example.name, generation, lambda: tc.compile_stablehlo(example.stablehlo_for(generation), generation))
    pallas = compiled("pallas", example.name, generation, lambda: tc.compile_jax(fn, args, generation))
    assert ours.ok, ours.error
    assert pallas.ok, pallas.error
    assert ours.bundles is not None, f"no final schedule of our custom call: {ours.bundles_by_program}"
    assert pallas.bundles is not None, f"no final schedule of the Pallas custom call: {pallas.bundles_by_program}"
    print(f"{example.name} {generation}: ours {ours.bundles} bundles, Pallas {pallas.bundles}")
    assert ours.bundles <= pallas.bundles, (
        f"{example.name} on {generation}: ours {ours.bundles} scheduled bundles > Pallas {pallas.bundles} "
        f"(LLO ops: ours {ours.llo_total}, Pallas {pallas.llo_total})")


# libtpu 0.0.51's "total scheduled bundles" recorded for the reference Pallas kernels
# (../shared/pallas-reference/<kernel>/bundles.json), whose shapes the twins share: (v5e, v6e; no
# tpu7x recording exists).
RECORDED_PALLAS_BUNDLES = {
    "add": (141, 150), "matmul": (212, 215), "softmax": (110, 118), "rmsnorm": (124, 130),
    "causal_mask": (87, 102), "fori_rowsum": (73, 90), "transpose": (118, 132), "colsum": (103, 120),
    "gather_prefetch": (86, 104), "dma_double": (64, 70), "inplace_scale": (169, 148),
}
# The recording summed every program of the module but the runtime's (TLP, <late-...>): for
# inplace_scale that is the custom call (93 / 98) plus the copy XLA puts in front of the aliased input,
# which the compile does not donate (76 / 50). Our `bundles` is the custom call's program alone.
RECORDED_WITH_XLA_PROGRAMS = {"inplace_scale"}


@pytest.mark.parametrize("generation", ["v5e", "v6e"])
@pytest.mark.parametrize("name", sorted(RECORDED_PALLAS_BUNDLES))
def test_bundle_counter_reads_recorded_figures(name, generation):
    """The Pallas twin's bundles as recorded for the reference kernel: a parser or file-selection
    regression (the TLP / `<late-...>` programs, another dump stage) fails here."""
    fn, args = _pallas_twin(name)
    pallas = compiled("pallas", name, generation, lambda: tc.compile_jax(fn, args, generation))
    assert pallas.ok, pallas.error
    recorded = dict(zip(("v5e", "v6e"), RECORDED_PALLAS_BUNDLES[name]))[generation]
    programs = pallas.bundles_by_program
    assert pallas.bundles is not None and pallas.bundles in programs.values(), programs
    if name in RECORDED_WITH_XLA_PROGRAMS:
        assert len(programs) == 2 and pallas.bundles < recorded, programs
        assert sum(programs.values()) == recorded, programs
    else:
        assert len(programs) == 1, programs
        assert pallas.bundles == recorded, programs


def test_total_bundles_parser():
    text = ("Schedule analysis:\n\ttotal scheduled bundles:    98\n\tempty scheduled bundles:    6\n"
            "\tnon empty scheduled bundles: 92\n")
    assert tc.total_bundles(text) == 98
    with pytest.raises(ValueError):
        tc.total_bundles("Schedule analysis:\n\tempty scheduled bundles: 6\n")
    hlo = ('  %copy.3 = f32[8,128]{1,0} copy(f32[8,128]{1,0} %p)\n'
           '  ROOT %name.1 = f32[8,128]{1,0:T(8,128)} custom-call(f32[8,128]{1,0} %copy.3), '
           'custom_call_target="tpu_custom_call", backend_config={}\n'
           '  %k.2 = f32[8,128]{1,0} custom-call(%p), custom_call_target="other"\n')
    assert tc.tpu_custom_call_names(hlo) == ["name.1"]


def test_check_command_end_to_end():
    """`cargo run --example add -- --check tpu7x`: the Rust CLI builds the kernel for tpu7x and compiles
    it for the generation's topology through libtpu from Rust (kernel_runtime::libtpu, no Python: the
    worker is the example binary itself, with no Python on PATH), and the figures it prints are the
    Python path's for the same program."""
    import re
    import subprocess
    from conftest import TARGET_DIR, cargo_build_examples
    cargo_build_examples()
    exe = str(TARGET_DIR / "debug" / "examples" / "add")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    env["TPU_LIBRARY_PATH"] = tc.libtpu_path()
    p = subprocess.run([exe, "--check", "tpu7x"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "kernel `add_kernel` on tpu7x:1x1x1" in p.stdout, p.stdout
    assert "no Python" in p.stdout, p.stdout
    for line in ("libtpu compile: ok", "VMEM: estimated", "LLO ops (post-finalize-llo): ",
                 "scheduled bundles (final schedule of the custom call): "):
        assert line in p.stdout, p.stdout
    hlo = subprocess.run([exe, "--target", "tpu7x", "--emit", "stablehlo"], capture_output=True, text=True,
                         check=True).stdout
    py = tc.compile_stablehlo(hlo, "tpu7x")
    assert py.ok, py.error
    assert f"LLO ops (post-finalize-llo): {py.llo_total} " in p.stdout, (py.summary(), p.stdout)
    assert f"custom call): {py.bundles}" in p.stdout, (py.summary(), p.stdout)
    used = re.search(r"used ([\d.]+) KiB \(libtpu\)", p.stdout)
    assert used and float(used.group(1)) == py.used_vmem_bytes / 1024, (py.summary(), p.stdout)
