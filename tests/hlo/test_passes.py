from __future__ import annotations

import pytest

from rhino.hlo.errors import HloParseError
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import force_decode, parse_file, parse_module
from rhino.hlo.passes import clone_module, inline_calls
from rhino.hlo.printer import print_module
from rhino.hlo.verify import verify
from tests.hlo.corpus import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.hlo"))


def test_clone_is_equal_and_independent() -> None:
    m = parse_file(ROOT / "tests" / "data" / "mlp_step.hlo")
    c = clone_module(m)
    assert print_module(c) == print_module(m)
    c.entry.root.name = "changed"
    assert m.entry.root.name == "tuple.1"
    dot = next(i for i in c.instructions() if i.opcode is Opcode.DOT)
    dot.set_attr("lhs_contracting_dims", (0,))
    original = m.entry.get(dot.name)
    assert original is not None and original.attr("lhs_contracting_dims") != (0,)
    assert all(u.parent is c.entry for u in c.entry.root.operands)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_clone_prints_the_module(path) -> None:
    m = parse_file(path)
    c = clone_module(m)
    assert print_module(c) == print_module(m)
    verify(c)
    called = {id(k) for i in c.instructions() for k in i.called}
    assert called <= {id(k) for k in c.computations}  # calls point into the copy


def test_clone_keeps_error_locations(tmp_path) -> None:
    text = (ROOT / "tests" / "data" / "mlp_step.hlo").read_text()
    bad = text.replace("lhs_contracting_dims={1}", "lhs_contracting_dims={x}", 1)
    assert bad != text
    path = tmp_path / "bad.hlo"
    path.write_text(bad)
    c = clone_module(parse_file(path))
    dot = next(i for i in c.instructions() if i.attrs.get("lhs_contracting_dims") == "{x}")
    with pytest.raises(HloParseError) as e:
        dot.attr("lhs_contracting_dims")
    line = next(n for n, t in enumerate(bad.splitlines(), 1) if "{x}" in t)
    assert f"bad.hlo:{line}:" in str(e.value)


def test_clone_keeps_literal_locations() -> None:
    text = "HloModule m\n\nENTRY e {\n  c = f32[2]{0} constant({1, 2, 3})\n}\n"
    original = parse_module(text, "lit.hlo")
    errors = []
    for module in (original, clone_module(original)):
        with pytest.raises(HloParseError) as e:
            force_decode(module)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    assert errors[1].startswith("lit.hlo:4:") and "more than 2 elements" in errors[1]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_inline_calls_leaves_no_call_and_verifies(path) -> None:
    before = parse_file(path)
    after = inline_calls(before)
    verify(after)
    assert not any(i.opcode is Opcode.CALL for i in after.instructions())
    assert (
        any(i.opcode is Opcode.CALL for i in before.instructions())
        or path.name == "mlp_optimized.hlo"
    )
    assert [p.shape for p in after.entry.parameters] == [p.shape for p in before.entry.parameters]
    assert after.entry.root.shape == before.entry.root.shape
    # non-call instructions are all still there (inlined copies may add more)
    assert after.instruction_count >= before.instruction_count - sum(
        1 + len(c.parameters) for c in before.computations if not c.is_entry
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_flatten_leaves_no_call_or_fusion_and_verifies(path) -> None:
    from rhino.hlo.passes import flatten

    before = parse_file(path)
    after = flatten(before)
    verify(after)
    assert not any(i.opcode in (Opcode.CALL, Opcode.FUSION) for i in after.instructions())
    assert [p.shape for p in after.entry.parameters] == [p.shape for p in before.entry.parameters]
    if path.name == "mlp_optimized.hlo":
        assert any(i.opcode is Opcode.FUSION for i in before.instructions())


def test_inserting_several_before_an_instruction_keeps_their_order_and_refuses_a_taken_name() -> (
    None
):
    from rhino.hlo.ir import Instruction
    from rhino.hlo.opcode import Opcode
    from rhino.hlo.parser import parse_module
    from rhino.hlo.shape import parse_shape

    module = parse_module(
        "HloModule m\nENTRY e {\n  a = f32[] parameter(0)\n  ROOT b = f32[] negate(a)\n}\n"
    )
    comp = module.entry
    a, b = comp.instructions
    made = [Instruction(n, Opcode.NEGATE, parse_shape("f32[]"), [a]) for n in ("c", "d")]
    comp.insert_all_before(b, made)
    assert [i.name for i in comp.instructions] == ["a", "c", "d", "b"]
    assert comp.get("d") is made[1] and made[1].parent is comp
    for names in (["e", "a"], ["f", "f"]):
        with pytest.raises(ValueError, match="already has"):
            comp.insert_all_before(
                b, [Instruction(n, Opcode.NEGATE, parse_shape("f32[]"), [a]) for n in names]
            )
    assert [i.name for i in comp.instructions] == ["a", "c", "d", "b"]  # nothing half done
    assert comp.get("e") is None


def test_splicing_puts_each_replaced_instruction_out_and_its_instructions_where_it_was() -> None:
    from rhino.hlo.ir import Instruction
    from rhino.hlo.opcode import Opcode
    from rhino.hlo.parser import parse_module
    from rhino.hlo.shape import parse_shape

    module = parse_module(
        "HloModule m\nENTRY e {\n  a = f32[] parameter(0)\n  b = f32[] negate(a)\n"
        "  c = f32[] negate(a)\n  ROOT d = f32[] add(b, c)\n}\n"
    )
    comp = module.entry
    a, b, c, d = comp.instructions

    def made(*names: str) -> list[Instruction]:
        return [Instruction(n, Opcode.NEGATE, parse_shape("f32[]"), [a]) for n in names]

    with pytest.raises(ValueError, match="still used"):
        comp.splice({b: made("x")})
    with pytest.raises(ValueError, match="already has"):
        d.replace_operand(0, a)
        d.replace_operand(1, a)
        comp.splice({b: made("y"), c: made("y")})
    assert comp.instructions == [a, b, c, d] and b in a.users and comp.get("y") is None
    one, two = made("b1", "b2"), made()
    comp.splice({b: one, c: two})
    assert [i.name for i in comp.instructions] == ["a", "b1", "b2", "d"]
    assert comp.get("b") is None and comp.get("c") is None and comp.get("b2") is one[1]
    assert b not in a.users and c not in a.users and one[0].parent is comp


def test_a_body_inlined_many_times_gets_the_names_a_search_from_one_would_give() -> None:
    from rhino.hlo.passes import _Names

    names = _Names({"x", "x.i2"})
    assert [names.fresh("x") for _ in range(3)] == ["x.i1", "x.i3", "x.i4"]
    assert names.fresh("y") == "y" and names.fresh("y") == "y.i1"
