"""rhino.runtime.sources: every form of a JAX training step loads to the module that
`as_text(dialect="hlo")` gives, computing the same numbers."""

from __future__ import annotations

import collections
import gzip
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rhino.hlo.errors import ConfigError, HloParseError
from rhino.hlo.ir import Module
from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.sources import (
    InputError,
    Loaded,
    blank_locations,
    load,
    module_proto,
    sniff,
)
from tests.runtime import jax_inputs


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return jax_inputs.write_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def reference(files: dict[str, Path]) -> Loaded:
    return load(files["hlo"])


def opcodes(module: Module) -> collections.Counter[str]:
    return collections.Counter(i.opcode_text for i in module.instructions())


def run_single_device(module: Module) -> tuple[np.ndarray, ...]:
    compiled = xb.compile_spmd(
        print_module(module), xb.local_devices("cpu", 1), num_partitions=1, optimize=False
    )
    return xb.execute(compiled, jax_inputs.flat_inputs(jax_inputs.arguments()))


@pytest.mark.parametrize("kind", ["stablehlo", "stablehlo-debug", "hlo-proto"])
def test_each_kind_loads_the_module_of_the_hlo_path(
    files: dict[str, Path], reference: Loaded, kind: str
) -> None:
    loaded = load(files[kind])
    assert loaded.kind == kind.removesuffix("-debug") and loaded.converted
    assert loaded.module.instruction_count == reference.module.instruction_count
    assert len(loaded.module.computations) == len(reference.module.computations)
    assert opcodes(loaded.module) == opcodes(reference.module)
    shapes = [p.shape for p in loaded.module.entry.parameters]
    assert shapes == [p.shape for p in reference.module.entry.parameters]
    assert len(shapes) == 6
    # donation: the same input_output_alias, so rhino pairs the same state
    alias = loaded.module.attrs["input_output_alias"]
    assert alias == reference.module.attrs["input_output_alias"]
    assert [p.aliased_output for p in loaded.parameters] == [0, 1, 2, None, None, None]


def test_each_kind_computes_what_jax_computes(files: dict[str, Path], reference: Loaded) -> None:
    params, x, y, key = jax_inputs.arguments()
    new_params, value = jax.jit(jax_inputs.step)(params, x, y, key)
    expected = [*jax.tree.leaves(new_params), value]
    want = run_single_device(reference.module)
    for got, exp in zip(want, expected, strict=True):
        np.testing.assert_allclose(got, np.asarray(exp), rtol=1e-5, atol=1e-6)
    for kind in ("stablehlo", "stablehlo-debug", "hlo-proto"):
        got = run_single_device(load(files[kind]).module)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_pytree_paths_survive(files: dict[str, Path]) -> None:
    debug = load(files["stablehlo-debug"])
    assert [p.path for p in debug.parameters] == jax_inputs.PARAMETER_PATHS
    assert [o.path for o in debug.outputs] == jax_inputs.OUTPUT_PATHS
    # ... also on the HLO parameters themselves, and in their names
    kernel = debug.module.entry.parameters[1]
    assert kernel.name.startswith("params__dense____kernel__")
    assert "op_name=\"params[\\'dense\\'][\\'kernel\\']\"" in kernel.attrs["metadata"]
    # jax 0.10.2 prints no argument locations without debug_info: results only
    plain = load(files["stablehlo"])
    assert [p.path for p in plain.parameters] == [None] * 6
    assert [o.path for o in plain.outputs] == jax_inputs.OUTPUT_PATHS
    assert any("names no argument paths" in n for n in plain.notes)
    # each instruction of a module without locations names its line in the file
    dot = next(i for i in plain.module.instructions() if i.opcode_text == "dot")
    assert 'source_file="step.mlir" source_line=' in dot.attrs["metadata"]
    # an XLA-made proto carries jax's op_name metadata
    proto = load(files["hlo-proto"])
    assert [p.path for p in proto.parameters] == jax_inputs.PARAMETER_PATHS


def test_jax_op_names_are_kept(files: dict[str, Path]) -> None:
    debug = load(files["stablehlo-debug"])
    dots = [i for i in debug.module.instructions() if i.opcode_text == "dot"]
    assert dots and all("jit(step)/" in i.attrs["metadata"] for i in dots)
    assert all(i.name.startswith("dot_general") for i in dots)


