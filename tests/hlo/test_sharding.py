"""rhino.hlo.sharding: golden round trips, iota handling, errors, and XLA as the oracle."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src.lib import xla_client

from rhino.hlo.errors import TextError
from rhino.hlo.sharding import (
    SUBGROUP_TYPES,
    HloSharding,
    ShardGroup,
    ShardingKind,
    _iota_devices,
    parse_sharding,
)

# Forms that XLA itself prints exactly so: parse then print must give them back, and
# XLA, given our printing inside a module, must print the same text again.
CANONICAL = [
    "{replicated}",
    "{manual}",
    "{unknown}",
    "{unreduced}",
    "{maximal device=0}",
    "{maximal device=3}",
    "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
    "{devices=[4,2]<=[2,4]T(1,0)}",
    "{devices=[2,3]<=[3,2]T(1,0)}",
    "{devices=[8]<=[2,2,2]T(1,0,2)}",
    "{devices=[2,2]0,2,1,3}",
    "{devices=[4]3,2,1,0}",
    "{devices=[1]<=[1]}",
    "{devices=[2,2]0,2,1,3 last_tile_dim_replicate}",
    "{devices=[2,2,2]<=[8] last_tile_dims={manual}}",
    "{devices=[2,2,2,2]<=[16] last_tile_dims={manual, replicated}}",
    "{devices=[2,2]<=[4] last_tile_dims={unreduced}}",
    "{devices=[2,2,2]0,4,2,6,1,5,3,7 last_tile_dims={manual, replicated}}",
    "{{replicated}, {devices=[2,1]0,1}}",
    "{{replicated}}",
    "{}",
    "{{replicated}, {devices=[2]0,1}, {manual}, {manual}, {manual}, /*index=5*/{replicated}}",
    "{{maximal device=0}, {maximal device=1}, {unknown}, {replicated}, {manual}, "
    "/*index=5*/{replicated}, {replicated}, {replicated}, {replicated}, {replicated}, "
    "/*index=10*/{manual}}",
    "{replicated shard_as 2}",
    "{manual shard_like 3}",
    "{maximal device=0 shard_as 1}",
    "{devices=[2,1]0,1 shard_as 0}",
    "{devices=[2,1]0,1 shard_like 1}",
    '{devices=[2,2]<=[4] last_tile_dims={manual} shard_as 1 metadata={op_name="a"}}',
    '{replicated metadata={op_name="a"}}',
    '{devices=[2,1]0,1 metadata={op_name="a" source_file="x.py" source_line=3}}',
    '{devices=[2]0,1 metadata={{op_name="a"}, {op_name="b"}}}',
    '{{replicated metadata={op_name="b"}}, {devices=[2]0,1 shard_as 1}}',
    "{mesh['a'=2,'b'=2], [{'a'}, {}]}",
    "{maximal_mesh[device_id=0]}",
]

# Valid text that XLA accepts but reprints differently (it canonicalises the meaning);
# rhino keeps what was written.
NON_CANONICAL = [
    "{devices=[4]<=[2,2]T(0,1)}",
    "{devices=[2,4]<=[2,2,2]T(2,0,1)}",
    "{devices=[2,2,2,2]<=[16] last_tile_dims={replicated, manual}}",
    "{devices=[2,2]2,0,1,3 last_tile_dim_replicate}",
    "{devices=[1,2]0,1 last_tile_dims={replicated}}",
    "{devices=[2,1]0,1 last_tile_dims={manual}}",
    "{devices=[2]<=[2] last_tile_dim_replicate}",
    "{devices=[2]<=[1,2]T(1,0)}",
]

# XLA prints this for a scalar on one device (all dims of size 1 dropped), yet its own
# parser rejects it: rhino reads and prints it, and the XLA tests leave it out.
XLA_PRINTS_BUT_REJECTS = [
    "{devices=[]<=[1]}",
    '{devices=[]<=[1] shard_as 1 metadata={op_name="a"}}',
]

# (written, printed): XLA's whitespace and item order.
NORMALISED = [
    ("{ replicated }", "{replicated}"),
    ("{devices=[2,2] 0, 1, 2, 3}", "{devices=[2,2]0,1,2,3}"),
    ("{devices=[4] <=[2,2] T(1,0)}", "{devices=[4]<=[2,2]T(1,0)}"),
    ("{devices=[2,2]<=[4]last_tile_dim_replicate}", "{devices=[2,2]<=[4] last_tile_dim_replicate}"),
    ("{/*x*/replicated}", "{replicated}"),
    ("{shard_as 1 replicated}", "{replicated shard_as 1}"),
    (
        '{devices=[2,2]<=[4] metadata={op_name="x"} last_tile_dim_replicate}',
        '{devices=[2,2]<=[4] last_tile_dim_replicate metadata={op_name="x"}}',
    ),
    (
        "{devices=[2,2]<=[4] last_tile_dims={manual,replicated}}",
        "{devices=[2,2]<=[4] last_tile_dims={manual, replicated}}",
    ),
    ("{{replicated},{manual}}", "{{replicated}, {manual}}"),
]


def xla_reprint(sharding_text: str, shape: str) -> str:
    """The sharding as XLA prints it back after parsing a module that carries it."""
    module = f"HloModule m\n\nENTRY main {{\n  ROOT p = {shape} parameter(0), sharding={sharding_text}\n}}\n"
    printed = xla_client.hlo.hlo_module_from_text(module).to_string()
    match = re.search(r"parameter\(0\), sharding=(.*)$", printed, re.MULTILINE)
    assert match, printed
    return match.group(1)


def shape_for(s: HloSharding) -> str:
    """A shape the sharding fits: tiled data dims twice the tile count."""
    if s.kind is ShardingKind.TUPLE:
        return "(" + ", ".join(shape_for(e) for e in s.elements) + ")"
    if s.kind is ShardingKind.TILED:
        return "f32[" + ",".join(str(2 * t) for t in s.data_tile_shape()) + "]"
    return "f32[8,8]"


@pytest.mark.parametrize("text", CANONICAL + NON_CANONICAL + XLA_PRINTS_BUT_REJECTS)
def test_round_trip(text: str) -> None:
    assert str(parse_sharding(text)) == text


@pytest.mark.parametrize(("written", "printed"), NORMALISED)
def test_whitespace_and_order_normalised(written: str, printed: str) -> None:
    assert str(parse_sharding(written)) == printed


# What newer XLAs print differently (runtime/BRIDGE_NOTES.md): from jaxlib 0.11 an
# unreduced sharding with the reduction it stands for, from 0.12 the device of a maximal
# mesh sharding as `single_device[...]`.
NEWER_XLA_PRINTS = [
    ("{single_device[", "{maximal_mesh["),
    (' metadata={op_type="sdy::reduction_op" op_name="SUM"}', ""),
]


@pytest.mark.parametrize("text", CANONICAL)
def test_xla_prints_canonical_forms_the_same(text: str) -> None:
    printed = xla_reprint(text, shape_for(parse_sharding(text)))
    for newer, older in NEWER_XLA_PRINTS:
        printed = printed.replace(newer, older)
    assert printed == text


def test_newer_xla_printing_parses_and_prints_back() -> None:
    for text in (
        "{single_device[device_id=0]}",
        '{unreduced metadata={op_type="sdy::reduction_op" op_name="SUM"}}',
    ):
        assert str(parse_sharding(text)) == text


@pytest.mark.parametrize("text", NON_CANONICAL)
def test_xla_accepts_non_canonical_forms(text: str) -> None:
    reprinted = xla_reprint(text, shape_for(parse_sharding(text)))
    assert reprinted != text
    parse_sharding(reprinted)  # and rhino reads XLA's canonical form


def test_xla_prints_empty_tile_dims_it_cannot_parse() -> None:
    written = "{devices=[1,1]<=[1] last_tile_dims={manual, replicated}}"
    assert xla_reprint(written, "f32[]") == "{devices=[]<=[1]}"
    with pytest.raises(Exception, match="expects integer"):
        xla_client.HloSharding.from_string("{devices=[]<=[1]}")
    s = parse_sharding("{devices=[]<=[1]}")
    assert (s.tile_shape, s.data_tile_shape(), s.devices()) == ((), (), (0,))


SNIPPETS = Path(__file__).resolve().parents[1] / "data" / "snippets"


def braced_values(text: str, key: str) -> list[str]:
    """The `{...}` value after each `key=` that is not part of a longer name."""
    values = []
    for match in re.finditer(rf"(?<![\w.]){key}=(?=\{{)", text):
        depth, i, quote = 0, match.end(), None
        while True:
            c = text[i]
            if quote:
                quote = None if c == quote else quote
                i += 2 if c == "\\" else 1
                continue
            if c in "\"'":
                quote = c
            depth += {"{": 1, "}": -1}.get(c, 0)
            i += 1
            if depth == 0:
                break
        values.append(text[match.end() : i])
    return values


def test_every_sharding_xla_prints_for_the_snippets_round_trips() -> None:
    seen = 0
    for path in sorted(SNIPPETS.glob("*.hlo")):
        printed = xla_client.hlo.hlo_module_from_text(path.read_text()).to_string()
        for key in ("sharding", "entry", "exit"):
            for value in braced_values(printed, key):
                assert str(parse_sharding(value)) == value, path.name
                seen += 1
    assert seen >= 28


def test_fields_of_parsed_forms() -> None:
    s = parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")
    assert s.kind is ShardingKind.TILED
    assert s.tile_shape == (2, 1, 4)
    assert (s.device_ids, s.iota_reshape, s.iota_transpose) == (None, (8,), None)
    assert s.last_tile_dim_replicate
    assert s.data_tile_shape() == (2, 1)
    assert s.num_devices() == 8

    s = parse_sharding("{devices=[2,2,2,2]<=[16] last_tile_dims={manual, replicated}}")
    assert s.subgroup_types == ("manual", "replicated")
    assert s.data_tile_shape() == (2, 2)

    s = parse_sharding('{devices=[2,2]0,2,1,3 shard_like 4 metadata={op_name="a b"}}')
    assert s.device_ids == (0, 2, 1, 3)
    assert s.shard_group == ShardGroup("shard_like", 4)
    assert s.metadata == '{op_name="a b"}'

    s = parse_sharding("{maximal device=5}")
    assert (s.kind, s.device, s.devices(), s.num_devices()) == (ShardingKind.MAXIMAL, 5, (5,), 1)

    s = parse_sharding("{{replicated}, {devices=[2,1]0,1}}")
    assert s.kind is ShardingKind.TUPLE
    explicit = HloSharding(ShardingKind.TILED, tile_shape=(2, 1), device_ids=(0, 1))
    assert s.elements == (HloSharding.replicated(), explicit)
    assert s.elements[1].is_equivalent(HloSharding.tiled([2, 1], [0, 1]))

    s = parse_sharding("{mesh['a'=2], [{'a'}] , metadata={op_name=\"}\"}}")
    assert s.kind is ShardingKind.NAMED
    assert s.named_text == "{mesh['a'=2], [{'a'}] , metadata={op_name=\"}\"}}"


def test_iota_and_explicit_forms_are_equivalent() -> None:
    iota = parse_sharding("{devices=[4,2]<=[2,4]T(1,0)}")
    explicit = parse_sharding("{devices=[4,2]0,4,1,5,2,6,3,7}")
    assert iota.devices() == explicit.devices() == (0, 4, 1, 5, 2, 6, 3, 7)
    assert iota != explicit
    assert iota.is_equivalent(explicit)
    assert not iota.is_equivalent(parse_sharding("{devices=[4,2]<=[8]}"))
    assert not iota.is_equivalent(parse_sharding("{devices=[2,4]0,4,1,5,2,6,3,7}"))
    assert parse_sharding("{devices=[2,2]<=[4] last_tile_dims={replicated}}").is_equivalent(
        parse_sharding("{devices=[2,2]0,1,2,3 last_tile_dim_replicate}")
    )


@pytest.mark.parametrize(
    ("tile_shape", "devices", "printed"),
    [
        ([2, 2], [0, 2, 1, 3], "{devices=[2,2]<=[2,2]T(1,0)}"),
        ([8], range(8), "{devices=[8]<=[8]}"),
        ([2, 1, 4], range(8), "{devices=[2,1,4]<=[8]}"),
        ([4, 2], [0, 4, 1, 5, 2, 6, 3, 7], "{devices=[4,2]<=[2,4]T(1,0)}"),
        ([8], [0, 2, 4, 6, 1, 3, 5, 7], "{devices=[8]<=[4,2]T(1,0)}"),
        ([2, 2, 2], [0, 4, 2, 6, 1, 5, 3, 7], "{devices=[2,2,2]<=[2,2,2]T(2,1,0)}"),
        ([1], [0], "{devices=[1]<=[1]}"),
        ([2, 2], [1, 0, 3, 2], "{devices=[2,2]1,0,3,2}"),
        ([4], [0, 1, 3, 2], "{devices=[4]0,1,3,2}"),
    ],
)
def test_tiled_prints_compact_iota_when_it_can(
    tile_shape: list[int], devices: range | list[int], printed: str
) -> None:
    s = HloSharding.tiled(tile_shape, devices)
    assert str(s) == printed
    assert s.devices() == tuple(devices)
    assert parse_sharding(printed) == s


def test_tiled_with_subgroups() -> None:
    s = HloSharding.tiled([2, 1, 4], range(8), last_tile_dim_replicate=True)
    assert str(s) == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    s = HloSharding.tiled([2, 2, 2], range(8), subgroup_types=["manual"])
    assert str(s) == "{devices=[2,2,2]<=[8] last_tile_dims={manual}}"
    assert s.subgroup_kinds() == ("manual",)
    assert HloSharding.tiled([2, 4], range(8), last_tile_dim_replicate=True).subgroup_kinds() == (
        "replicated",
    )


@pytest.mark.parametrize(
    ("text", "offset", "message"),
    [
        ("replicated", 0, "expected '{' to start a sharding, found 'replicated'"),
        ("{replicated", 11, "found end of text"),
        ("{replicated}}", 12, "expected end of sharding, found '}'"),
        ("{replicated, manual}", 11, "found ','"),
        ("{replicated manual}", 12, "'manual' conflicts with 'replicated'"),
        ("{manual manual}", 8, "'manual' given twice"),
        ("{maximal}", 1, "'maximal' needs 'device=N'"),
        ("{maximal device=-1}", 9, "device id must be >= 0, got -1"),
        ("{maximal device=x}", 16, "expected an integer after 'device=', found 'x'"),
        ("{device=1}", 0, "expected 'replicated', 'manual', 'maximal device=N'"),
        ("{replicated device=1}", 12, "'device=' belongs to 'maximal' only"),
        ("{replicated devices=[2]0,1}", 12, "a replicated sharding takes no 'devices='"),
        ("{manual last_tile_dim_replicate}", 8, "needs a tiled sharding"),
        ("{shard_as 1}", 0, "expected 'replicated', 'manual'"),
        ("{replicated shard_as x}", 21, "expected an integer group id after 'shard_as', found 'x'"),
        ("{devices=[2]0,1 shard_as 0 shard_like 1}", 27, "'shard_like' conflicts with 'shard_as'"),
        ("{devices=[]0,1}", 11, "2 device ids for tile shape [], which needs 1"),
        ("{devices=[2,]0,1}", 12, "expected an integer tile dim, found ']'"),
        ("{devices=[0,2]<=[1]}", 10, "tile dims must be >= 1, got [0,2]"),
        ("{devices=[2,2]}", 14, "expected device ids or '<=[' after 'devices=[...]', found '}'"),
        ("{devices=[2,2]0 1 2 3}", 16, "found integer 1"),
        ("{devices=[2,2]0,1,2}", 14, "3 device ids for tile shape [2,2], which needs 4"),
        ("{devices=[2,2]0,1,2,2}", 14, "device ids must be a permutation of 0..3, got 0,1,2,2"),
        ("{devices=[2,2]0,1,2,7}", 14, "device ids must be a permutation of 0..3"),
        ("{devices=[1,1]0}", 14, "an explicit device list needs more than one device"),
        ("{devices=[2]0,1,}", 16, "expected a device id, found '}'"),
        ("{devices=[2,2]<=[8]}", 17, "iota reshape [8] has 8 devices, tile shape [2,2] needs 4"),
        ("{devices=[2,2]<=[]}", 17, "expected an integer iota reshape dim, found ']'"),
        ("{devices=[2,2]<=[4]T(0)}", 19, "a one-dim iota takes no transpose T(...)"),
        ("{devices=[4]<=[2,2]}", 19, "an iota with 2 reshape dims needs a transpose T(...)"),
        ("{devices=[4]<=[2,2]T(1,1)}", 19, "transpose T(1,1) is not a permutation of 0..1"),
        ("{devices=[4]<=[2,2]T(0,2)}", 19, "transpose T(0,2) is not a permutation of 0..1"),
        ("{devices=[4]<=[2,2]T(1)}", 19, "transpose T(1) is not a permutation of 0..1"),
        ("{devices=[4]<=[2,2]T(1,0}", 24, "expected ',' or ')' to end the transpose T(...)"),
        ("{devices=[4]<=[2,2]T()}", 21, "expected an integer in the transpose T(...), found ')'"),
        ("{devices=[4]<=[2,2]T(1,0)T(1,0)}", 25, "found 'T'"),
        (
            "{devices=[2,2]<=[4] last_tile_dim_replicate last_tile_dims={manual}}",
            44,
            "last_tile_dim_replicate and last_tile_dims= cannot both be given",
        ),
        ("{devices=[2,2]<=[4] last_tile_dims={}}", 36, "expected a subgroup type"),
        ("{devices=[2,2]<=[4] last_tile_dims={tiled}}", 36, "found 'tiled'"),
        ("{devices=[2]<=[2] last_tile_dims={manual, manual}}", 18, "2 subgroup dims but only 1"),
        ("{devices=[2]<=[2] bogus}", 18, "expected a sharding item"),
        ("{replicated metadata=}", 21, "expected '{' after 'metadata=', found '}'"),
        ('{replicated metadata={op_name="a}', 30, "unterminated string"),
        ("{replicated metadata={op_name={1}", 21, "no matching '}'"),
        ("{replicated /* no end}", 12, "unterminated /* comment"),
        ("{replicated #}", 12, "unexpected character '#'"),
        ("{{replicated}, {{manual}}}", 16, "tuple shardings do not nest"),
        ("{{}}", 2, "expected a sharding inside '{}'"),
        ("{{replicated} {manual}}", 14, "expected ',' or '}' after a tuple sharding element"),
    ],
)
def test_syntax_errors_say_where_and_what(text: str, offset: int, message: str) -> None:
    with pytest.raises(TextError) as info:
        parse_sharding(text)
    assert message in info.value.message
    assert info.value.offset == offset


def test_constructor_rejects_invalid_values() -> None:
    with pytest.raises(ValueError, match="permutation"):
        HloSharding.tiled([2, 2], [0, 1, 2, 2])
    with pytest.raises(ValueError, match="needs 4"):
        HloSharding.tiled([2, 2], [0, 1, 2])
    with pytest.raises(ValueError, match="takes no tile assignment"):
        HloSharding(ShardingKind.REPLICATED, tile_shape=(2,))
    with pytest.raises(ValueError, match="do not nest"):
        HloSharding.tuple_([HloSharding.tuple_([])])
    with pytest.raises(ValueError, match="device id >= 0"):
        HloSharding.maximal(-1)
    with pytest.raises(ValueError, match="needs a transpose"):
        HloSharding(ShardingKind.TILED, tile_shape=(4,), iota_reshape=(2, 2))
    with pytest.raises(ValueError, match="unknown subgroup type"):
        HloSharding.tiled([2, 2], range(4), subgroup_types=["tiled"])


def test_queries_refuse_kinds_without_devices() -> None:
    with pytest.raises(ValueError, match="no device list"):
        HloSharding.replicated().devices()
    with pytest.raises(ValueError, match="no tile shape"):
        HloSharding.manual().data_tile_shape()


# ----------------------------------------------------------------------- properties


@st.composite
def factorizations(draw: st.DrawFn, n: int) -> tuple[int, ...]:
    """An ordered factorisation of n, size-1 factors allowed."""
    factors = []
    while n > 1:
        factor = draw(st.sampled_from([d for d in range(2, n + 1) if n % d == 0]))
        factors.append(factor)
        n //= factor
    factors += [1] * draw(st.integers(0, 1))
    return tuple(draw(st.permutations(factors))) or (1,)


@st.composite
def tiled_shardings(draw: st.DrawFn) -> HloSharding:
    subgroups = draw(st.sampled_from(["none", "replicate", "types"]))
    types: tuple[str, ...] = ()
    if subgroups == "types":
        types = tuple(draw(st.lists(st.sampled_from(SUBGROUP_TYPES), min_size=1, max_size=2)))
    extra = len(types) + (subgroups == "replicate")
    data_rank = draw(st.integers(0 if extra else 1, 3))
    tile_shape = tuple(
        draw(st.lists(st.integers(1, 4), min_size=data_rank + extra, max_size=data_rank + extra))
    )
    n = math.prod(tile_shape)
    device_ids = reshape = transpose = None
    if n >= 2 and draw(st.booleans()):
        device_ids = tuple(draw(st.permutations(range(n))))
    else:
        reshape = draw(factorizations(n))
        if len(reshape) > 1:
            transpose = tuple(draw(st.permutations(range(len(reshape)))))
    return HloSharding(
        ShardingKind.TILED,
        tile_shape=tile_shape,
        device_ids=device_ids,
        iota_reshape=reshape,
        iota_transpose=transpose,
        last_tile_dim_replicate=subgroups == "replicate",
        subgroup_types=types,
        shard_group=draw(shard_groups),
        metadata=draw(metadata),
    )


metadata = st.sampled_from(
    [None, '{op_name="a"}', '{op_name="jit(f)/dot" source_file="m.py" source_line=7}']
)
shard_groups = st.one_of(
    st.none(), st.builds(ShardGroup, st.sampled_from(["shard_as", "shard_like"]), st.integers(0, 9))
)
simple_shardings = st.one_of(
    st.builds(
        HloSharding,
        st.sampled_from(
            [
                ShardingKind.REPLICATED,
                ShardingKind.MANUAL,
                ShardingKind.UNKNOWN,
                ShardingKind.UNREDUCED,
            ]
        ),
        shard_group=shard_groups,
        metadata=metadata,
    ),
    st.builds(
        HloSharding, st.just(ShardingKind.MAXIMAL), device=st.integers(0, 15), metadata=metadata
    ),
    tiled_shardings(),
)
shardings = st.one_of(
    simple_shardings, st.lists(simple_shardings, max_size=12).map(HloSharding.tuple_)
)


@given(shardings)
@settings(max_examples=200, deadline=None)
def test_print_then_parse_gives_an_equal_object(s: HloSharding) -> None:
    assert parse_sharding(str(s)) == s


@given(shardings)
@settings(max_examples=200, deadline=None)
def test_xla_accepts_every_printed_form(s: HloSharding) -> None:
    reprinted = xla_reprint(str(s), shape_for(s))  # raises if XLA rejects it
    parse_sharding(reprinted)  # XLA may canonicalise the meaning; rhino reads the result


@given(
    st.integers(1, 4).flatmap(lambda k: st.lists(st.integers(1, 5), min_size=k, max_size=k)),
    st.data(),
)
@settings(max_examples=200, deadline=None)
def test_tiled_iota_form_matches_xla_canonicalisation(
    reshape: list[int], data: st.DataObject
) -> None:
    transpose = data.draw(st.permutations(range(len(reshape))))
    n = math.prod(reshape)
    tile_shape = data.draw(factorizations(n))
    devices = _iota_devices(reshape, transpose)
    ours = HloSharding.tiled(tile_shape, devices)
    assert ours.device_ids is None
    written = f"{{devices=[{','.join(map(str, tile_shape))}]<=[{','.join(map(str, reshape))}]"
    if len(reshape) > 1:
        written += f"T({','.join(map(str, transpose))})"
    written += "}"
    assert str(xla_client.HloSharding.from_string(written)) == str(ours)
