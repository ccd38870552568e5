"""The mesh node benchmark (issue 5): `bash bench/run.sh`. Not part of the test run."""
