"""A per-pair `inter_gbps` matrix, read and checked in time linear in its size.

A 4096-machine matrix is 16.7 million numbers (about 100 MB of JSON). Python's json module makes a
float object of each (seconds), so `split_document` cuts a plain numeric matrix out of the file's
bytes and `read_matrix` checks its JSON grammar and converts it with numpy, column by column of
digits. Anything the fast reader does not fully understand (an exponent, a number of over 15
characters, a ragged row, a stray character) returns None, and the caller parses the whole file
with json instead: the slow path is the reference, the fast one only ever agrees with it.
`PairMatrix.first_bad_pair` and `most_common` check either kind in a few vector operations.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

_KEY = re.compile(rb'"inter_gbps"\s*:\s*(?=\[)')
_CLOSE = re.compile(rb"\][ \t\n\r]*\]")  # a matrix's last row ends in "]]": rows hold no brackets
_MAX_TOKEN = 15  # at most 15 digits: the integer mantissa is exact in a float64 (< 2**53)
_POWERS_OF_TEN = np.array([float(10**k) for k in range(_MAX_TOKEN + 1)])  # exact up to 10**22
_ORD = {c: np.uint8(ord(c)) for c in "0-.,[]"}
_CHUNK = 1 << 20  # numbers converted at a time: a chunk's columns stay in the CPU's caches
_CONTROL_WHITESPACE = np.array([ord("\t"), ord("\n"), ord("\r")], dtype=np.uint8)


@dataclass
class PairMatrix:
    """n x n figures as float64, `numeric[i, j]` False where the JSON value was not a number (NaN
    stands there), and `original(i, j)`: the JSON value as json.loads gives it, for error messages."""

    values: np.ndarray
    numeric: np.ndarray | None  # None: every entry is a number
    original: Callable[[int, int], Any]

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    @classmethod
    def from_rows(cls, rows: list[list[Any]]) -> PairMatrix:
        """Rows already checked to be n lists of n items."""
        n = len(rows)
        values = np.empty((n, n), dtype=np.float64)
        numeric = None
        for i, row in enumerate(rows):
            if set(map(type, row)) <= {int, float}:  # bool is its own type: True is no figure
                try:
                    values[i] = row
                    continue
                except OverflowError:  # an integer past float64's range
                    pass
            if numeric is None:
                numeric = np.ones((n, n), dtype=bool)
            for j, value in enumerate(row):
                ok = type(value) in (int, float)
                numeric[i, j] = ok
                values[i, j] = _as_float(value) if ok else np.nan
        return cls(values, numeric, lambda i, j: rows[i][j])

    def first_bad_pair(self, low: float, high: float) -> tuple[int, int] | None:
        """The first pair i < j, row-major, whose upper figure is not a number in [low, high] or whose
        lower figure differs from it: the order a pair-by-pair check meets them."""
        v = self.values
        bad = ~((v >= low) & (v <= high) & (v == v.T))  # NaN fails every comparison
        if self.numeric is not None:
            bad |= ~(self.numeric & self.numeric.T)
        bad &= np.triu(np.ones(v.shape, dtype=bool), 1)
        flat = int(np.argmax(bad))
        return divmod(flat, self.n) if bad.flat[flat] else None

    def most_common(self) -> tuple[float, np.ndarray, np.ndarray]:
        """(the most common figure above the diagonal, the smallest on ties; rows and columns of the
        pairs i < j that differ from it, row-major)."""
        upper = np.triu(np.ones(self.values.shape, dtype=bool), 1)
        figures, counts = np.unique(self.values[upper], return_counts=True)
        common = float(figures[int(np.argmax(counts))])  # argmax: the first (smallest) of the most common
        rows, cols = np.nonzero(upper & (self.values != common))
        return common, rows, cols


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return float("inf")


def split_document(data: bytes) -> tuple[bytes, str, bytes] | None:
    """(the document with its matrix replaced by a placeholder string, the placeholder, the matrix's
    text) when the file has an `"inter_gbps": [` whose value ends at the next "]]"; else None."""
    found = _KEY.search(data)
    if found is None:
        return None
    start = found.end()
    close = _CLOSE.search(data, start)
    if close is None:
        return None
    placeholder = f"tag-pair-matrix-{secrets.token_hex(8)}"  # fresh: it cannot be in the file
    rest = data[:start] + json.dumps(placeholder).encode() + data[close.end():]
    return rest, placeholder, data[start:close.end()]


def read_matrix(text: bytes, n: int) -> PairMatrix | None:
    """The matrix in `text` (a JSON array's bytes) when it is n rows of n plain JSON numbers (no
    exponent, at most 15 characters, no space right after a number); None when it is anything else.

    Whole-text passes are numpy comparisons (tens of ms per 100 MB); Python's bytes.translate and
    lookup tables indexed by bytes are several times slower."""
    if n < 1:
        return None
    chars = np.frombuffer(text, dtype=np.uint8)
    space = chars <= ord(" ")
    if space.any():
        controls = np.flatnonzero(chars < ord(" "))  # newlines, usually a few thousand
        if not np.isin(chars[controls], _CONTROL_WHITESPACE).all():
            return None  # a control character other than JSON's tab, newline and return
        number = np.subtract(chars, _ORD["-"]) < 13  # "-./0123456789"
        if (number[:-1] & space[1:]).any():
            return None  # a space right after a number ("1 2", "1 ,"): json decides
        del number
        chars = chars[~space]
    del space
    shifted = np.subtract(chars, _ORD["-"])
    structural = np.flatnonzero(np.greater(shifted, 12, out=shifted.view(bool)))  # all but "-./0123456789"
    del shifted
    # (n+1)**2 commas and brackets: the outer "[", then per row its "[", n - 1 commas, its "]" and the
    # "," after it (the outer "]" after the last row). Any other character (a letter, a quote, "+")
    # lands here too and breaks the pattern; a "/" among the digits fails the number grammar.
    row = b"[" + b"," * (n - 1) + b"]"
    expected = np.frombuffer(b"[" + b",".join([row] * n) + b"]", dtype=np.uint8)
    if len(structural) != len(expected) or not np.array_equal(chars[structural], expected):
        return None
    # Each row of this grid holds a matrix row's numbers between its columns k and k + 1, k < n,
    # and nothing between its "]" and the next "[".
    grid = structural[1:].reshape(n, n + 2)
    starts = grid[:, :n] + 1
    lengths = grid[:, 1:n + 1] - starts
    glued = (grid[0, 0] != structural[0] + 1 or (grid[1:, 0] != grid[:-1, n + 1] + 1).any()
             or (grid[:, n + 1] != grid[:, n] + 1).any())
    if glued or int(lengths.min()) < 1 or int(lengths.max()) > _MAX_TOKEN:
        return None  # "]1", "1[", an empty item, or a number too long to convert exactly here
    del structural, grid
    starts = starts.reshape(-1)
    lengths = lengths.astype(np.int8).reshape(-1)
    values = np.empty(n * n, dtype=np.float64)
    padded = np.concatenate([chars, np.zeros(_MAX_TOKEN, dtype=np.uint8)])  # reads past the last number
    for first in range(0, n * n, _CHUNK):  # a chunk's columns stay in the CPU's caches
        part = slice(first, first + _CHUNK)
        if not _numbers(padded, starts[part], lengths[part], values[part]):
            return None

    def original(i: int, j: int) -> Any:
        at = int(starts[i * n + j])
        return json.loads(chars[at:at + int(lengths[i * n + j])].tobytes())

    return PairMatrix(values.reshape(n, n), None, original)


def _numbers(padded: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> bool:
    """Each token's value into `out` when every token is -?(0|[1-9][0-9]*)(.[0-9]+)?, else False.

    Column by column: the k-th character of every token at once. Correctly rounded: the digits as
    an exact integer mantissa (< 10**15) divided by an exact power of ten (<= 10**14), one
    rounding, as float() does."""
    count = len(starts)
    mantissa = np.zeros(count)
    scratch = np.empty(count)
    fraction = np.zeros(count, dtype=np.int8)
    index = np.empty_like(starts)
    char = np.empty(count, dtype=np.uint8)
    digit = np.empty(count, dtype=np.uint8)
    is_digit = np.empty(count, dtype=bool)
    point = np.empty(count, dtype=bool)
    active = np.ones(count, dtype=bool)
    seen_point = np.zeros(count, dtype=bool)
    last_digit = np.zeros(count, dtype=bool)  # whether the latest character was a digit
    negative = np.zeros(count, dtype=bool)
    leading_zero = np.zeros(count, dtype=bool)  # the latest character was an integer's first digit, 0
    shortest, longest = int(lengths.min()), int(lengths.max())
    for k in range(longest):
        np.add(starts, k, out=index)
        np.take(padded, index, out=char)
        np.subtract(char, _ORD["0"], out=digit)
        np.less(digit, 10, out=is_digit)
        np.equal(char, _ORD["."], out=point)
        if k >= shortest:  # past a short token's end lie the next token's characters
            np.greater(lengths, k, out=active)
            is_digit &= active
            point &= active
        if k == 0:
            np.equal(char, _ORD["-"], out=negative)
            if not (is_digit | negative).all():
                return False  # a number opens with a digit or "-"
        else:
            if not (is_digit | point | ~active).all():
                return False  # "-" only first, nothing but digits and one point after it
            if (point & (seen_point | ~last_digit)).any():
                return False  # a point after a digit, once: not "-.5", "1.2.3"
            if (leading_zero & is_digit).any():
                return False  # "01", "-01"
        if k <= 1:
            leading_zero = (char == _ORD["0"]) & (negative if k == 1 else ~negative)
        else:
            leading_zero[:] = False
        seen_point |= point
        np.copyto(last_digit, is_digit, where=active)
        np.multiply(mantissa, 10, out=scratch)
        np.add(scratch, digit, out=scratch)
        np.copyto(mantissa, scratch, where=is_digit)
        fraction += is_digit & seen_point
    if not last_digit.all():
        return False  # "-", "1." end without a digit
    np.divide(mantissa, _POWERS_OF_TEN[fraction], out=out)
    np.negative(out, out=out, where=negative)
    return True
