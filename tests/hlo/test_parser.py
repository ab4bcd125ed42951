from __future__ import annotations

from pathlib import Path

import pytest

from rhino.hlo.errors import HloParseError
from rhino.hlo.ir import Computation, Instruction
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_file, parse_module
from rhino.hlo.printer import print_module
from rhino.hlo.shape import Shape, parse_shape
from tests.hlo.corpus import ROOT, corpus_files, corpus_ids

MLP = ROOT / "tests" / "data" / "mlp_step.hlo"


def test_golden_jax_text_prints_back_unchanged() -> None:
    text = MLP.read_text()
    assert print_module(parse_module(text)) == text


def test_structure_of_parsed_module() -> None:
    m = parse_file(MLP)
    assert m.name == "jit_step"
    assert [c.name for c in m.computations] == ["region_0.1", "main.2"]
    entry = m.entry
    assert entry.name == "main.2" and entry.is_entry
    assert entry.root is not None and entry.root.name == "tuple.1"
    dot = entry["dot_general.5"]
    assert dot.opcode is Opcode.DOT
    assert dot.shape == Shape("f32", (4, 32), "1,0")
    assert [o.name for o in dot.operands] == ["x.1", "params_0_.1"]
    assert dot.attr("lhs_contracting_dims") == (1,)
    assert entry["x.1"].users.keys() >= {dot}
    reduce = entry["reduce_sum.7"]
    assert reduce.called == (m.computation("region_0.1"),)
    assert [p.name for p in entry.parameters] == ["params_0_.1", "params_1_.1", "x.1", "y.1"]


@pytest.mark.parametrize("path", corpus_files(), ids=corpus_ids())
def test_print_is_a_fixpoint(path: Path) -> None:
    once = print_module(parse_file(path, lazy=False))
    twice = print_module(parse_module(once))
    assert once == twice


def test_percent_names_operand_shapes_and_comments() -> None:
    text = """HloModule m, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(f32[] %x, f32[] %y)
}

ENTRY %main (p: f32[8], q: (f32[8], s32[])) -> (f32[8], f32[]) {
  %p = f32[8]{0} parameter(0)
  %q = (f32[8]{0}, s32[]) parameter(1)
  %g = f32[8]{0} get-tuple-element((f32[8]{0}, s32[]) %q), index=0
  %zero = f32[] constant(0)
  %r = f32[] reduce(f32[8]{0} %g, f32[] %zero), dimensions={0}, to_apply=%add
  ROOT %t = (f32[8]{0}, /*index=1*/f32[]) tuple(%p, /*index=1*/%r)
}
"""
    m = parse_module(text)
    assert m.percent_names
    t = m.entry.root
    assert [o.name for o in t.operands] == ["p", "r"]
    assert t.shape.is_tuple and len(t.shape.elements) == 2
    printed = print_module(m)
    assert "ROOT %t = (f32[8]{0}, f32[]) tuple(%p, %r)" in printed
    assert "ENTRY %main (p: f32[8], q: (f32[8], s32[])) -> (f32[8], f32[]) {" in printed
    assert print_module(parse_module(printed)) == printed


def test_multiline_literal_and_unknown_opcode_kept_verbatim() -> None:
    text = """HloModule m

ENTRY e {
  c = f32[2,2]{1,0} constant({ { 1, 2 },
                               { 3, 4 } })
  ROOT f = f32[2,2]{1,0} my-new-op(c), mystery_attr={a=[1,2] b="x,y"}, another=7
}
"""
    m = parse_module(text, lazy=False)
    root = m.entry.root
    assert root.opcode is Opcode.UNKNOWN and root.opcode_text == "my-new-op"
    assert root.attrs == {"mystery_attr": '{a=[1,2] b="x,y"}', "another": "7"}
    printed = print_module(m)
    assert 'my-new-op(c), mystery_attr={a=[1,2] b="x,y"}, another=7' in printed


