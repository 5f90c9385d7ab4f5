"""The README's and docs/' fenced blocks and how each is tested as pasted
(``tests/test_docs_commands.py``): :mod:`.blocks` reads them, :mod:`.jobs`
runs things and holds the handlers that run or check a block as it is,
:mod:`.serving` serves and asks, :mod:`.parsing` parses flags, special_kwargs,
script options and verl overrides."""
