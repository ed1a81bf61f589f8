"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class ForgeError(Exception):
    """A user-facing failure: bad input, a broken file, a failed check.

    The message must be a single line that names what is wrong and, where possible, what to do.
    """
