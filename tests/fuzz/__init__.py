"""The fuzzing suite (docs/reliability.md, "Fuzzing").

* ``record_corpus.py`` records request frames of real clients into ``corpus/``;
* ``mutate.py`` / ``layout.py`` turn them into hostile frames;
* ``engine.py`` sends them to a broker process and watches it (``python -m tests.fuzz.engine``);
* ``test_*.py`` are the pytest entry points (quick run, regressions, state machine, readers).
"""
