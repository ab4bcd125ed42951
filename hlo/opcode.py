"""XLA's opcodes, and the families rhino's analyses and rules group them into."""

from __future__ import annotations

import enum


class Opcode(enum.Enum):
    """Every opcode XLA prints (xla/hlo/ir/hlo_opcode.h), by its text name.

    An opcode that is not listed parses as `UNKNOWN`; its text is kept on the
    instruction (`Instruction.opcode_text`) and printed back unchanged.
    """

    # Enum hashes a member by its name in Python code (~0.4 us a lookup; the analyses
    # look opcodes up in dicts and sets several times an instruction). Members are
    # singletons compared by identity, so object's identity hash, in C, is as good.
    __hash__ = object.__hash__

    ABS = "abs"
    ADD = "add"
    ADD_DEPENDENCY = "add-dependency"
    AFTER_ALL = "after-all"
    ALL_GATHER = "all-gather"
    ALL_GATHER_DONE = "all-gather-done"
    ALL_GATHER_START = "all-gather-start"
    ALL_REDUCE = "all-reduce"
    ALL_REDUCE_DONE = "all-reduce-done"
    ALL_REDUCE_START = "all-reduce-start"
    ALL_TO_ALL = "all-to-all"
    AND = "and"
    ASYNC_DONE = "async-done"
    ASYNC_START = "async-start"
    ASYNC_UPDATE = "async-update"
    ATAN2 = "atan2"
    BATCH_NORM_GRAD = "batch-norm-grad"
    BATCH_NORM_INFERENCE = "batch-norm-inference"
    BATCH_NORM_TRAINING = "batch-norm-training"
    BITCAST = "bitcast"
    BITCAST_CONVERT = "bitcast-convert"
    BROADCAST = "broadcast"
    CALL = "call"
    CBRT = "cbrt"
    CEIL = "ceil"
    CHOLESKY = "cholesky"
    CLAMP = "clamp"
    CLZ = "count-leading-zeros"
    COLLECTIVE_BROADCAST = "collective-broadcast"
    COLLECTIVE_PERMUTE = "collective-permute"
    COLLECTIVE_PERMUTE_DONE = "collective-permute-done"
    COLLECTIVE_PERMUTE_START = "collective-permute-start"
    COMPARE = "compare"
    COMPLEX = "complex"
    CONCATENATE = "concatenate"
    CONDITIONAL = "conditional"
    CONSTANT = "constant"
    CONVERT = "convert"
    CONVOLUTION = "convolution"
    COPY = "copy"
    COPY_DONE = "copy-done"
    COPY_START = "copy-start"
    COS = "cosine"
    CUSTOM_CALL = "custom-call"
    DIVIDE = "divide"
    DOMAIN = "domain"
    DOT = "dot"
    DYNAMIC_RESHAPE = "dynamic-reshape"
    DYNAMIC_SLICE = "dynamic-slice"
    DYNAMIC_UPDATE_SLICE = "dynamic-update-slice"
    ERF = "erf"
    EXP = "exponential"
    EXPM1 = "exponential-minus-one"
    FFT = "fft"
    FLOOR = "floor"
    FUSION = "fusion"
    GATHER = "gather"
    GET_DIMENSION_SIZE = "get-dimension-size"
    GET_TUPLE_ELEMENT = "get-tuple-element"
    IMAG = "imag"
    INFEED = "infeed"
    IOTA = "iota"
    IS_FINITE = "is-finite"
    LOG = "log"
    LOG1P = "log-plus-one"
    LOGISTIC = "logistic"
    MAP = "map"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    MULTIPLY = "multiply"
    NEGATE = "negate"
    NOT = "not"
    OPTIMIZATION_BARRIER = "opt-barrier"
    OR = "or"
    OUTFEED = "outfeed"
    PAD = "pad"
    PARAMETER = "parameter"
    PARTITION_ID = "partition-id"
    POPCNT = "popcnt"
    POWER = "power"
    RAGGED_ALL_TO_ALL = "ragged-all-to-all"
    RAGGED_DOT = "ragged-dot"
    REAL = "real"
    RECV = "recv"
    RECV_DONE = "recv-done"
    REDUCE = "reduce"
    REDUCE_PRECISION = "reduce-precision"
    REDUCE_SCATTER = "reduce-scatter"
    REDUCE_WINDOW = "reduce-window"
    REMAINDER = "remainder"
    REPLICA_ID = "replica-id"
    RESHAPE = "reshape"
    REVERSE = "reverse"
    RNG = "rng"
    RNG_BIT_GENERATOR = "rng-bit-generator"
    RNG_GET_AND_UPDATE_STATE = "rng-get-and-update-state"
    ROUND_NEAREST_AFZ = "round-nearest-afz"
    ROUND_NEAREST_EVEN = "round-nearest-even"
    RSQRT = "rsqrt"
    SCATTER = "scatter"
    SELECT = "select"
    SELECT_AND_SCATTER = "select-and-scatter"
    SEND = "send"
    SEND_DONE = "send-done"
    SET_DIMENSION_SIZE = "set-dimension-size"
    SHIFT_LEFT = "shift-left"
    SHIFT_RIGHT_ARITHMETIC = "shift-right-arithmetic"
    SHIFT_RIGHT_LOGICAL = "shift-right-logical"
    SIGN = "sign"
    SIN = "sine"
    SLICE = "slice"
    SORT = "sort"
    SQRT = "sqrt"
    STOCHASTIC_CONVERT = "stochastic-convert"
    SUBTRACT = "subtract"
    TAN = "tan"
    TANH = "tanh"
    TOPK = "topk"
    TRANSPOSE = "transpose"
    TRIANGULAR_SOLVE = "triangular-solve"
    TUPLE = "tuple"
    WHILE = "while"
    XOR = "xor"
    UNKNOWN = "<unknown>"


