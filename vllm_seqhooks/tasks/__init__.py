"""The embedded trained models' tasks (digit sorting with fork/join, in the
promise protocol and in ThreadWeaver's format): problems, training and
evaluation texts, checkers. The models themselves are in ``../data/``."""