def test_gzip_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip
    import io

    gz = tmp_path / "m.hlo.gz"
    gz.write_bytes(gzip.compress(MLP.read_bytes()))
    assert parse_file(gz).instruction_count == 48
    monkeypatch.setattr("sys.stdin", io.StringIO(MLP.read_text()))
    assert parse_file("-").instruction_count == 48


BAD = """HloModule m

ENTRY e {
  p = f32[2]{0} parameter(0)
  ROOT a = f32[2]{0} add(p, q)
}
"""

ERROR_CASES = [
    # (text, line, col, message fragment)
    ("", 1, 1, "expected 'HloModule'"),
    ("HloModule m\n", 2, 1, "no computations"),
    (BAD, 5, 29, "undefined instruction %q"),
    (BAD.replace("f32[2]{0} parameter", "f33[2]{0} parameter"), 4, 7, "unknown element type 'f33'"),
    (BAD.replace("p = f32", "p f32"), 4, 5, "expected '=' after instruction name %p"),
    (BAD.replace("add(p, q)", "add(p, p"), 6, 1, "expected ',' or ')'"),
    (BAD.replace("add(p, q)", "add(p, p), dimensions={0"), 5, 44, "is never closed"),
    (BAD.replace("add(p, q)", 'add(p, p), metadata={op_name="x}'), 5, 51, "unterminated string"),
    (BAD.replace("add(p, q)", "add(p, p) junk"), 5, 32, "expected ',' or the end of the line"),
    (BAD.replace("add(p, q)", "add(p, p)").rstrip("}\n"), 5, 31, "is not closed"),
    (
        BAD.replace("add(p, q)", "add(p, p)").replace("ROOT a", "ROOT p"),
        5,
        8,
        "duplicate instruction name %p",
    ),
    (
        BAD.replace("add(p, q)", "add(p, p), to_apply=nowhere"),
        5,
        42,
        "unknown computation %nowhere",
    ),
    (BAD.replace("{0} parameter", "{0,1} parameter"), 4, 14, "not a permutation"),
    (BAD.replace("add(p, q)", "add(p, p), dimensions={0,x}"), 5, 47, "expected an integer"),
    (BAD.replace("add(p, q)", "add(p, p), window={size=2 pad=1}"), 5, 40, "window: malformed"),
    (BAD.replace("parameter(0)", "parameter(x)"), 4, 27, "expected a parameter number"),
    (
        BAD.replace("add(p, q)", "add(p, p)").replace("parameter(0)", "constant({1, 2, 3})"),
        4,
        31,
        "more than 2 elements",
    ),
    # the header's program shape is a shape like any other (XLA rejects these too)
    (
        BAD.replace("HloModule m", "HloModule m, entry_computation_layout={(f32[x...)->f32[]}"),
        1,
        45,
        "bad dimension",
    ),
    (
        BAD.replace("HloModule m", "HloModule m, entry_computation_layout={(f32[2]{0})f32[2]{0}}"),
        1,
        51,
        "expected '->'",
    ),
    (
        BAD.replace(
            "HloModule m", "HloModule m, entry_computation_layout={(f32[2]{0})->f32[2]{0} x}"
        ),
        1,
        63,
        "expected '}' after the result shape",
    ),
]


def test_a_well_formed_program_shape_in_the_header_is_kept_verbatim() -> None:
    layout = "{(f32[2]{0}, f32[2]{0})->(f32[2]{0}, s32[])}"
    module = parse_module(
        BAD.replace("HloModule m", f"HloModule m, entry_computation_layout={layout}").replace(
            "add(p, q)", "add(p, p)"
        ),
        "ok.hlo",
    )
    assert module.attrs["entry_computation_layout"] == layout


