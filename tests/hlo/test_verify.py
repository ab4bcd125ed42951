from __future__ import annotations

import pytest

from rhino.hlo.errors import HloVerifyError
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_file, parse_module
from rhino.hlo.shape import array_shape
from rhino.hlo.verify import verify
from tests.hlo.corpus import corpus_files, corpus_ids

HEAD = (
    "HloModule m\n\nENTRY e {\n  a = f32[4,8]{1,0} parameter(0)\n  b = f32[8,2]{1,0} parameter(1)\n"
)


@pytest.mark.parametrize("path", corpus_files(), ids=corpus_ids())
def test_corpus_verifies(path) -> None:
    verify(parse_file(path))


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            "  ROOT d = f32[4,3]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n",
            "does not match the expected dims [4, 2]",
        ),
        (
            "  ROOT d = f32[4,2]{1,0} dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}\n",
            "lhs dim 0 and rhs dim 0 are paired but have different sizes",
        ),
        ("  ROOT t = f32[4,8]{1,0} transpose(a), dimensions={1,0}\n", "expected dims [8, 4]"),
        ("  ROOT r = f32[5,6]{1,0} reshape(a)\n", "32 elements"),
        ("  ROOT x = f32[4,8]{1,0} add(a)\n", "add takes 2 operands, got 1"),
        ("  ROOT x = f32[4,8]{1,0} add(a, b)\n", "operand %b has dims [8, 2]"),
        ("  ROOT x = f32[4,8,3]{2,1,0} broadcast(a), dimensions={0,2}\n", "operand dim 1 (size 8)"),
        ("  ROOT s = f32[2,8]{1,0} slice(a), slice={[0:2], [0:9]}\n", "out of bounds"),
    ],
)
def test_verify_reports_the_instruction_and_neighbours(body: str, fragment: str) -> None:
    module = parse_module(HEAD + body + "}\n", "v.hlo")
    with pytest.raises(HloVerifyError) as info:
        verify(module)
    message = str(info.value)
    assert fragment in message
    assert "(v.hlo:" in message  # where it came from
    assert ">>" in message  # the failing line, shown among its neighbours


def test_parameter_numbers_must_be_dense() -> None:
    module = parse_module(
        HEAD + "  c = f32[] parameter(3)\n  ROOT x = f32[4,8]{1,0} negate(a)\n}\n"
    )
    with pytest.raises(
        HloVerifyError, match=r"computation e: parameter numbers \[0, 1, 3\] are not 0..2"
    ):
        verify(module)


def test_use_before_definition_in_built_ir() -> None:
    comp = Computation("e", is_entry=True)
    shape = array_shape("f32", (4,))
    p = Instruction("p", Opcode.PARAMETER, shape, parameter_number=0)
    neg = Instruction("neg", Opcode.NEGATE, shape, [p])
    comp.add(neg)  # added before its operand
    comp.add(p)
    comp.root = neg
    with pytest.raises(HloVerifyError, match="used before it is defined"):
        verify(Module("m", computations=[comp]))


def test_names_repeated_across_computations_are_renamed_like_xla() -> None:
    text = """HloModule m

f {
  x = f32[] parameter(0)
  ROOT y = f32[] negate(x)
}

ENTRY e {
  x = f32[] parameter(0)
  ROOT c = f32[] call(x), to_apply=f
}
"""
    module = parse_module(text)
    assert [i.name for i in module.entry] == ["x.1", "c"]  # what XLA's parser prints
    verify(module)
    module.entry["x.1"].name = "x"  # break it by hand: the verifier notices
    with pytest.raises(HloVerifyError, match="also used in computation f"):
        verify(module)