OPCODE_BY_TEXT: dict[str, Opcode] = {op.value: op for op in Opcode if op is not Opcode.UNKNOWN}

UNARY_ELEMENTWISE = frozenset(
    {
        Opcode.ABS,
        Opcode.CBRT,
        Opcode.CEIL,
        Opcode.CLZ,
        Opcode.CONVERT,
        Opcode.BITCAST_CONVERT,
        Opcode.COPY,
        Opcode.COS,
        Opcode.ERF,
        Opcode.EXP,
        Opcode.EXPM1,
        Opcode.FLOOR,
        Opcode.IMAG,
        Opcode.IS_FINITE,
        Opcode.LOG,
        Opcode.LOG1P,
        Opcode.LOGISTIC,
        Opcode.NEGATE,
        Opcode.NOT,
        Opcode.POPCNT,
        Opcode.REAL,
        Opcode.REDUCE_PRECISION,
        Opcode.ROUND_NEAREST_AFZ,
        Opcode.ROUND_NEAREST_EVEN,
        Opcode.RSQRT,
        Opcode.SIGN,
        Opcode.SIN,
        Opcode.SQRT,
        Opcode.TAN,
        Opcode.TANH,
    }
)

BINARY_ELEMENTWISE = frozenset(
    {
        Opcode.ADD,
        Opcode.AND,
        Opcode.ATAN2,
        Opcode.COMPARE,
        Opcode.COMPLEX,
        Opcode.DIVIDE,
        Opcode.MAXIMUM,
        Opcode.MINIMUM,
        Opcode.MULTIPLY,
        Opcode.OR,
        Opcode.POWER,
        Opcode.REMAINDER,
        Opcode.SHIFT_LEFT,
        Opcode.SHIFT_RIGHT_ARITHMETIC,
        Opcode.SHIFT_RIGHT_LOGICAL,
        Opcode.STOCHASTIC_CONVERT,
        Opcode.SUBTRACT,
        Opcode.XOR,
    }
)

TERNARY_ELEMENTWISE = frozenset({Opcode.SELECT, Opcode.CLAMP})

ELEMENTWISE = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE

COLLECTIVES = frozenset(
    {
        Opcode.ALL_GATHER,
        Opcode.ALL_GATHER_START,
        Opcode.ALL_REDUCE,
        Opcode.ALL_REDUCE_START,
        Opcode.ALL_TO_ALL,
        Opcode.COLLECTIVE_BROADCAST,
        Opcode.COLLECTIVE_PERMUTE,
        Opcode.COLLECTIVE_PERMUTE_START,
        Opcode.RAGGED_ALL_TO_ALL,
        Opcode.REDUCE_SCATTER,
    }
)

# Fixed operand counts; opcodes not listed take a variable number (checked elsewhere).
OPERAND_COUNT: dict[Opcode, int] = {
    **{op: 1 for op in UNARY_ELEMENTWISE},
    **{op: 2 for op in BINARY_ELEMENTWISE},
    **{op: 3 for op in TERNARY_ELEMENTWISE},
    Opcode.PARAMETER: 0,
    Opcode.CONSTANT: 0,
    Opcode.IOTA: 0,
    Opcode.PARTITION_ID: 0,
    Opcode.REPLICA_ID: 0,
    Opcode.BROADCAST: 1,
    Opcode.RESHAPE: 1,
    Opcode.TRANSPOSE: 1,
    Opcode.SLICE: 1,
    Opcode.REVERSE: 1,
    Opcode.BITCAST: 1,
    Opcode.GET_TUPLE_ELEMENT: 1,
    Opcode.DOT: 2,
    Opcode.CONVOLUTION: 2,
    Opcode.PAD: 2,
    Opcode.GATHER: 2,
    Opcode.WHILE: 1,
}