@pytest.mark.parametrize(("text", "line", "col", "fragment"), ERROR_CASES)
def test_parse_errors_name_line_and_column(text: str, line: int, col: int, fragment: str) -> None:
    with pytest.raises(HloParseError) as info:
        parse_module(text, "bad.hlo", lazy=False)
    e = info.value
    assert fragment in e.message
    assert (e.line, e.col) == (line, col), str(e)
    assert str(e).startswith(f"bad.hlo:{line}:{col}: error: ")
    assert str(e).splitlines()[-1].index("^") == col + 1  # "  " + caret under the column


def test_lazy_attribute_error_is_located_when_read() -> None:
    text = BAD.replace("add(p, q)", "add(p, p), dimensions={0,x}")
    m = parse_module(text, "lazy.hlo")  # lazy: the value is not decoded yet
    with pytest.raises(HloParseError) as info:
        m.entry.root.attr("dimensions")
    assert (info.value.line, info.value.col) == (5, 47)


def test_instruction_parsed_links_users_and_splits_its_attribute_tail() -> None:
    comp = Computation("c")
    f32 = parse_shape("f32[2]{0}")
    p = Instruction.parsed(comp, "p", Opcode.PARAMETER, "parameter", f32, [], 0, None, 0)
    tail = ', dimensions={0}, metadata={op_name="x"}'
    n = Instruction.parsed(comp, "n", Opcode.NEGATE, "negate", f32, [p], 40, tail, 100)
    assert comp.instructions == [p, n] and comp.get("n") is n and n.parent is comp
    assert list(p.users) == [n] and n.operands == [p]
    assert n.attrs == {"dimensions": "{0}", "metadata": '{op_name="x"}'}
    assert n.attr_offsets == {
        "dimensions": 100 + tail.index("{0}"),
        "metadata": 100 + tail.index("{op_name"),
    }
    assert p.attrs == {} and p.attr_offsets == {}


def test_literal_and_attribute_offsets_point_into_the_text() -> None:
    text = BAD.replace("add(p, q)", 'add(p, p), metadata={op_name="a"}').replace(
        "parameter(0)", "constant( {1, 2})"
    )
    for fast in (True, False):
        m = parse_module(text, fast=fast)
        const, root = m.entry.instructions[0], m.entry.root
        assert root is not None and const.opcode is Opcode.CONSTANT
        assert text[const.literal_pos :].startswith("{1, 2})")
        assert text[root.attr_offsets["metadata"] :].startswith('{op_name="a"}')


def test_a_name_an_earlier_computation_used_is_renamed_as_xla_does() -> None:
    text = """HloModule m

f {
  t = f32[] parameter(0)
  ROOT t.1 = f32[] negate(t)
}

ENTRY e {
  t = f32[] parameter(0)
  ROOT r = f32[] call(t), to_apply=f
}
"""
    m = parse_module(text)
    assert [i.name for i in m.computations[0]] == ["t", "t.1"]
    assert [i.name for i in m.entry] == ["t.2", "r"]
    assert m.entry.get("t.2") is m.entry.instructions[0] and m.entry.get("t") is None


def test_rename_keeps_the_names_index() -> None:
    m = parse_module(MLP.read_text())
    comp = m.entry
    first, second = comp.instructions[0], comp.instructions[1]
    old = first.name
    comp.rename(first, "renamed")
    assert first.name == "renamed" and comp.get("renamed") is first and comp.get(old) is None
    with pytest.raises(ValueError, match="already has an instruction"):
        comp.rename(first, second.name)
    assert comp.by_name[second.name] is second and len(comp.by_name) == len(comp)


def test_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "x.hlo"
    p.write_bytes(b"HloModule m\n\xff\xfe")
    with pytest.raises(HloParseError, match="not UTF-8"):
        parse_file(p)


