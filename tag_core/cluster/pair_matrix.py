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
_BLOCK_BYTES = 1 << 18  # text read at a time: its arrays stay small
_BLOCK_CELLS = 1 << 20  # matrix cells checked at a time
_SPACE = b" \t\n\r"  # JSON's whitespace
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

    def _upper_blocks(self):
        """(first row, block of rows i0..i1-1 right of the diagonal's first column, the mask of its
        cells above the diagonal): about a million cells at a time, so temporaries stay small."""
        n = self.n
        rows = max(1, _BLOCK_CELLS // n)
        for i0 in range(0, n - 1, rows):
            i1 = min(n - 1, i0 + rows)
            block = self.values[i0:i1, i0 + 1:]  # column c is machine i0 + 1 + c
            above = np.arange(block.shape[1])[None, :] >= np.arange(i1 - i0)[:, None]
            yield i0, block, above

    def first_bad_pair(self, low: float, high: float) -> tuple[int, int] | None:
        """The first pair i < j, row-major, whose upper figure is not a number in [low, high] or whose
        lower figure differs from it: the order a pair-by-pair check meets them."""
        for i0, block, above in self._upper_blocks():
            i1 = i0 + block.shape[0]
            lower = self.values[i0 + 1:, i0:i1].T  # [j][i] beside [i][j]
            bad = ~((block >= low) & (block <= high) & (block == lower))  # NaN fails every comparison
            if self.numeric is not None:
                bad |= ~(self.numeric[i0:i1, i0 + 1:] & self.numeric[i0 + 1:, i0:i1].T)
            bad &= above
            if bad.any():
                row, column = divmod(int(np.argmax(bad)), bad.shape[1])
                return i0 + row, i0 + 1 + column
        return None

    def most_common(self) -> tuple[float, np.ndarray, np.ndarray]:
        """(the most common figure above the diagonal, the smallest on ties; rows and columns of the
        pairs i < j that differ from it, row-major)."""
        if self.n < 2:
            return 1.0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        figures, counts = [], []
        for _, block, above in self._upper_blocks():
            f, c = np.unique(block[above], return_counts=True)
            figures.append(f)
            counts.append(c)
        merged, where = np.unique(np.concatenate(figures), return_inverse=True)
        totals = np.bincount(where, weights=np.concatenate(counts))
        common = float(merged[int(np.argmax(totals))])  # argmax: the first (smallest) of the most common
        rows, columns = [], []
        for i0, block, above in self._upper_blocks():
            r, c = np.nonzero(above & (block != common))
            rows.append(r + i0)
            columns.append(c + i0 + 1)
        return common, np.concatenate(rows), np.concatenate(columns)


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return float("inf")


def split_document(data: bytes) -> tuple[bytes, str, tuple[int, int]] | None:
    """(the document with its matrix replaced by a placeholder string, the placeholder, where the
    matrix's text is in `data`) when the file has an `"inter_gbps": [` whose value ends at the next
    "]]"; else None."""
    found = _KEY.search(data)
    if found is None:
        return None
    start = found.end()
    close = _CLOSE.search(data, start)
    if close is None:
        return None
    placeholder = f"tag-pair-matrix-{secrets.token_hex(8)}"  # fresh: it cannot be in the file
    rest = data[:start] + json.dumps(placeholder).encode() + data[close.end():]
    return rest, placeholder, (start, close.end())


def read_matrix(data: bytes, span: tuple[int, int], n: int) -> PairMatrix | None:
    """The matrix in data[span] (a JSON array) when it is n rows of n plain JSON numbers (no exponent,
    at most 15 characters, no space right after a number); None when it is anything else.

    Rows are found with bytes.find (memchr), then read a block of rows at a time: every temporary
    array is a few MB, so no pass touches fresh memory (page faults cost more than the arithmetic)."""
    start, end = span
    if n < 1 or data[start:start + 1] != b"[" or data[end - 1:end] != b"]":
        return None
    rows: list[tuple[int, int]] = []  # each row's "[" and one past its "]"
    at = start + 1
    for i in range(n):
        opening = data.find(b"[", at, end)
        if opening < 0 or data[at:opening].strip(_SPACE) != (b"," if i else b""):
            return None  # between rows: a comma and JSON whitespace, nothing else
        closing = data.find(b"]", opening, end)
        if closing < 0:
            return None
        rows.append((opening, closing + 1))
        at = closing + 1
    if data[at:end - 1].strip(_SPACE):
        return None  # more rows, or something else, before the outer "]"
    values = np.empty((n, n), dtype=np.float64)
    pattern = b"[" + b"," * (n - 1) + b"]"
    work = _Work()
    first = 0
    while first < n:
        last = first + 1  # rows first..last-1 make one block of about _BLOCK_BYTES
        while last < n and rows[last][1] - rows[first][0] < _BLOCK_BYTES:
            last += 1
        chars = np.frombuffer(data, dtype=np.uint8, count=rows[last - 1][1] - rows[first][0], offset=rows[first][0])
        if not _read_rows(chars, n, last - first, pattern, values[first:last].reshape(-1), work):
            return None
        first = last

    def original(i: int, j: int) -> Any:
        return json.loads(data[rows[i][0]:rows[i][1]])[j]

    return PairMatrix(values, None, original)


class _Work:
    """Arrays reused from block to block: fresh memory for each block costs more in page faults (glibc
    hands freed blocks back to the system) than the arithmetic done in it."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self.patterns: dict[int, np.ndarray] = {}

    def __call__(self, name: str, size: int, dtype: type = bool) -> np.ndarray:
        have = self._arrays.get(name)
        if have is None or len(have) < size:
            have = self._arrays[name] = np.empty(size + size // 4, dtype=dtype)
        return have[:size]


def _read_rows(chars: np.ndarray, n: int, count: int, pattern: bytes, out: np.ndarray, work: _Work) -> bool:
    """`count` rows of n numbers, "[...],[...]" with JSON whitespace, into `out`; False if not that."""
    size = len(chars)
    space, flags, shifted = work("space", size), work("flags", size), work("shifted", size, np.uint8)
    np.less_equal(chars, ord(" "), out=space)
    if space.any():
        controls = np.flatnonzero(np.less(chars, ord(" "), out=flags))  # newlines
        if not np.isin(chars[controls], _CONTROL_WHITESPACE).all():
            return False  # a control character other than JSON's tab, newline and return
        np.less(np.subtract(chars, _ORD["-"], out=shifted), 13, out=flags)  # "-./0123456789"
        if np.logical_and(flags[:-1], space[1:], out=flags[:-1]).any():
            return False  # a space right after a number ("1 2", "1 ,"): json decides
        kept = size - int(np.count_nonzero(space))
        padded = work("chars", kept + _MAX_TOKEN, np.uint8)
        np.compress(np.logical_not(space, out=flags), chars, out=padded[:kept])
    else:
        kept = size
        padded = work("chars", kept + _MAX_TOKEN, np.uint8)
        padded[:kept] = chars
    padded[kept:] = 0  # the number reader reads past the last number
    chars = padded[:kept]
    structural = np.flatnonzero(np.greater(np.subtract(chars, _ORD["-"], out=shifted[:kept]), 12, out=flags[:kept]))
    # Per row its "[", n - 1 commas and "]", and a "," between rows. Any other character (a letter, a
    # quote, "+") lands here too and breaks the pattern; a "/" among the digits fails the grammar.
    expected = work.patterns.get(count)
    if expected is None:
        expected = work.patterns[count] = np.frombuffer(b",".join([pattern] * count), dtype=np.uint8)
    if len(structural) != len(expected) or not np.array_equal(chars[structural], expected):
        return False
    # One row per matrix row: "[", the commas, "]", then the "," after it (the end, after the last):
    # numbers lie between columns k and k + 1 for k < n, nothing between "]" and ",", "," and "[".
    grid = np.append(structural, kept).reshape(count, n + 2)
    starts = work("starts", count * n, np.int64).reshape(count, n)
    np.add(grid[:, :n], 1, out=starts)
    lengths = work("lengths", count * n, np.int64).reshape(count, n)
    np.subtract(grid[:, 1:n + 1], starts, out=lengths)
    if (grid[0, 0] != 0 or (grid[1:, 0] != grid[:-1, n + 1] + 1).any() or (grid[:, n + 1] != grid[:, n] + 1).any()
            or int(lengths.min()) < 1 or int(lengths.max()) > _MAX_TOKEN):
        return False  # "]1", "1[", an empty item, or a number too long to convert exactly here
    short = work("short", count * n, np.int8)
    np.copyto(short, lengths.reshape(-1), casting="unsafe")
    return _numbers(padded, starts.reshape(-1), short, out, work)


def _numbers(padded: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray, work: _Work) -> bool:
    """Each token's value into `out` when every token is -?(0|[1-9][0-9]*)(.[0-9]+)?, else False.

    Column by column: the k-th character of every token at once. Correctly rounded: the digits as
    an exact integer mantissa (< 10**15) divided by an exact power of ten (<= 10**14), one
    rounding, as float() does."""
    count = len(starts)
    mantissa, scratch = work("mantissa", count, np.float64), work("scratch", count, np.float64)
    fraction, index = work("fraction", count, np.int8), work("index", count, np.int64)
    char, digit = work("char", count, np.uint8), work("digit", count, np.uint8)
    is_digit, point, active, test = work("is_digit", count), work("point", count), work("active", count), work("test", count)
    seen_point, last_digit = work("seen_point", count), work("last_digit", count)  # last: the latest was a digit
    negative, leading_zero = work("negative", count), work("leading_zero", count)  # latest: an integer's first 0
    for array in (mantissa, fraction, seen_point, last_digit, leading_zero):
        array[:] = 0
    active[:] = True
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
            if not np.logical_or(is_digit, negative, out=test).all():
                return False  # a number opens with a digit or "-"
        else:
            np.logical_or(is_digit, point, out=test)
            if not np.logical_or(test, ~active if k >= shortest else test, out=test).all():
                return False  # "-" only first, nothing but digits and one point after it
            np.logical_or(seen_point, np.logical_not(last_digit, out=test), out=test)
            if np.logical_and(point, test, out=test).any():
                return False  # a point after a digit, once: not "-.5", "1.2.3"
            if np.logical_and(leading_zero, is_digit, out=test).any():
                return False  # "01", "-01"
        if k <= 1:  # the integer's first digit is character 0, or 1 after a "-"
            np.equal(char, _ORD["0"], out=leading_zero)
            leading_zero &= negative if k == 1 else np.logical_not(negative, out=test)
        elif k == 2:
            leading_zero[:] = False
        seen_point |= point
        np.copyto(last_digit, is_digit, where=active)
        np.multiply(mantissa, 10, out=scratch)
        np.add(scratch, digit, out=scratch)
        np.copyto(mantissa, scratch, where=is_digit)
        fraction += np.logical_and(is_digit, seen_point, out=test)
    if not last_digit.all():
        return False  # "-", "1." end without a digit
    np.divide(mantissa, _POWERS_OF_TEN[fraction], out=out)
    np.negative(out, out=out, where=negative)
    return True
