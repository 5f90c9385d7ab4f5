"""The test suite (a regular package, so that a ``tests`` package another
distribution installs into site-packages, as verl does, cannot shadow it)."""
