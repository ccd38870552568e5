"""One builder per language: compile, pack, name the entrypoint."""