def test_a_gzipped_stablehlo_file_and_the_hlo_text_path(
    files: dict[str, Path], tmp_path: Path
) -> None:
    packed = tmp_path / "step.mlir.gz"
    packed.write_bytes(gzip.compress(files["stablehlo"].read_bytes()))
    assert load(packed).kind == "stablehlo"
    hlo = load(files["hlo"])
    assert (hlo.kind, hlo.converted, hlo.notes, hlo.source) == ("hlo", False, (), str(files["hlo"]))


def _error_at(tmp_path: Path, name: str, text: str) -> HloParseError:
    bad = tmp_path / name
    bad.write_text(text)
    with pytest.raises(HloParseError) as info:
        load(bad)
    return info.value


@pytest.mark.parametrize("kind", ["stablehlo", "stablehlo-debug"])
def test_mlir_errors_point_at_the_users_file_line_and_column(
    files: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    lines = files[kind].read_text().splitlines()
    # a verifier error: the operation is located in the user's Python file in the
    # debug_info text, yet the error points into the .mlir
    n = next(i for i, t in enumerate(lines) if "broadcast_in_dim %2, dims = [0, 1]" in t)
    broken = [*lines[:n], lines[n].replace("dims = [0, 1]", "dims = [0, 5]"), *lines[n + 1 :]]
    e = _error_at(tmp_path, "verify.mlir", "\n".join(broken))
    assert (e.span.file, e.line, e.col) == (str(tmp_path / "verify.mlir"), n + 1, 10)
    assert "broadcast_dimensions contains invalid value 5" in e.message
    assert str(e).startswith(f"{tmp_path / 'verify.mlir'}:{n + 1}:10: error: ")
    # a syntax error
    m = next(i for i, t in enumerate(lines) if "stablehlo.tanh" in t)
    broken = [*lines[:m], lines[m].replace("stablehlo.tanh", "stablehlo.tanhh"), *lines[m + 1 :]]
    e = _error_at(tmp_path, "syntax.mlir", "\n".join(broken))
    assert (e.line, e.col) == (m + 1, lines[m].index("stablehlo.tanh") + 1)
    assert "'stablehlo.tanhh' is unknown" in e.message


def test_a_module_without_main_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "nomain.mlir"
    f.write_text(
        "module {\n  func.func @f(%a: tensor<f32>) -> tensor<f32> {\n    return %a : tensor<f32>\n  }\n}\n"
    )
    with pytest.raises(InputError, match=r"nomain.mlir: the module has no function @main .* @f"):
        load(f)


def _lower_sharded(shardy: bool) -> str:
    mesh = jax.make_mesh((2,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(params: dict[str, jax.Array], x: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        y = jax.lax.with_sharding_constraint(x * 2.0, NamedSharding(mesh, P("d")))
        return {"w": params["w"] - 0.1 * (x @ params["w"]).sum()}, y

    shardings = (NamedSharding(mesh, P(None, "d")), NamedSharding(mesh, P("d")))
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        lowered = jax.jit(f, donate_argnums=0, in_shardings=shardings).lower(
            {"w": np.ones((8, 4), np.float32)}, np.ones((4, 8), np.float32)
        )
        return str(lowered.as_text())
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


@pytest.mark.parametrize("shardy", [True, False], ids=["sdy", "mhlo"])
def test_shardings_are_dropped_with_a_note_and_kept_in_the_tables(
    tmp_path: Path, shardy: bool
) -> None:
    text = _lower_sharded(shardy)
    assert ("sdy.sharding" in text) == shardy and ("mhlo.sharding" in text) != shardy
    assert "jax.buffer_donor" in text  # 2 partitions, no out_shardings: XLA decides
    f = tmp_path / "sharded.mlir"
    f.write_text(text)
    loaded = load(f)
    module = loaded.module
    assert not any(
        "sharding" in i.attrs and i.opcode_text != "custom-call" for i in module.instructions()
    )
    constraint = next(i for i in module.instructions() if i.opcode_text == "custom-call")
    assert constraint.attrs["sharding"] == "{replicated}"
    note = next(n for n in loaded.notes if "dropped" in n)
    assert "2 parameter shardings" in note and "1 sharding constraint (made replicated)" in note
    given = [p.sharding for p in loaded.parameters]
    if shardy:
        assert given == ['#sdy.sharding<@mesh, [{}, {"d"}]>', '#sdy.sharding<@mesh, [{"d"}, {}]>']
    else:
        assert given == ["{devices=[1,2]<=[2]}", "{devices=[2,1]<=[2]}"]
    # the donated buffer, paired with the result of its type
    assert module.attrs["input_output_alias"] == "{ {0}: (0, {}, may-alias) }"
    assert "buffer_donor" not in module.attrs
    assert [p.aliased_output for p in loaded.parameters] == [0, None]


def test_the_dump_folder_pick(tmp_path: Path) -> None:
    jax_inputs.write_dump(tmp_path)
    loaded = load(tmp_path)
    names = [c.name for c in loaded.candidates]
    assert loaded.kind == "xla-dump" and names[0] == "jit_step"
    assert sorted(names) == ["jit__lambda", "jit_noise", "jit_step"]
    step, noise = loaded.candidates[0], next(c for c in loaded.candidates if c.name == "jit_noise")
    assert noise.instructions > step.instructions and noise.dots == 0 < step.dots
    assert loaded.source == step.file and step.file.endswith(".jit_step.before_optimizations.txt")
    assert loaded.module.name == "jit_step"
    assert sum(i.opcode_text == "dot" for i in loaded.module.instructions()) == step.dots
    assert (
        loaded.notes[0].startswith(f"{tmp_path}: read module_") and "jit_noise" in loaded.notes[0]
    )
    assert [p.path for p in loaded.parameters] == jax_inputs.PARAMETER_PATHS
    # --module, by name, number or file name
    by_name = load(tmp_path, module="jit_noise")
    assert by_name.source == noise.file and by_name.module.name == "jit_noise"
    assert load(tmp_path, module=str(noise.number)).source == noise.file
    assert load(tmp_path, module=Path(noise.file).name).source == noise.file
    with pytest.raises(ConfigError, match="no such module .* jit_noise"):
        load(tmp_path, module="jit_nope")
    # a dump of protos only reads the HloProtos
    for f in tmp_path.glob("*.before_optimizations.txt"):
        os.remove(f)
    protos = load(tmp_path)
    assert protos.source.endswith(".jit_step.before_optimizations.hlo.pb")
    assert protos.kind == "xla-dump" and protos.converted
    # (the same module; from jax 0.12 the text elides get-tuple-element instructions,
    # `%t#0`, and XLA's parser makes one per tuple and index, so counts may differ)
    assert protos.module.name == "jit_step"
    assert sum(i.opcode_text == "dot" for i in protos.module.instructions()) == step.dots


def test_bad_inputs_say_what_and_where(tmp_path: Path) -> None:
    binary = tmp_path / "garbage.bin"
    binary.write_bytes(b"\x00\x01\x02garbage\xff")
    with pytest.raises(
        InputError, match=r"garbage.bin: not HLO text, StableHLO/MLIR text or a serialized"
    ):
        load(binary)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no module_NNNN.NAME.before_optimizations.txt"):
        load(empty)
    text = tmp_path / "words.txt"
    text.write_text("hello world\n")
    with pytest.raises(HloParseError) as info:
        load(text)
    assert (info.value.line, info.value.col) == (1, 7)
    with pytest.raises(ConfigError, match="not an XLA dump folder"):
        load(text, module="jit_step")


def test_sniffing_reads_the_first_bytes_only() -> None:
    assert sniff(b"HloModule m\n") == "hlo"
    assert sniff(b"ENTRY e {\n") == "hlo"
    assert sniff(b"module @jit_f attributes {") == "stablehlo"
    assert sniff(b'  // a comment\n#loc1 = loc("x")\nmodule {') == "stablehlo"
    assert sniff(b"func.func @main() {") == "stablehlo"
    assert sniff(b"ML\xefR\x00bytecode") == "stablehlo"
    assert sniff(b"\n\x08jit_step\x12") == "hlo-proto"
    assert sniff("HloModule é".encode() * 2000) == "hlo"  # a character cut at 4 KiB


def test_an_hlo_proto_is_unwrapped_only_when_it_holds_a_module() -> None:
    module = b"\n\x08jit_step\x12\x07main.12"
    assert module_proto(module) == module  # field 1 is the name
    wrapped = b"\n" + bytes([len(module)]) + module + b"\x1a\x02ab"
    assert module_proto(wrapped) == module  # field 1 is the module
    assert module_proto(b"\n\xff") == b"\n\xff"  # a cut varint: left as is


TUPLE_OPERANDS = """HloModule m, entry_computation_layout={(f32[4]{0}, f32[4]{0})->f32[4]{0}}

ENTRY e {
  %a = f32[4]{0} parameter(0)
  %b = f32[4]{0} parameter(1)
  %t = (f32[4]{0}, f32[4]{0}) tuple(%a, %b)
  ROOT %s = f32[4]{0} add(%t#0, %t#1)
}
"""


def test_tuple_element_operands_are_re_printed_where_xla_reads_them(tmp_path: Path) -> None:
    """jax 0.12's XLA dumps print `%t#0` for element 0 of tuple t; its own parser
    re-prints them as get-tuple-element instructions. jax 0.10.2's XLA reads no such
    operand: rhino's parse error stands."""
    f = tmp_path / "module_0001.jit_f.before_optimizations.txt"
    f.write_text(TUPLE_OPERANDS)
    try:
        xb.xla_parse(TUPLE_OPERANDS)
    except xb.XlaRejected:
        with pytest.raises(HloParseError) as info:
            load(f)
        assert (info.value.line, info.value.col) == (7, 29)
        return
    loaded = load(f)
    assert loaded.converted and "re-printed by XLA's parser" in loaded.notes[0]
    gtes = [i for i in loaded.module.instructions() if i.opcode_text == "get-tuple-element"]
    assert len(gtes) == 2 and loaded.module.entry.root.operands == gtes


def test_blank_locations_keeps_every_line_and_column() -> None:
    text = (
        "#loc1 = loc(\"params['w']\")\n"
        "%0 = stablehlo.add %a, %b : tensor<f32> loc(#loc12)\n"
        '%1 = "x.alloc(3)" loc(callsite("jit(f)/add"("f.py":3:4) at #loc1))\n'
    )
    blank = blank_locations(text)
    assert [len(t) for t in blank.splitlines()] == [len(t) for t in text.splitlines()]
    assert "loc" not in blank.replace("alloc", "")
    assert blank.splitlines()[1].rstrip() == "%0 = stablehlo.add %a, %b : tensor<f32>"
    assert blank.splitlines()[2].rstrip() == '%1 = "x.alloc(3)"'


def test_older_jax_arg_info_names_the_parameter(tmp_path: Path) -> None:
    f = tmp_path / "old.mlir"
    f.write_text(
        "module @jit_f {\n"
        "  func.func public @main(%arg0: tensor<4xf32> {jax.arg_info = \"args[0]['w']\", "
        'mhlo.sharding = "{replicated}"}) -> (tensor<4xf32> {jax.result_info = ""}) {\n'
        "    %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>\n"
        "    return %0 : tensor<4xf32>\n  }\n}\n"
    )
    loaded = load(f)
    (param,) = loaded.parameters
    assert (param.path, param.sharding) == ("args[0]['w']", "{replicated}")
    (inst,) = loaded.module.entry.parameters
    assert inst.name.startswith("args_0___w__")
    assert "op_name=\"args[0][\\'w\\']\"" in inst.attrs["metadata"]
    assert "sharding" not in inst.attrs


@pytest.mark.parametrize("shardy", [True, False], ids=["sdy", "mhlo"])
def test_a_shard_map_is_refused_where_it_is(tmp_path: Path, shardy: bool) -> None:
    mesh = jax.make_mesh((2,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(x: jax.Array) -> jax.Array:
        return jax.shard_map(lambda a: a * 2.0, mesh=mesh, in_specs=P("d"), out_specs=P("d"))(x)

    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        text = jax.jit(f).lower(np.ones(4, np.float32)).as_text()
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)
    lines = text.splitlines()
    marker = "sdy.manual_computation" if shardy else "@SPMDFullToShardShape"
    line = next(i for i, t in enumerate(lines) if marker in t) + 1
    e = _error_at(tmp_path, "shard_map.mlir", text)
    assert e.line == line and "a shard_map (manual computation) is in the module" in e.message


def test_mlir_bytecode_is_stablehlo(tmp_path: Path, reference: Loaded) -> None:
    f = tmp_path / "step.mlirbc"
    lowered = jax.jit(jax_inputs.step, donate_argnums=0).lower(*jax_inputs.arguments())
    with f.open("wb") as out:
        lowered.compiler_ir().operation.write_bytecode(out)
    loaded = load(f)
    assert loaded.kind == "stablehlo"
    assert loaded.module.instruction_count == reference.module.instruction_count
    assert [p.path for p in loaded.parameters] == jax_inputs.PARAMETER_PATHS  # locations kept
