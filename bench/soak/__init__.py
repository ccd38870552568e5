"""Load and soak run (issue 4 item 4): `python -m bench.soak`. Not a pytest; see README.md."""
