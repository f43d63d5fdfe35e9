"""`python -m baton`: the `baton` command, for when the console script is not on PATH."""

from commands.cli import main

main()
