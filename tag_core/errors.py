"""Errors that come from what the user gave us, not from a bug in TAG."""

# Characters that would break the message's one line, or steer the terminal, from a user's text (a JSON key,
# a machine name): control characters (tab aside), DEL, C1 controls and the Unicode line separators.
_ESCAPES = {code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if code != 0x09}
_ESCAPES.update({0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def one_line(text: str) -> str:
    """`text` with line breaks and control characters escaped (idempotent: an escape holds none)."""
    return str(text).translate(_ESCAPES)


class TagInputError(ValueError):
    """Bad input: a one-line message naming the field or argument and what is wrong.

    The CLI turns it into exit code 2. `where` and `problem` often quote the user's text, so line breaks
    and control characters in them are escaped: the message stays one line.
    """

    def __init__(self, where: str, problem: str):
        self.where = one_line(where)
        self.problem = one_line(problem)
        super().__init__(f"{self.where}: {self.problem}")