@pytest.mark.parametrize(
    ("literal", "shape"),
    [
        ("{1, 2}", "s32[2]"),
        ("{1, 2, 3}", "s32[2]"),
        ("{1.5, 2}", "s32[2]"),
        ("{true, 0}", "pred[2]"),
        ("{maybe}", "pred[1]"),
        ("(1, 2)", "c64[]"),
        ("(1, {2})", "(s32[], f32[1])"),
        ("{nan, -inf, 1e-05}", "f32[3]"),
        ("{-1}", "u64[1]"),  # numpy refuses: the same OverflowError
        ("99999999999999999999", "s64[]"),
        ("{...}", "f32[4]"),
        ("{1} 2", "s32[1]"),
        ("", "f32[]"),
    ],
)
def test_check_literal_raises_what_decode_literal_raises(literal: str, shape: str) -> None:
    from rhino.hlo.literal import check_literal, decode_literal

    def outcome(read) -> object:  # type: ignore[no-untyped-def]
        try:
            read(literal, parse_shape(shape))
        except Exception as e:
            return type(e), str(e), getattr(e, "offset", None)
        return "ok"

    assert outcome(check_literal) == outcome(decode_literal)


@pytest.mark.parametrize(
    ("literal", "shape"),
    [
        ("7", "s32[]"),
        ("-3", "s64[]"),
        ("{4}", "u32[1]"),
        ("{{2.5}}", "f32[1,1]"),
        ("true", "pred[]"),
        ("0", "pred[]"),
        ("-inf", "f32[]"),
        ("1e-05", "bf16[]"),
        ("{...}", "f32[1]"),
        ("(1, 2)", "c64[]"),
        ("{1, 2}", "s32[1]"),
        ("{1} 2", "s32[1]"),
        ("maybe", "pred[]"),
        ("", "f32[]"),
    ],
)
def test_decode_scalar_reads_what_decode_literal_reads(literal: str, shape: str) -> None:
    """The numpy-free reading of a one-element literal (`rhino parse`'s trip counts):
    the same value, or the same error."""
    from rhino.hlo.literal import decode_literal, decode_scalar

    def outcome(read) -> object:  # type: ignore[no-untyped-def]
        try:
            value = read(literal, parse_shape(shape))
        except Exception as e:
            return type(e), str(e), getattr(e, "offset", None)
        return None if value is None else complex(value.reshape(()).item())

    def scalar(text, s):  # type: ignore[no-untyped-def]
        value = decode_scalar(text, s)
        return None if value is None else _AsArray(value)

    assert outcome(scalar) == outcome(decode_literal)


class _AsArray:
    """What `outcome` reads of an array, for a Python value."""

    def __init__(self, value: object) -> None:
        self.value = value

    def reshape(self, _: object) -> _AsArray:
        return self

    def item(self) -> object:
        return self.value


def test_eager_parse_verify_and_summary_import_no_numpy() -> None:
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from rhino.hlo.analysis import summarize\n"
        "from rhino.hlo.parser import parse_file\n"
        "from rhino.hlo.verify import verify\n"
        "module = parse_file(sys.argv[1], lazy=False)\n"
        "verify(module)\n"
        "summarize(module)\n"
        "print('numpy' in sys.modules)\n"
    )
    for example in ("mlp.hlo", "gpt_scan_tiny.hlo"):  # the second has loops: trip counts
        done = subprocess.run(
            [sys.executable, "-c", probe, str(ROOT / "examples" / example)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "False", example


def test_an_eager_parse_locates_each_copy_of_a_repeated_attribute_tail() -> None:
    text = """HloModule m

ENTRY e {
  p = f32[4] parameter(0)
  a = f32[4,2] broadcast(p), dimensions={0}
  b = f32[4,2] broadcast(p), dimensions={0}
  ROOT c = f32[4,2] add(a, b)
}
"""
    m = parse_module(text, lazy=False)
    for name in ("a", "b"):
        inst = m.entry[name]
        assert text[inst.attr_offsets["dimensions"] :].startswith("{0}\n")
        assert text[inst.pos :].startswith(f"{name} = ")
        assert inst.attr("dimensions") == (0,)
    bad = text.replace("dimensions={0}", "dimensions={x}")
    with pytest.raises(HloParseError) as e:
        parse_module(bad, lazy=False)
    assert (e.value.span.line, e.value.span.col) == (5, 42)
