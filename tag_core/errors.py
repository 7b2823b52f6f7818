"""Errors that come from what the user gave us, not from a bug in TAG."""


class TagInputError(ValueError):
    """Bad input: a one-line message naming the field or argument and what is wrong.

    The CLI turns it into exit code 2.
    """

    def __init__(self, where: str, problem: str):
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")
